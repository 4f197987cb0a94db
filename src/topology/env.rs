//! Where discovery reads variables from: the process environment, or a map a test injects
//! (tests run in parallel threads of one process and must not touch the real environment).

use std::collections::HashMap;

/// A source of environment variables.
pub trait Env {
    /// The value of `key`, if set (an empty value counts as set).
    fn var(&self, key: &str) -> Option<String>;
}

/// The process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

impl<const N: usize> Env for [(&str, &str); N] {
    fn var(&self, key: &str) -> Option<String> {
        self.iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    }
}

impl Env for Vec<(String, String)> {
    fn var(&self, key: &str) -> Option<String> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }
}

/// A non-empty, trimmed value of `key`.
pub fn nonempty(env: &dyn Env, key: &str) -> Option<String> {
    env.var(key)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}
