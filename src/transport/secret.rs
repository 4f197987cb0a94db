//! The job secret: random bytes that every member of a TCP job knows (they travel inside the
//! unique id) and that every bootstrap connection must present before anything else is read.
//!
//! The bytes come from the operating system's random source, never from the clock, the pid
//! or the host name, and they are compared in constant time so that a stranger learns nothing
//! from how fast a guess is refused.

use crate::error::{Error, Result};

/// Bytes of a job secret (256 bits).
pub const SECRET_BYTES: usize = 32;

/// `N` bytes from the operating system's random source.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| {
        Error::system(format!(
            "cannot read the operating system's random source ({e}): PCCL needs it for the \
             unique id's secret and shared-memory names"
        ))
    })?;
    Ok(b)
}

/// Whether `a` and `b` hold the same bytes, in a time that depends only on their lengths.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the compiler from turning the fold into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// A job secret. Its `Debug` form never shows the bytes.
#[derive(Clone)]
pub(crate) struct Secret([u8; SECRET_BYTES]);

impl Secret {
    /// A fresh secret from the operating system's random source.
    pub(crate) fn random() -> Result<Self> {
        random_bytes().map(Secret)
    }

    /// The secret of these bytes (read from a unique id or an authenticated peer).
    pub(crate) fn from_bytes(b: [u8; SECRET_BYTES]) -> Self {
        Secret(b)
    }

    /// The bytes, to put in a unique id or a handshake.
    pub(crate) fn as_bytes(&self) -> &[u8; SECRET_BYTES] {
        &self.0
    }

    /// Whether `b` is this secret (constant time).
    pub(crate) fn matches(&self, b: &[u8]) -> bool {
        ct_eq(&self.0, b)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}

impl Eq for Secret {}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<hidden>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_random_and_compared_exactly() {
        let (a, b) = (Secret::random().unwrap(), Secret::random().unwrap());
        assert_ne!(a, b);
        assert_eq!(a, a.clone());
        assert!(a.matches(a.as_bytes()));
        assert!(!a.matches(&a.as_bytes()[1..]));
        let mut c = *a.as_bytes();
        c[SECRET_BYTES - 1] ^= 1;
        assert!(!a.matches(&c));
        assert_eq!(format!("{a:?}"), "Secret(<hidden>)");
    }
}
