//! The pipeline run: the real worker on the opened broker and store, timed
//! until every message is settled, then shut down and closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::restarter::{SimulatedRestarter, Simulation};
use crate::stats::Stats;
use crate::worker::{Shutdown, Worker, WorkerConfig};

use crate::bench::options::Options;
use crate::bench::setup::Opened;
use crate::bench::{allocations, ceilings, notify, report};

/// What the pipeline run measured.
pub(super) struct Pipeline {
    /// From the first publish (the worker's start, when the broker was
    /// filled first) to the last settlement.
    pub seconds: f64,
    /// The process's peak resident set, once every message was settled.
    pub peak_kib: u64,
    pub stats: Arc<Stats>,
    /// What the pipeline allocated, with `--allocations`: from the worker's
    /// start to the last settlement, the publishing included.
    pub allocated: Option<allocations::Allocated>,
}

/// Runs the worker on `opened` until all `options.messages` are settled,
/// feeding it what is left to publish; then shuts it down and closes the
/// broker and the store.
pub(super) async fn run(options: &Options, opened: Opened) -> Pipeline {
    let n = options.messages;
    let Opened {
        broker,
        store,
        unpublished,
        publish_seconds: _,
    } = opened;
    let restarter = Arc::new(SimulatedRestarter(Simulation {
        min_latency: options.work,
        max_latency: options.work,
        failure_rate: options.fail_rate,
    }));
    let stats = Arc::new(Stats::default());
    let shutdown = Shutdown::new();
    let notifier = notify::notifier(options.notify.as_deref(), &stats).await;
    let worker = Worker::new(
        worker_config(n, options.signed),
        broker.clone(),
        store.clone(),
        restarter,
        stats.clone(),
    )
    .with_notifier(notifier.clone());
    if options.count_allocations {
        allocations::start();
    }
    let started = Instant::now();
    let worker = tokio::spawn(worker.run(shutdown.clone()));
    let publisher = tokio::spawn({
        let broker = broker.clone();
        async move {
            for payload in unpublished {
                broker.publish(payload).await.expect("memory publish");
            }
        }
    });
    wait_until_settled(n, &stats, started).await;
    let seconds = started.elapsed().as_secs_f64();
    let allocated = options.count_allocations.then(allocations::stop);
    publisher.await.expect("publisher finishes");
    let peak_kib = report::rss_kib("VmHWM:");
    shutdown.request();
    worker
        .await
        .expect("worker task")
        .expect("worker stops cleanly");
    if let Some(notifier) = &notifier {
        notifier.close().await;
    }
    let backlog = broker.backlog().await.expect("backlog");
    assert!(
        matches!(backlog, Some(0) | None),
        "the queue is idle at the end"
    );
    broker.close().await;
    store.close().await;
    Pipeline {
        seconds,
        peak_kib,
        stats,
        allocated,
    }
}

/// The tutorial bounds nothing: `max_in_flight` is every message, and a
/// failed restart is not retried (one attempt), so it is dead-lettered.
fn worker_config(n: usize, signed: bool) -> WorkerConfig {
    WorkerConfig {
        max_in_flight: n.max(1),
        pull_batch: 256,
        max_attempts: 1,
        max_deliveries: 10,
        retry_backoff: Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(1),
        },
        record_attempts: 1,
        record_backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        },
        restart_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(10),
        lease_extension_interval: None,
        max_pull_failures: 3,
        pull_backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        },
        parse: ceilings::parse_rules(),
        switch_poll_interval: Duration::from_secs(1),
        store_timeout: crate::store::DEFAULT_TIMEOUT,
        policy: policy(signed),
    }
}

/// Waits until `n` messages are acked or dead-lettered. A slow run says
/// where it stands every 30 s, so that a stall can be told from a slow
/// tail.
async fn wait_until_settled(n: usize, stats: &Stats, started: Instant) {
    let n64 = n as u64;
    let mut reported = Instant::now();
    loop {
        let done = stats.acked.get() + stats.dead_lettered.get();
        if done >= n64 {
            break;
        }
        if reported.elapsed() >= Duration::from_secs(30) {
            reported = Instant::now();
            eprintln!(
                "{:.0}s: {done} of {n} done; pulled {}, store failures {}, leases lost {}, \
                 abandoned {}, deferred {}, nacked {}",
                started.elapsed().as_secs_f64(),
                stats.pulled.get(),
                stats.store_failures.get(),
                stats.leases_lost.get(),
                stats.abandoned.get(),
                stats.deferred.get(),
                stats.nacked.get(),
            );
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

/// Everything allowed, as by default; with `signed`, every request must be
/// signed by the benchmark's requester, who may restart any instance.
fn policy(signed: bool) -> crate::safety::PolicyHandle {
    if !signed {
        return crate::safety::PolicyHandle::default();
    }
    let requester = crate::safety::RequesterSettings {
        name: ceilings::SIGNER.into(),
        public_key: Some(ceilings::SIGNER_PUBLIC_KEY.into()),
        public_key_file: None,
        allow: vec!["*".into()],
        groups: Vec::new(),
        quota: None,
    };
    let requesters =
        crate::safety::Requesters::new(&[requester], true).expect("the benchmark's requester");
    crate::safety::PolicyHandle::new(crate::safety::Policy {
        requesters: std::sync::Arc::new(requesters),
        ..crate::safety::Policy::default()
    })
}
