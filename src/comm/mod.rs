//! The public face: communicators, requests, and the per-communicator progress worker.

pub mod communicator;
pub mod progress;
pub mod request;
