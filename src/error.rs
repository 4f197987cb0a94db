//! Errors are values with messages a user can act on.

use std::fmt;

/// What went wrong, as a category the C ABI maps onto `pcclResult_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A caller passed a bad argument (length, count, dtype/op, root, null pointer).
    InvalidArgument,
    /// A call that is valid in isolation but not in this state (destroyed communicator, ...).
    InvalidUsage,
    /// The operating system or MPI library failed.
    System,
    /// A peer sent something that does not fit what this rank expected.
    Remote,
    /// A peer did not answer within the configured timeout (`PCCL_TIMEOUT`).
    Timeout,
    /// A bug inside PCCL.
    Internal,
}

/// An error with a message that says what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// Builds an error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    /// Shorthand for [`ErrorKind::InvalidUsage`].
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidUsage, message)
    }
    /// Shorthand for [`ErrorKind::Remote`].
    pub fn remote(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Remote, message)
    }
    /// Shorthand for [`ErrorKind::Timeout`].
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }
    /// Shorthand for [`ErrorKind::System`].
    pub fn system(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::System, message)
    }
    /// Shorthand for [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

/// Result alias used throughout PCCL.
pub type Result<T> = std::result::Result<T, Error>;
