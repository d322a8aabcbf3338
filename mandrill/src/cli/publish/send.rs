//! Sending what `mandrill publish` made: in batches (a transaction each on
//! SQLite), one by one, or at a rate; each request told (printed) once the
//! broker confirmed it, so that standard output is what was published.

use std::io::{BufWriter, Write as _};
use std::time::Duration;

use bytes::Bytes;

use super::check::Sent;
use super::{Outgoing, PUBLISH_BATCH};
use crate::broker::{BrokerError, Publisher};
use crate::config;
use crate::sqlite::SqliteBroker;

/// "1 request", "2 requests".
pub(in crate::cli) fn requests(count: usize) -> String {
    crate::settings::duration::count(count as u64, "request")
}

/// Prints each request once published: `<message id> <host>` lines, or
/// JSON objects; flushed after each confirmed batch, so that what stdout
/// holds was published even if a later batch fails.
pub(super) struct Printer {
    json: bool,
    out: BufWriter<std::io::Stdout>,
}

impl Printer {
    pub(super) fn new(json: bool) -> Self {
        Self {
            json,
            out: BufWriter::new(std::io::stdout()),
        }
    }
}

impl Published<Sent> for Printer {
    fn published(&mut self, sent: &[Sent]) {
        for sent in sent {
            let line = if self.json {
                // A struct of strings and a uuid serialises.
                serde_json::to_string(sent).expect("a Sent serialises")
            } else {
                sent.line()
            };
            // A closed stdout (a pipe's reader gone) must not stop the
            // publishing half-way: what was sent is sent.
            let _ = writeln!(self.out, "{line}");
        }
        let _ = self.out.flush();
    }
}

/// Publishes in batches of up to [`PUBLISH_BATCH`] (on SQLite, a
/// transaction each); how many were published.
pub(in crate::cli) async fn publish_in_batches(
    broker: &dyn Publisher,
    payloads: impl Iterator<Item = Bytes>,
) -> Result<usize, BrokerError> {
    publish_batches(broker, payloads.map(|payload| (payload, ())), &mut Untold).await
}

/// Publishes one by one, at `rate` per second if given; how many were
/// published.
pub(in crate::cli) async fn publish_each(
    broker: &dyn Publisher,
    payloads: impl Iterator<Item = Bytes>,
    rate: Option<f64>,
) -> Result<usize, BrokerError> {
    publish_one_by_one(
        broker,
        payloads.map(|payload| (payload, ())),
        rate,
        &mut Untold,
    )
    .await
}

/// What is told of each request once the broker confirmed it.
pub(super) trait Published<T> {
    fn published(&mut self, sent: &[T]);
}

/// Tells nothing (a campaign prints its own).
struct Untold;

impl<T> Published<T> for Untold {
    fn published(&mut self, _: &[T]) {}
}

/// As [`publish_in_batches`], telling `told` of each batch once published.
pub(super) async fn publish_batches<T>(
    broker: &dyn Publisher,
    outgoing: impl Iterator<Item = (Bytes, T)>,
    told: &mut impl Published<T>,
) -> Result<usize, BrokerError> {
    let mut outgoing = outgoing.peekable();
    let mut published = 0usize;
    while outgoing.peek().is_some() {
        let (batch, sent): (Vec<Bytes>, Vec<T>) = outgoing.by_ref().take(PUBLISH_BATCH).unzip();
        if let Err(error) = broker.publish_all(batch).await {
            if published > 0 {
                eprintln!("mandrill: published {} before failing", requests(published));
            }
            return Err(error);
        }
        told.published(&sent);
        published += sent.len();
    }
    Ok(published)
}

/// As [`publish_each`], telling `told` of each request once published.
pub(super) async fn publish_one_by_one<T>(
    broker: &dyn Publisher,
    outgoing: impl Iterator<Item = (Bytes, T)>,
    rate: Option<f64>,
    told: &mut impl Published<T>,
) -> Result<usize, BrokerError> {
    let started = tokio::time::Instant::now();
    let mut count = 0;
    for (published, (payload, sent)) in outgoing.enumerate() {
        if let Some(rate) = rate {
            // Bounded: a far-off due time must not overflow the clock.
            let offset = Duration::try_from_secs_f64(published as f64 / rate)
                .unwrap_or(config::limits::MAX_DURATION)
                .min(config::limits::MAX_DURATION);
            let due = started + offset;
            tokio::time::sleep_until(due).await;
        }
        if let Err(error) = broker.publish(payload).await {
            eprintln!("mandrill: published {} before failing", requests(published));
            return Err(error);
        }
        told.published(std::slice::from_ref(&sent));
        count = published + 1;
    }
    Ok(count)
}

/// Publishes `rate` requests per second: every tick, the ones due so far,
/// in one transaction, each told once its transaction committed.
pub(super) async fn publish_at_rate(
    broker: &SqliteBroker,
    outgoing: impl Iterator<Item = Outgoing>,
    rate: f64,
    told: &mut Printer,
) -> Result<usize, BrokerError> {
    const TICK: Duration = Duration::from_millis(10);
    let started = tokio::time::Instant::now();
    let mut pending = outgoing.peekable();
    let mut published = 0usize;
    while pending.peek().is_some() {
        // At least one each round, so that a slow rate still starts at once.
        let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).saturating_sub(published);
        let (group, sent): (Vec<Bytes>, Vec<Sent>) =
            pending.by_ref().take(due.min(PUBLISH_BATCH)).unzip();
        if let Err(error) = broker.publish_all(group).await {
            if published > 0 {
                eprintln!("mandrill: published {} before failing", requests(published));
            }
            return Err(error);
        }
        told.published(&sent);
        published += sent.len();
        if pending.peek().is_some() {
            tokio::time::sleep(TICK).await;
        }
    }
    Ok(published)
}
