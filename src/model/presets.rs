//! Named machines for the simulator: the files in `presets/` (with the source of every
//! parameter next to it), built into the library so `pccl-sim --preset NAME` needs no path.

use super::profile::Profile;
use crate::error::{Error, Result};

/// `(name, TOML text)` of every built-in preset.
pub const PRESETS: &[(&str, &str)] = &[
    ("frontier", include_str!("../../presets/frontier.toml")),
    ("perlmutter", include_str!("../../presets/perlmutter.toml")),
];

/// The preset called `name`.
pub fn named(name: &str) -> Result<Profile> {
    let lower = name.to_ascii_lowercase();
    PRESETS
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(_, text)| Profile::from_toml(text))
        .unwrap_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
            Err(Error::invalid(format!(
                "unknown preset '{name}': expected one of {}",
                names.join(", ")
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_and_unknown_names_are_errors() {
        for (n, _) in PRESETS {
            let p = named(n).unwrap();
            assert_eq!(p.name, *n);
            assert_eq!(p.inter.nics, 4);
        }
        let e = named("summit").unwrap_err();
        assert!(e.message().contains("frontier"), "{e}");
    }
}
