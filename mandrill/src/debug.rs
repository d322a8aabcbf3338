//! Debugging aids (the tutorial's debugging lesson, for production):
//! a stall detector that notices blocking code on the runtime's threads, and
//! a periodic status line with the counters and in-flight count.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::stats::Stats;

/// Sleeps in short ticks and warns when a tick comes back late by more than
/// `threshold`: something held a runtime thread (blocking code not on the
/// blocking pool, or a long computation). Counts stalls in `stats.stalls`.
pub async fn watch_for_stalls(threshold: Duration, stats: Arc<Stats>, stop: CancellationToken) {
    let tick = (threshold / 2).max(Duration::from_millis(5));
    loop {
        let before = Instant::now();
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = stop.cancelled() => return,
        }
        let late = before.elapsed().saturating_sub(tick);
        if late > threshold {
            stats.stalls.inc();
            warn!(
                stalled_for = ?late,
                "runtime stalled: a task blocked its thread (blocking code outside the blocking pool?)"
            );
        }
    }
}

/// Logs the counters every `interval` until stopped.
pub async fn report_status(interval: Duration, stats: Arc<Stats>, stop: CancellationToken) {
    if interval.is_zero() {
        return;
    }
    let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => return,
        }
        let snapshot = stats.snapshot();
        info!(
            in_flight = snapshot.in_flight,
            pulled = snapshot.pulled,
            acked = snapshot.acked,
            nacked = snapshot.nacked,
            dead_lettered = snapshot.dead_lettered,
            store = if snapshot.store_down == 0 {
                "up"
            } else {
                "down: pulling paused"
            },
            "status"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blocking_the_runtime_thread_is_reported_as_a_stall() {
        let stats = Arc::new(Stats::default());
        let stop = CancellationToken::new();
        let watcher = tokio::spawn(watch_for_stalls(
            Duration::from_millis(50),
            stats.clone(),
            stop.clone(),
        ));
        // Let the watcher start ticking, then block this (only) thread.
        tokio::time::sleep(Duration::from_millis(30)).await;
        std::thread::sleep(Duration::from_millis(300));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stats.stalls.get() == 0 {
            assert!(std::time::Instant::now() < deadline, "stall never reported");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        watcher.await.unwrap();
    }
}
