//! Mayhem Mandrill: restarts hosts on request, concurrently, durably.
#![deny(missing_docs)]

pub mod backoff;
pub mod broker;
pub mod domain;
pub mod restarter;
pub mod stats;
pub mod store;
pub mod worker;
