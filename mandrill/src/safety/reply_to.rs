//! Which reply destinations a request may name (`broker.reply_to_allowed`):
//! a request's `reply_to` is the publisher's word, so the verdict goes
//! there only if one of the operator's patterns admits it, and never to a
//! destination no pattern names.

use crate::pattern::Pattern;

/// The operator's patterns. Empty (the default): every `reply_to` is
/// refused.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplyDestinations {
    allowed: Vec<Pattern>,
}

impl ReplyDestinations {
    /// Parses the patterns; the error names the key and the index.
    pub(crate) fn new(allowed: &[String]) -> Result<Self, (String, String)> {
        let allowed = allowed
            .iter()
            .enumerate()
            .map(|(index, raw)| {
                Pattern::parse(raw)
                    .map_err(|why| (format!("broker.reply_to_allowed[{index}]"), why))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { allowed })
    }

    /// Whether any pattern is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.allowed.is_empty()
    }

    /// The first pattern that admits `destination`, if any (shown in a
    /// start-up check against the broker's own subjects).
    pub(crate) fn admitting(&self, destination: &str) -> Option<String> {
        self.allowed
            .iter()
            .find(|pattern| pattern.matches(destination))
            .map(ToString::to_string)
    }

    /// `Ok` if a pattern admits `destination`; else the denial's reason.
    pub(crate) fn check(&self, destination: &str) -> Result<(), String> {
        if self.admitting(destination).is_some() {
            return Ok(());
        }
        Err(if self.allowed.is_empty() {
            format!(
                "denied by reply_to: the request asks for its verdict on {destination:?}, and \
                 no reply destination is allowed (broker.reply_to_allowed is empty)"
            )
        } else {
            format!(
                "denied by reply_to: the request asks for its verdict on {destination:?}, which \
                 no pattern of broker.reply_to_allowed admits ({})",
                self.allowed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_destinations_a_pattern_admits_are_allowed() {
        let none = ReplyDestinations::default();
        assert!(
            none.check("chaos.verdicts.a")
                .unwrap_err()
                .contains("is empty")
        );
        let some = ReplyDestinations::new(&["chaos.verdicts.*".into()]).unwrap();
        assert!(some.check("chaos.verdicts.team-a").is_ok());
        let refused = some.check("chaos.requests").unwrap_err();
        assert!(refused.contains("\"chaos.requests\"") && refused.contains("chaos.verdicts.*"));
        let (key, _) = ReplyDestinations::new(&["a".into(), String::new()]).unwrap_err();
        assert_eq!(key, "broker.reply_to_allowed[1]");
    }
}
