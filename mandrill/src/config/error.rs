//! [`ConfigError`]: a configuration that cannot be used, naming the key or
//! file at fault.

use std::path::PathBuf;

/// A configuration that cannot be used, naming the key or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("config file {path} is not valid toml: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// An environment variable does not name a setting.
    #[error("environment variable {name}: {why}")]
    Environment {
        /// The variable.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// A `--set` flag is not `KEY=VALUE` (only the part before any `=` is
    /// kept: the value may be a secret).
    #[error("--set {0:?}: expected SECTION.KEY=VALUE")]
    Override(String),
    /// A key is unknown or its value has the wrong type.
    #[error("invalid configuration at `{key}`: {message}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_owned(),
            message: message.into(),
        }
    }
}
