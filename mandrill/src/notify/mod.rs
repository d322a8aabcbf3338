//! Notifications: webhooks (`[[notify]]`) told when a host is restarted, a
//! restart fails, a message is dead-lettered, a host does not come back, or
//! restarts are paused or resumed, by anyone (`switch.rs`: the switch's
//! changes are watched in the store).
//!
//! The worker only ever calls [`Notifier::send`], which puts the event on a
//! bounded queue without waiting (a full queue drops it, counted): a slow
//! or dead endpoint never slows or fails the pipeline. One tracked task
//! (`sender.rs`) posts each event to every endpoint that wants it, retried
//! with backoff; at shutdown it gets `notifier.flush_timeout` to empty the
//! queue, and what is left is dropped, counted. Endpoint URLs carry secrets
//! (a Slack webhook's path is its key): they are never logged, an endpoint
//! is named `notify[i]`.

mod sender;
mod settings;
mod switch;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::domain::RestartRequest;
use crate::domain::Timestamp;
use crate::stats::Stats;

pub(crate) use settings::{Format, MAX_QUEUE_CAPACITY, NotifierSettings, NotifyEntry};
pub(crate) use switch::watch as watch_switch;

/// What happened, as `[[notify]] events` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum EventKind {
    /// A host was restarted (and, when verifying, came back).
    Restarted,
    /// A restart failed for good: refused, or out of attempts.
    Failed,
    /// A message was dead-lettered, for whatever reason.
    DeadLettered,
    /// A restarted host did not come back healthy in time.
    Unrecovered,
    /// Restarts were paused (the kill switch).
    Paused,
    /// Restarts were resumed.
    Resumed,
}

/// One notification's content. Built only when some endpoint wants it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Event {
    /// What happened.
    pub event: EventKind,
    /// When, by the wall clock.
    pub at: Timestamp,
    /// The request's id, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<uuid::Uuid>,
    /// The instance, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_name: Option<String>,
    /// The host it resolves to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The restart attempt, when one was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The error or reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Who turned the kill switch, or paused a group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The group paused, when only one group's restarts are (`paused`
    /// with a group is not the kill switch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Who asked for the restart: the verified requester of a signed
    /// request, else what an unsigned one said, marked `(unverified)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Whether a signature vouches for `requested_by` (absent with it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requester_verified: Option<bool>,
}

impl Event {
    /// An event about one request.
    pub(crate) fn about(
        kind: EventKind,
        request: &RestartRequest,
        attempt: u32,
        detail: Option<String>,
    ) -> Self {
        Self {
            message_id: Some(request.message_id),
            instance_name: Some(request.instance_name.as_str().to_owned()),
            hostname: Some(request.hostname.to_string()),
            attempt: (attempt > 0).then_some(attempt),
            detail,
            requested_by: request.shown_requester(),
            requester_verified: request
                .shown_requester()
                .map(|_| request.requester.is_some()),
            ..Self::bare(kind)
        }
    }

    /// The kill switch turned.
    pub(crate) fn switch(paused: bool, by: &str, reason: &str) -> Self {
        let kind = if paused {
            EventKind::Paused
        } else {
            EventKind::Resumed
        };
        Self {
            by: Some(by.to_owned()),
            detail: Some(reason.to_owned()),
            ..Self::bare(kind)
        }
    }

    /// One group's restarts paused (a breached recovery objective).
    pub(crate) fn group_paused(group: &str, by: &str, reason: &str) -> Self {
        Self {
            group: Some(group.to_owned()),
            detail: Some(format!("restarts of group {group} paused: {reason}")),
            ..Self::switch(true, by, reason)
        }
    }

    /// An event with nothing but its kind and time.
    pub(crate) fn bare(kind: EventKind) -> Self {
        Self {
            event: kind,
            at: Timestamp::now(),
            message_id: None,
            instance_name: None,
            hostname: None,
            attempt: None,
            detail: None,
            by: None,
            group: None,
            requested_by: None,
            requester_verified: None,
        }
    }
}

/// The handle the service hands out: cheap to ask, never blocking.
pub(crate) struct Notifier {
    queue: mpsc::Sender<Event>,
    /// Endpoints wanting each kind, by [`EventKind`] as index: what a drop
    /// costs, and (non-zero) whether an event is worth building at all.
    wanted_by: [u64; 6],
    stats: Arc<Stats>,
    tracker: TaskTracker,
    /// Stop taking events; send what is queued.
    closing: CancellationToken,
    /// The flush bound is over: drop what is left.
    abort: CancellationToken,
    flush_timeout: Duration,
    /// The switch's turns told lately, so that each is told once.
    switch_turns: std::sync::Mutex<switch::Turns>,
}

impl Notifier {
    /// Starts the sending task; `None` without `[[notify]]` entries.
    /// Expects validated entries (see [`NotifyEntry::validate`]).
    pub(crate) fn start(
        entries: &[NotifyEntry],
        settings: &NotifierSettings,
        stats: Arc<Stats>,
    ) -> anyhow::Result<Option<Arc<Self>>> {
        if entries.is_empty() {
            return Ok(None);
        }
        let mut wanted_by = [0u64; 6];
        for entry in entries {
            for kind in entry.wanted() {
                wanted_by[kind as usize] += 1;
            }
        }
        let (queue, receiver) = mpsc::channel(settings.queue_capacity);
        let closing = CancellationToken::new();
        let abort = CancellationToken::new();
        let sender = sender::Sender::new(entries, stats.clone())?;
        let tracker = TaskTracker::new();
        tracker.spawn(sender.run(receiver, closing.clone(), abort.clone()));
        Ok(Some(Arc::new(Self {
            queue,
            wanted_by,
            stats,
            tracker,
            closing,
            abort,
            flush_timeout: settings.flush_timeout,
            switch_turns: std::sync::Mutex::default(),
        })))
    }

    /// Whether any endpoint wants `kind`: if not, build nothing.
    pub(crate) fn wants(&self, kind: EventKind) -> bool {
        self.wanted_by[kind as usize] > 0
    }

    /// Queues `event` without waiting. A full (or closed) queue drops it,
    /// counted once per endpoint that wanted it.
    pub(crate) fn send(&self, event: Event) {
        let wanted_by = self.wanted_by[event.event as usize];
        if wanted_by == 0 {
            return;
        }
        if self.queue.try_send(event).is_err() {
            self.stats.notifications_dropped.add(wanted_by);
        }
    }

    /// Sends what is queued within the flush bound, then drops the rest
    /// (counted). Events sent after this are dropped.
    pub(crate) async fn close(&self) {
        self.closing.cancel();
        self.tracker.close();
        if tokio::time::timeout(self.flush_timeout, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                timeout = ?self.flush_timeout,
                "notifications not sent within notifier.flush_timeout; dropping the rest"
            );
            self.abort.cancel();
            // The task stops at once when aborted.
            self.tracker.wait().await;
        }
    }
}

#[cfg(test)]
mod tests;
