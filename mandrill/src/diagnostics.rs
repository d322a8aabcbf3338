//! Debugging aids (the tutorial's debugging lesson, for production):
//! a stall detector that notices blocking code on the runtime's threads, a
//! periodic status line with the counters, the in-flight count and the
//! runtime's own metrics, which `/metrics` exposes too.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::stats::Stats;

mod steps;

pub(crate) use steps::StepTimings;

/// Sleeps in short ticks and warns when a tick comes back late by more than
/// `threshold`: something held a runtime thread (blocking code not on the
/// blocking pool, or a long computation). Counts stalls in `stats.stalls`.
pub(crate) async fn watch_for_stalls(
    threshold: Duration,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
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

/// The tokio runtime's metrics that stable tokio offers (no
/// `tokio_unstable` needed): enough to tell a starved runtime (a deep
/// global queue, busy workers) from an idle one, and a task leak (alive
/// tasks growing while in-flight does not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct RuntimeMetrics {
    /// Worker threads.
    pub workers: usize,
    /// Tasks spawned and not yet finished.
    pub alive_tasks: usize,
    /// Tasks waiting in the shared queue for a worker.
    pub global_queue_depth: usize,
    /// Time the workers spent running tasks, summed, since start.
    pub busy_seconds: f64,
}

impl RuntimeMetrics {
    /// The current runtime's metrics; zeros outside a runtime.
    pub(crate) fn read() -> Self {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Self::default();
        };
        let metrics = handle.metrics();
        let workers = metrics.num_workers();
        Self {
            workers,
            alive_tasks: metrics.num_alive_tasks(),
            global_queue_depth: metrics.global_queue_depth(),
            busy_seconds: (0..workers)
                .map(|worker| metrics.worker_total_busy_duration(worker).as_secs_f64())
                .sum(),
        }
    }
}

/// Logs the counters every `interval` until stopped.
pub(crate) async fn report_status(interval: Duration, stats: Arc<Stats>, stop: CancellationToken) {
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
        let runtime = RuntimeMetrics::read();
        info!(
            in_flight = snapshot.in_flight,
            tasks = runtime.alive_tasks,
            queued = runtime.global_queue_depth,
            workers = runtime.workers,
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runtime_metrics_count_workers_and_alive_tasks() {
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let before = RuntimeMetrics::read();
        let parked = tokio::spawn(async move {
            let _ = wait.await;
        });
        let during = RuntimeMetrics::read();
        assert_eq!(during.workers, 2);
        assert_eq!(during.alive_tasks, before.alive_tasks + 1);
        release.send(()).unwrap();
        parked.await.unwrap();
        // The join handle is woken as the task completes, just before the
        // worker thread that ran it takes it out of the runtime's count: a
        // read at once could still count it (often, with this test alone).
        // So the count is waited for, not raced.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while RuntimeMetrics::read().alive_tasks != before.alive_tasks {
            assert!(
                std::time::Instant::now() < deadline,
                "the finished task is still counted: {:?}",
                RuntimeMetrics::read()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            std::thread::spawn(RuntimeMetrics::read).join().unwrap(),
            RuntimeMetrics::default()
        );
    }

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
