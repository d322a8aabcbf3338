//! The task that posts notifications: one event at a time off the queue,
//! to every endpoint that wants it at once, each retried with backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{Event, EventKind, Format, NotifyEntry};
use crate::stats::Stats;

/// Tries per notification and endpoint.
const TRIES: u32 = 3;
/// Before the second try; doubled before each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// One endpoint, named `notify[i]` in logs: its URL is a secret.
struct Target {
    label: String,
    url: reqwest::Url,
    format: Format,
    events: Vec<EventKind>,
    timeout: Duration,
}

pub(super) struct Sender {
    client: reqwest::Client,
    targets: Vec<Target>,
    stats: Arc<Stats>,
}

impl Sender {
    pub(super) fn new(entries: &[NotifyEntry], stats: Arc<Stats>) -> anyhow::Result<Self> {
        crate::restarter::http::install_crypto_provider();
        let client = reqwest::Client::builder()
            // A redirect could carry the secret URL's key elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("mandrill/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| {
                anyhow::anyhow!(
                    "cannot build the notification client: {}",
                    error.without_url()
                )
            })?;
        let mut targets = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            // Validated at load; the error never quotes the URL.
            let url = reqwest::Url::parse(&entry.url.0)
                .map_err(|_| anyhow::anyhow!("notify[{i}].url is not a valid URL"))?;
            targets.push(Target {
                label: format!("notify[{i}]"),
                url,
                format: entry.format,
                events: entry.wanted().collect(),
                timeout: entry.timeout,
            });
        }
        Ok(Self {
            client,
            targets,
            stats,
        })
    }

    fn wanting(&self, kind: EventKind) -> impl Iterator<Item = &Target> {
        self.targets
            .iter()
            .filter(move |t| t.events.contains(&kind))
    }

    /// Sends events until the queue is closed and empty, or `abort`.
    pub(super) async fn run(
        self,
        mut queue: mpsc::Receiver<Event>,
        closing: CancellationToken,
        abort: CancellationToken,
    ) {
        let mut closed = false;
        loop {
            let event = tokio::select! {
                biased;
                () = abort.cancelled() => break,
                () = closing.cancelled(), if !closed => {
                    // New events are refused (dropped, counted); the queued
                    // ones are still received.
                    queue.close();
                    closed = true;
                    continue;
                }
                event = queue.recv() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            let finished = AtomicU64::new(0);
            tokio::select! {
                biased;
                () = abort.cancelled() => {
                    let wanted = self.wanting(event.event).count() as u64;
                    let unfinished = wanted.saturating_sub(finished.load(Ordering::Relaxed));
                    self.stats.notifications_dropped.add(unfinished);
                    break;
                }
                () = self.deliver(&event, &finished) => {}
            }
        }
        queue.close();
        while let Ok(event) = queue.try_recv() {
            let wanted = self.wanting(event.event).count() as u64;
            self.stats.notifications_dropped.add(wanted);
        }
    }

    /// Posts `event` to every endpoint wanting it, concurrently.
    async fn deliver(&self, event: &Event, finished: &AtomicU64) {
        let posts = self.wanting(event.event).map(|target| async move {
            let body = render(event, target.format);
            if self.post(target, body).await {
                self.stats.notifications_sent.inc();
            } else {
                self.stats.notifications_failed.inc();
            }
            finished.fetch_add(1, Ordering::Relaxed);
        });
        futures::future::join_all(posts).await;
    }

    /// Whether the endpoint took it, within `TRIES`.
    async fn post(&self, target: &Target, body: Vec<u8>) -> bool {
        let mut backoff = FIRST_BACKOFF;
        for tried in 1..=TRIES {
            let sent = self
                .client
                .post(target.url.clone())
                .timeout(target.timeout)
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await;
            let why = match sent {
                Ok(response) if response.status().is_success() => return true,
                Ok(response) => {
                    let status = response.status();
                    if !retryable(status) {
                        warn!(notify = %target.label, %status, "notification refused; not retrying");
                        return false;
                    }
                    status.to_string()
                }
                // Never the error's own Display: it quotes the URL.
                Err(error) => crate::causes::WithCauses(&error.without_url()).to_string(),
            };
            if tried == TRIES {
                warn!(notify = %target.label, error = %why, tried, "notification not sent");
                return false;
            }
            debug!(notify = %target.label, error = %why, tried, ?backoff, "notification failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
        false
    }
}

/// Worth another try: the endpoint is overloaded or briefly down.
fn retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

/// The body for `format`.
pub(super) fn render(event: &Event, format: Format) -> Vec<u8> {
    let value = match format {
        Format::Json => serde_json::json!(event),
        Format::Slack => serde_json::json!({ "text": text(event) }),
    };
    value.to_string().into_bytes()
}

/// One line for a chat, with Slack's three control characters escaped, and
/// what a host or a payload wrote shown escaped ([`printable`]): a newline
/// in a restart's output cannot start a line that reads as another
/// notification.
pub(super) fn text(event: &Event) -> String {
    let instance = match (&event.instance_name, &event.hostname) {
        (Some(instance), Some(host)) => format!("{instance} ({host})"),
        (Some(instance), None) => instance.clone(),
        _ => "a request".to_owned(),
    };
    let detail = event.detail.as_deref().unwrap_or("no reason given");
    let by = event.by.as_deref().unwrap_or("someone");
    let id = event
        .message_id
        .map_or_else(|| "without a readable id".to_owned(), |id| id.to_string());
    let asked = event
        .requested_by
        .as_deref()
        .map_or_else(String::new, |by| format!(" (requested by {by})"));
    let line = match event.event {
        EventKind::Restarted => match event.attempt {
            Some(attempt) if attempt > 1 => {
                format!("restarted {instance} on attempt {attempt}{asked}")
            }
            _ => format!("restarted {instance}{asked}"),
        },
        EventKind::Failed => format!("restart of {instance}{asked} failed for good: {detail}"),
        EventKind::DeadLettered => format!("dead-lettered message {id}: {detail}"),
        EventKind::Unrecovered => {
            format!("restarted {instance}, but it did not come back: {detail}")
        }
        EventKind::Paused => format!("restarts PAUSED by {by}: {detail}"),
        EventKind::Resumed => format!("restarts resumed by {by}: {detail}"),
    };
    crate::domain::printable(&format!("mandrill: {line}"))
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
