//! A request's story in words: what `mandrill explain` prints and the
//! admin API's `/api/requests/{id}` carries.

use std::fmt::Write as _;

use crate::domain::printable;

use super::{Story, Timestamp};
use crate::domain::Status;

impl Story {
    /// When the request was first seen: its row's `received_at`, or the
    /// first thing recorded about it if that is earlier (a row made after
    /// its first verdicts, as stores before decisions made rows did).
    pub(crate) fn first_seen(&self) -> Timestamp {
        let decisions = self.decisions.iter().map(|decision| decision.at);
        let claims = self.attempts.iter().map(|attempt| attempt.claimed_at);
        decisions
            .chain(claims)
            .fold(self.entry.received_at, std::cmp::min)
    }

    /// The story in words, one event a line, oldest first.
    pub fn explain(&self) -> String {
        let story = self;
        let entry = &story.entry;
        let mut text = String::new();
        let id = entry
            .message_id
            .map_or_else(|| "-".to_owned(), |id| id.to_string());
        let attempts = match entry.attempts {
            1 => "1 attempt".to_owned(),
            n => format!("{n} attempts"),
        };
        push_line(
            &mut text,
            format_args!("request {id}: {} ({attempts})", entry.status),
        );
        let group = story
            .attempts
            .first()
            .map_or_else(String::new, |a| format!(", group {}", a.group));
        if entry.instance_name.is_none() && entry.status != Status::Rejected {
            // No row: only the guards' verdicts were recorded.
            push_line(
                &mut text,
                format_args!(
                    "  never claimed: only the guards' verdicts below are recorded (the host and \
                 who asked are not)"
                ),
            );
        } else {
            push_line(
                &mut text,
                format_args!(
                    "  instance {} ({}){group}",
                    entry.instance_name.as_deref().unwrap_or("-"),
                    entry.hostname.as_deref().unwrap_or("-"),
                ),
            );
            if story.attempts.is_empty() && entry.status != Status::Rejected {
                push_line(
                    &mut text,
                    format_args!(
                        "  never claimed: no restart was attempted; the guards' verdicts below say why"
                    ),
                );
            }
        }
        if entry.requested_by.is_some() || entry.reason.is_some() {
            push_line(
                &mut text,
                format_args!(
                    "  requested by {}: {}",
                    entry.requested_by_shown().as_deref().unwrap_or("-"),
                    entry.reason.as_deref().unwrap_or("-")
                ),
            );
        }
        // Told in time order; at the same millisecond, in the order things
        // happen: received, verdicts before a claim, the claim, verdicts
        // after it (the stop conditions'), the end.
        let mut events: Vec<(Timestamp, u8, String)> = Vec::new();
        events.push((story.first_seen(), 0, "received".to_owned()));
        for decision in &story.decisions {
            let order = if decision.attempt == 0 { 1 } else { 3 };
            let line = if decision.reason.starts_with(&decision.verdict) {
                decision.reason.clone()
            } else {
                format!(
                    "{} by {}: {}",
                    decision.verdict, decision.guard, decision.reason
                )
            };
            events.push((decision.at, order, line));
        }
        for (index, attempt) in story.attempts.iter().enumerate() {
            let verdict = if attempt.verdict.is_empty() {
                "allowed"
            } else {
                &attempt.verdict
            };
            // A claim is written before its restart is issued: an attempt
            // that ended a dry run, denied or expired issued nothing, and
            // one with no recorded end may or may not have.
            let not_issued = attempt
                .outcome
                .is_some_and(|outcome| Status::NOT_ISSUED.contains(&outcome));
            let claimed = match attempt.outcome {
                Some(_) if !not_issued => "claimed and issued",
                _ => "claimed",
            };
            events.push((
                attempt.claimed_at,
                2,
                format!("attempt {} {claimed} ({verdict})", attempt.attempt),
            ));
            if let (Some(outcome), Some(at)) = (attempt.outcome, attempt.settled_at) {
                let issued = if not_issued {
                    "; no restart was issued"
                } else {
                    ""
                };
                events.push((
                    at,
                    4,
                    format!("attempt {} ended: {outcome}{issued}", attempt.attempt),
                ));
            } else {
                let why = if entry.status.is_final() || index + 1 < story.attempts.len() {
                    "its outcome is unknown: it may have been issued, and the host restarted"
                } else {
                    "in flight, or its outcome was lost"
                };
                events.push((
                    attempt.claimed_at,
                    4,
                    format!("attempt {} has no recorded end ({why})", attempt.attempt),
                ));
            }
        }
        events.sort_by_key(|(at, order, _)| (*at, *order));
        for (at, _, line) in events {
            push_line(&mut text, format_args!("  {at}  {line}"));
        }
        if let Some(after) = entry.recovered_after {
            push_line(
                &mut text,
                format_args!(
                    "  recovered after {}",
                    humantime::format_duration(std::time::Duration::from_millis(
                        u64::try_from(after.as_millis()).unwrap_or(u64::MAX)
                    ))
                ),
            );
        }
        if let Some(error) = &entry.last_error {
            push_line(&mut text, format_args!("  last error: {error}"));
        }
        if let Some(output) = &entry.output {
            push_line(&mut text, format_args!("  output: {output}"));
        }
        match entry.completed_at {
            Some(at) => {
                push_line(&mut text, format_args!("  final since {at}"));
            }
            None => {
                push_line(
                    &mut text,
                    format_args!("  not final: it waits in the queue for its next delivery"),
                );
            }
        }
        text
    }
}

/// Appends a line of the story, [`printable`]: a reason, an error or a
/// host's output that holds a newline or an escape sequence is shown
/// escaped, one event a line, never a line or a terminal control of its
/// own.
fn push_line(text: &mut String, args: std::fmt::Arguments<'_>) {
    let start = text.len();
    let _ = text.write_fmt(args);
    if let std::borrow::Cow::Owned(shown) = printable(&text[start..]) {
        text.truncate(start);
        text.push_str(&shown);
    }
    text.push('\n');
}

#[cfg(test)]
mod tests {
    use super::super::{AttemptRecord, DecisionRecord, HistoryEntry, Story};
    use crate::domain::{Status, Timestamp};

    fn story(received_at: i64) -> Story {
        let decision = |at: i64, attempt: u32, verdict: &str, reason: &str| DecisionRecord {
            at: Timestamp::from_millis(at),
            attempt,
            verdict: verdict.into(),
            guard: "calendar".into(),
            reason: reason.into(),
        };
        Story {
            entry: HistoryEntry {
                message_id: Some(uuid::Uuid::nil()),
                instance_name: Some("cattle-1".into()),
                hostname: Some("cattle-1.example.net".into()),
                status: Status::Restarted,
                attempts: 1,
                requested_by: None,
                verified: false,
                reason: None,
                last_error: None,
                output: None,
                recovered_after: None,
                received_at: Timestamp::from_millis(received_at),
                updated_at: Timestamp::from_millis(4_000),
                completed_at: Some(Timestamp::from_millis(4_000)),
            },
            attempts: vec![AttemptRecord {
                attempt: 1,
                group: "cattle".into(),
                claimed_at: Timestamp::from_millis(3_000),
                verdict: "allowed".into(),
                outcome: Some(Status::Restarted),
                settled_at: Some(Timestamp::from_millis(4_000)),
                requester: None,
            }],
            decisions: vec![
                decision(1_000, 0, "deferred", "deferred by calendar: closed"),
                // Recorded at the claim's millisecond, after it.
                decision(
                    3_000,
                    1,
                    "checked",
                    "checked stop conditions before attempt 1: \"a\" healthy (ok)",
                ),
            ],
        }
    }

    /// The events `explain` lists, without their times.
    fn events(story: &Story) -> Vec<String> {
        story
            .explain()
            .lines()
            .filter_map(|line| line.strip_prefix("  1970-"))
            .map(|line| line.split_once("  ").unwrap().1.to_owned())
            .collect()
    }

    /// What a payload or a host wrote is told escaped, one event a line: a
    /// newline cannot forge an event, an escape sequence cannot reach the
    /// terminal.
    #[test]
    fn a_reason_or_an_output_cannot_forge_a_line_or_an_escape() {
        let mut told = story(500);
        told.entry.last_error = Some("boom\n  1970-01-01 restarted\u{1b}[2J".into());
        told.entry.output = Some("ok\u{1b}]2;pwned\u{7}".into());
        let text = told.explain();
        assert!(!text.contains(['\u{1b}', '\u{7}']), "{text:?}");
        assert!(
            text.contains("  last error: boom\\n  1970-01-01 restarted\\u{1b}[2J\n"),
            "{text}"
        );
        assert_eq!(events(&told).len(), 5, "{text}");
    }

    /// An attempt that ended a dry run, denied or expired issued nothing,
    /// and its story never says it did.
    #[test]
    fn an_attempt_that_issued_nothing_is_never_told_as_issued() {
        for status in [Status::DryRun, Status::Denied, Status::Expired] {
            let mut told = story(500);
            told.entry.status = status;
            told.attempts[0].outcome = Some(status);
            let events = events(&told);
            assert!(
                events.iter().all(|e| !e.contains("and issued")),
                "{events:?}"
            );
            assert!(
                events.contains(&format!("attempt 1 ended: {status}; no restart was issued")),
                "{events:?}"
            );
        }
    }

    /// An attempt whose outcome was lost, in a request that went on (to
    /// another attempt, or to an end), is told as unknown: the host may
    /// have been restarted by it too.
    #[test]
    fn an_attempt_whose_outcome_was_lost_is_told_once_the_request_went_on() {
        let mut told = story(500);
        let mut second = told.attempts[0].clone();
        second.attempt = 2;
        second.claimed_at = Timestamp::from_millis(3_500);
        told.attempts[0].outcome = None;
        told.attempts[0].settled_at = None;
        told.attempts.push(second);
        told.entry.attempts = 2;
        let events = events(&told);
        assert!(
            events.contains(
                &"attempt 1 has no recorded end (its outcome is unknown: it may have been \
                  issued, and the host restarted)"
                    .to_owned()
            ),
            "{events:?}"
        );
        assert!(
            events.contains(&"attempt 1 claimed (allowed)".to_owned()),
            "{events:?}"
        );
    }

    #[test]
    fn the_story_is_told_in_time_order_received_first() {
        let told = [
            "received",
            "deferred by calendar: closed",
            "attempt 1 claimed and issued (allowed)",
            "checked stop conditions before attempt 1: \"a\" healthy (ok)",
            "attempt 1 ended: restarted",
        ];
        assert_eq!(events(&story(500)), told);
        // A row whose received_at is later than its first verdict (made
        // after it): received is still told first, at the first record.
        let late_row = story(2_000);
        assert_eq!(events(&late_row), told);
        assert_eq!(late_row.first_seen(), Timestamp::from_millis(1_000));
    }
}
