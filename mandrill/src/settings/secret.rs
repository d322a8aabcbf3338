//! [`Secret`]: a setting's value that must never reach a log.

use serde::{Deserialize, Serialize};

/// A value that must never reach a log: its `Debug` is `****`. It is still
/// serialised (configuration diffs compare values, and log only key names).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("****")
    }
}
