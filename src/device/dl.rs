//! One loader for every library PCCL opens at run time (HIP, hipRTC, RCCL, NCCL): the path
//! in an environment variable first, then the usual names; every failure is an error that
//! lists what was tried and names the variable to set. Nothing here panics for want of a
//! vendor library.

use libloading::Library;
use std::ffi::{OsStr, OsString};

/// Where a library is looked for.
#[derive(Clone, Copy, Debug)]
pub struct LibrarySpec {
    /// What the library is, for messages ("the HIP runtime", "RCCL").
    pub what: &'static str,
    /// The environment variable with an explicit path, tried first.
    pub env: &'static str,
    /// The names tried after it, in order.
    pub names: &'static [&'static str],
    /// How to install it, appended to the error.
    pub hint: &'static str,
}

/// The paths to try for a library: the environment variable's value first (when set and not
/// empty), then the usual names.
pub(crate) fn library_candidates(env_value: Option<&OsStr>, names: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = Vec::new();
    if let Some(p) = env_value.filter(|p| !p.is_empty()) {
        v.push(p.to_os_string());
    }
    v.extend(names.iter().map(OsString::from));
    v
}

/// Opens the first loadable candidate of `spec`; returns the library and the path it was
/// opened under, or a message listing every attempt and the variable to set.
pub(crate) fn open_library(spec: &LibrarySpec) -> std::result::Result<(Library, String), String> {
    let mut tried = Vec::new();
    for cand in library_candidates(std::env::var_os(spec.env).as_deref(), spec.names) {
        // SAFETY: dlopen runs the library's initialisers; the vendor libraries' initialisers
        // only set up their own state. A file that is not a shared library is refused by the
        // loader with an error, not run.
        match unsafe { Library::new(&cand) } {
            Ok(lib) => return Ok((lib, cand.to_string_lossy().into_owned())),
            Err(e) => tried.push(format!("{}: {e}", cand.to_string_lossy())),
        }
    }
    Err(format!(
        "{} could not be loaded (tried {}): {}, or set {} to the library's path",
        spec.what,
        tried.join("; "),
        spec.hint,
        spec.env
    ))
}

/// Looks up symbol `name` in `lib` (opened from `path` for `spec`) as a `T`.
///
/// # Safety
/// `T` must be the exact function-pointer type of `name` in the library's C headers, and the
/// pointer must not be called after `lib` is unloaded.
pub(crate) unsafe fn symbol<T: Copy>(
    lib: &Library,
    path: &str,
    env: &str,
    name: &str,
) -> std::result::Result<T, String> {
    let cname = format!("{name}\0");
    lib.get::<T>(cname.as_bytes()).map(|s| *s).map_err(|e| {
        format!(
            "{path} has no symbol {name} ({e}): it is not the expected library, or too old a \
             version; set {env} to another one"
        )
    })
}

/// Looks up an optional symbol (`None` when absent).
///
/// # Safety
/// As [`symbol`].
#[cfg_attr(not(feature = "rocm"), allow(dead_code))]
pub(crate) unsafe fn optional_symbol<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    let cname = format!("{name}\0");
    lib.get::<T>(cname.as_bytes()).ok().map(|s| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_comes_first_and_empty_is_ignored() {
        let c = library_candidates(Some(OsStr::new("/x/liba.so")), &["liba.so", "liba.so.1"]);
        assert_eq!(c, vec!["/x/liba.so", "liba.so", "liba.so.1"]);
        assert_eq!(
            library_candidates(Some(OsStr::new("")), &["liba.so"]).len(),
            1
        );
    }

    #[test]
    fn a_missing_library_names_every_attempt_and_the_variable() {
        let spec = LibrarySpec {
            what: "the test library",
            env: "PCCL_TEST_DL_LIBRARY_UNSET",
            names: &["libpccl-does-not-exist.so.7"],
            hint: "nothing to install",
        };
        let e = open_library(&spec).err().unwrap();
        assert!(e.contains("libpccl-does-not-exist.so.7"), "{e}");
        assert!(e.contains("PCCL_TEST_DL_LIBRARY_UNSET"), "{e}");
    }
}
