//! [`ConfigError`]: a configuration that cannot be used, naming the key or
//! file at fault.

use std::path::PathBuf;

/// A configuration that cannot be used, naming the key or file at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// The file could not be read (the reason is the source: see
    /// [`ConfigError::with_causes`]).
    #[error("cannot read config file {path}")]
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
    /// The error followed by its cause (`cannot read config file x: no
    /// such file`), for the line that tells the operator.
    pub(crate) fn with_causes(&self) -> impl std::fmt::Display + '_ {
        crate::causes::WithCauses(self)
    }

    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_owned(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The io error is the source, not also words in the message: a
    /// chain that shows every source (anyhow's `{:#}`, the binary's last
    /// line) names the file once and its cause once.
    #[test]
    fn an_unreadable_file_is_named_once_with_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        let error = crate::config::Sources {
            file: Some(path.clone()),
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(matches!(error, ConfigError::Read { .. }), "{error:?}");
        let cause = std::error::Error::source(&error)
            .expect("the io error is the source")
            .to_string();
        let shown = path.display().to_string();
        assert_eq!(
            error.to_string(),
            format!("cannot read config file {shown}")
        );
        let line = error.with_causes().to_string();
        assert_eq!(line, format!("cannot read config file {shown}: {cause}"));
        let chain = format!("{:#}", anyhow::Error::new(error));
        assert_eq!(chain.matches(&shown).count(), 1, "{chain}");
        assert_eq!(chain.matches(&cause).count(), 1, "{chain}");
    }
}
