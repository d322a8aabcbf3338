//! [`Secret`]: a setting's value that must never reach a log.

use serde::{Deserialize, Serialize};

/// A value that must never reach a log: its `Debug` is `****`. It is still
/// serialised (configuration diffs compare values, and log only key names).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Secret(pub String);

impl Secret {
    /// Whether a client can send it in an HTTP header, as a bearer token
    /// is sent: printable ASCII, no space at either end (a header's value
    /// loses it). Any other token could never be presented.
    pub(crate) fn fits_a_header(&self) -> bool {
        let token = self.0.as_str();
        !token.is_empty()
            && token.trim() == token
            && token
                .bytes()
                .all(|byte| byte == b' ' || byte.is_ascii_graphic())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("****")
    }
}
