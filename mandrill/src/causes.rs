//! An error followed by its causes on one line (`error: cause: cause's
//! cause`), for a log line or a message that must stand alone. Errors keep
//! their causes as sources (not in their own message), so a line that
//! shows only an error's `Display` leaves the causes out.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// Shows an error and then each of its sources. A source whose text the
/// message before it already ends with is not repeated: sqlx's errors write
/// their source into their own message as well as returning it (ours never
/// do: a message names what failed, its source says why).
pub(crate) struct WithCauses<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for WithCauses<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut previous = self.0.to_string();
        f.write_str(&previous)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !previous.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            previous = text;
            cause = error.source();
        }
        Ok(())
    }
}

/// Why an operation failed: what was being done, and the error that caused
/// it, kept whole as a source (not flattened into the text): a broker
/// operation's (`BrokerError`), a restart's (`RestartError`). Shared
/// (`Arc`), so
/// that one failed transaction can fail every operation of its batch with
/// the same cause.
#[derive(Debug, Clone)]
pub struct Cause {
    /// What was being done; `None` when the source says it all.
    what: Option<String>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    /// `what` failed because of `source`.
    pub fn new(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            what: Some(what.into()),
            source: Some(Arc::from(source.into())),
        }
    }

    /// The error itself is the whole story: shown as it is, with its own
    /// sources after it.
    pub fn from_error(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::shared(Arc::new(source))
    }

    /// As [`from_error`](Self::from_error), for an error shared by several
    /// failures.
    pub fn shared(source: Arc<dyn std::error::Error + Send + Sync>) -> Self {
        Self {
            what: None,
            source: Some(source),
        }
    }

    /// The error that caused this one, as [`std::error::Error::source`]
    /// reports it.
    pub(crate) fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = self.source.as_deref()?;
        match self.what {
            Some(_) => Some(source),
            // Shown in place of `what`: its source comes next.
            None => source.source(),
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.what, &self.source) {
            (Some(what), _) => f.write_str(what),
            (None, Some(source)) => fmt::Display::fmt(source, f),
            (None, None) => f.write_str("unknown cause"),
        }
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Cause::source(self)
    }
}

impl From<String> for Cause {
    fn from(what: String) -> Self {
        Self {
            what: Some(what),
            source: None,
        }
    }
}

impl From<&str> for Cause {
    fn from(what: &str) -> Self {
        what.to_owned().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Layer(&'static str, #[source] Option<Box<Layer>>);

    fn chain(layers: &[&'static str]) -> Layer {
        layers
            .iter()
            .rev()
            .fold(None, |source, text| Some(Layer(text, source.map(Box::new))))
            .expect("at least one layer")
    }

    #[test]
    fn each_cause_follows_once_and_one_already_in_its_parents_text_is_not_repeated() {
        let error = chain(&["cannot record", "database error", "refused"]);
        assert_eq!(
            WithCauses(&error).to_string(),
            "cannot record: database error: refused"
        );
        let error = chain(&["database error", "encoding failed: nul byte", "nul byte"]);
        assert_eq!(
            WithCauses(&error).to_string(),
            "database error: encoding failed: nul byte"
        );
    }
}
