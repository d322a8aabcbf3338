//! The verdict published to a request's `reply_to`, once its final outcome
//! is recorded: best effort, bounded, and never before the record (a
//! requester that hears a verdict finds it in the store too).

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tracing::{info, warn};

use super::shared::Shared;
use crate::domain::{Outcome, RestartRequest};

/// How long publishing a verdict may hold its delivery's settlement.
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

impl<'a> Verdict<'a> {
    fn of(request: &'a RestartRequest, outcome: &'a Outcome) -> Self {
        Self {
            message_id: request.message_id.to_string(),
            status: outcome.status().as_str(),
            reason: outcome.error(),
            recovered_after_ms: outcome
                .recovered_after()
                .map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
            host: request.hostname.as_str(),
            at: jiff::Timestamp::now().to_string(),
        }
    }
}

/// Publishes `outcome`, final and recorded, to `request`'s `reply_to` if it
/// names one the policy in force still admits. Callers check
/// `request.reply_to.is_some()` first, so that a request without one pays
/// nothing. A failure is logged and counted (`mandrill_replies_total`), and
/// changes nothing else: the outcome stands and the delivery is settled.
pub(super) async fn reply(shared: &Shared, request: &RestartRequest, outcome: &Outcome) {
    let Some(destination) = request.reply_to.as_deref() else {
        return;
    };
    // A request denied for its reply_to never gets here with it admitted;
    // a reload may also have withdrawn the pattern since the request was
    // placed.
    if let Err(why) = shared.config.policy.current().reply_to.check(destination) {
        info!(destination, why, "verdict not published");
        return;
    }
    // A struct of strings and numbers serialises.
    let verdict = serde_json::to_vec(&Verdict::of(request, outcome)).expect("a verdict serialises");
    let published = tokio::time::timeout(
        REPLY_TIMEOUT,
        shared.broker.reply(destination, Bytes::from(verdict)),
    )
    .await;
    match published {
        Ok(Ok(())) => {
            shared.stats.replies_sent.inc();
            info!(destination, status = %outcome.status(), "verdict published");
        }
        Ok(Err(error)) => {
            shared.stats.replies_failed.inc();
            warn!(destination, error = %error.with_causes(), "could not publish the verdict; the outcome stands");
        }
        Err(_elapsed) => {
            shared.stats.replies_failed.inc();
            warn!(destination, timeout = ?REPLY_TIMEOUT, "publishing the verdict timed out; the outcome stands");
        }
    }
}
