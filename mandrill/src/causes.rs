//! An error followed by its causes on one line (`error: cause: cause's
//! cause`), for a log line or a message that must stand alone. Errors keep
//! their causes as sources (not in their own message), so a line that
//! shows only an error's `Display` leaves the causes out.

use std::error::Error;
use std::fmt;

/// Shows an error and then each of its sources. A source whose text the
/// message before it already ends with is not repeated: some errors
/// (sqlx's, for one) write their source into their own message as well as
/// returning it.
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
