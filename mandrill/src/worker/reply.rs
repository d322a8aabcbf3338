//! The verdict published to a request's `reply_to`, once its final outcome
//! is recorded: never before (a requester that hears a verdict finds it in
//! the store too), best effort, bounded, and off the handler's path: a task
//! of its own in `Shared::replies`, which the drain waits for, so that the
//! delivery's settlement never waits for it and no handler's future grows.

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tracing::{Instrument, info, warn};

use super::shared::Shared;
use crate::domain::{Outcome, RestartRequest};

/// How long publishing one verdict may take; the drain waits at most this
/// long for the last ones.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a requester hears on its `reply_to`.
#[derive(Debug, Serialize)]
struct Verdict<'a> {
    message_id: String,
    /// The final status, as the store records it (`restarted`, `denied`, …).
    status: &'a str,
    /// Why, for any status but `restarted` and `dry-run`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    /// How long the host took to pass its health probe, if verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    recovered_after_ms: Option<u64>,
    host: &'a str,
    /// When the verdict was published (RFC 3339).
    at: String,
}

/// Publishes `outcome`, final and just recorded, to `request`'s `reply_to`
/// if it names one the policy in force still admits. Returns at once: a
/// request without one pays a field check. A failure is logged and counted
/// (`mandrill_replies_total`) and changes nothing else.
#[inline]
pub(super) fn reply(shared: &Shared, request: &RestartRequest, outcome: &Outcome) {
    if request.reply_to.is_some() && outcome.status().is_final() {
        publish(shared, request, outcome);
    }
}

#[cold]
fn publish(shared: &Shared, request: &RestartRequest, outcome: &Outcome) {
    let Some(destination) = request.reply_to.clone() else {
        return;
    };
    // A request denied for its reply_to gets here with it refused; a
    // reload may also have withdrawn the pattern since it was placed.
    if let Err(why) = shared.config.policy.current().reply_to.check(&destination) {
        info!(destination, why, "verdict not published");
        return;
    }
    let verdict = Verdict {
        message_id: request.message_id.to_string(),
        status: outcome.status().as_str(),
        reason: outcome.error(),
        recovered_after_ms: outcome
            .recovered_after()
            .map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
        host: request.hostname.as_str(),
        at: jiff::Timestamp::now().to_string(),
    };
    // A struct of strings and numbers serialises.
    let verdict = Bytes::from(serde_json::to_vec(&verdict).expect("a verdict serialises"));
    let (broker, stats) = (shared.broker.clone(), shared.stats.clone());
    let status = outcome.status();
    let sent = async move {
        let published = tokio::time::timeout(REPLY_TIMEOUT, broker.reply(&destination, verdict));
        match published.await {
            Ok(Ok(())) => {
                stats.replies_sent.inc();
                info!(destination, %status, "verdict published");
            }
            Ok(Err(error)) => {
                stats.replies_failed.inc();
                warn!(destination, error = %error.with_causes(), "could not publish the verdict; the outcome stands");
            }
            Err(_elapsed) => {
                stats.replies_failed.inc();
                warn!(destination, timeout = ?REPLY_TIMEOUT, "publishing the verdict timed out; the outcome stands");
            }
        }
    };
    shared
        .replies
        .spawn(sent.instrument(tracing::Span::current()));
}
