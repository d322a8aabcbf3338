//! Counters of what the worker did, shared by every task and flushed as the
//! service's last log line. Atomics, because they are bumped on the hot path
//! from every runtime thread.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters; see [`Stats::snapshot`].
        #[derive(Debug, Default)]
        pub(crate) struct Stats {
            $($(#[$doc])* pub(crate) $name: Counter,)*
            /// How long things took, for `/metrics`.
            pub(crate) timings: Timings,
            /// Dead letters by [`DeadLetterReason`], as index.
            pub(crate) dead_letter_reasons: [Counter; DeadLetterReason::ALL.len()],
            /// Rejections by [`crate::domain::Rejection::KINDS`], as index.
            pub(crate) rejection_reasons: [Counter; crate::domain::Rejection::KINDS.len()],
        }

        /// A copy of the counters at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub(crate) struct StatsSnapshot {
            $($(#[$doc])* pub(crate) $name: u64,)*
        }

        impl Stats {
            /// Reads every counter.
            pub(crate) fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.get(),)* }
            }
        }
    };
}

counters! {
    /// Deliveries received from the broker.
    pulled,
    /// Deliveries acked.
    acked,
    /// Deliveries nacked for redelivery.
    nacked,
    /// Deliveries dead-lettered (malformed or out of attempts).
    dead_lettered,
    /// Payloads rejected as malformed.
    rejected,
    /// Successful restarts.
    restarted,
    /// Failed or timed-out restarts.
    restart_failures,
    /// Restarts after which the host did not come back healthy in time.
    unrecovered,
    /// Requests a safety guard refused for good.
    denied,
    /// Restarts decided and recorded but not issued (leashed).
    dry_runs,
    /// Deliveries of already-finished requests, acked without restarting.
    duplicates,
    /// Panics caught in message handling or the pull loop.
    panics,
    /// Lease extensions sent.
    lease_extensions,
    /// Leases found lost (expired or settled elsewhere).
    leases_lost,
    /// Failed store operations (each try counts).
    store_failures,
    /// Settlements (ack, nack, dead-letter) the broker refused.
    settle_failures,
    /// Times the pull loop failed and was restarted.
    pull_failures,
    /// Times the runtime was found stalled by blocking code.
    stalls,
    /// Deliveries left to the broker because their lease was lost before
    /// a restart was issued.
    abandoned,
    /// Deliveries held off: another delivery's restart of the same request
    /// may still be in flight, or a guard (the calendar) said not yet.
    deferred,
    /// Requests deferred past `safety.max_defer`, recorded `expired`.
    expired,
    /// Messages given up on (out of deliveries or attempts), recorded and
    /// dead-lettered.
    given_up,
    /// Times the pull loop paused because the store was unreachable.
    store_outages,
    /// 1 while the store is unreachable and pulling is paused, else 0.
    store_down,
    /// Deliveries being handled right now (rises and falls).
    in_flight,
    /// Notifications an endpoint accepted.
    notifications_sent,
    /// Notifications an endpoint did not take after every try.
    notifications_failed,
    /// Notifications dropped: the queue was full, or shutdown's flush bound
    /// ran out.
    notifications_dropped,
    /// Verdicts published to a request's `reply_to`.
    replies_sent,
    /// Verdicts that could not be published to a request's `reply_to`.
    replies_failed,
}

/// Why a message was dead-lettered: a fixed set, so that `/metrics`
/// labels stay few (the reason's text is in the dead letter and the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum DeadLetterReason {
    /// None of the below (the store refused a claim; a request already
    /// recorded failed, dead-lettered again).
    Other = 0,
    /// The payload was rejected.
    Malformed,
    /// Out of deliveries or attempts (`given_up`).
    GivenUp,
    /// The restart failed for good.
    RestartFailed,
    /// The handler panicked on the last attempt.
    Panicked,
    /// The store refused to record an outcome or a decision.
    StoreRefused,
    /// A valid payload asked something else under another request's
    /// `message_id`: refused, recorded apart.
    Refused,
}

impl DeadLetterReason {
    /// Every reason, by index.
    pub(crate) const ALL: [Self; 7] = [
        Self::Other,
        Self::Malformed,
        Self::GivenUp,
        Self::RestartFailed,
        Self::Panicked,
        Self::StoreRefused,
        Self::Refused,
    ];

    /// The `/metrics` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Other => "other",
            Self::Malformed => "malformed",
            Self::GivenUp => "given_up",
            Self::RestartFailed => "restart_failed",
            Self::Panicked => "panicked",
            Self::StoreRefused => "store_refused",
            Self::Refused => "refused",
        }
    }

    /// The reason stored as `self as u8`; `Other` for anything else.
    pub(crate) fn from_u8(value: u8) -> Self {
        Self::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or(Self::Other)
    }
}

/// One monotonic (or, for `in_flight`, up-and-down) counter, alone on its
/// cache line so that threads bumping different counters do not contend.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n`.
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts one; only for gauges such as `in_flight`.
    pub(crate) fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    /// The current value.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds of the duration histograms' buckets, in seconds: from a
/// fast in-memory handling to a slow host's recovery.
pub(crate) const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A duration histogram with fixed buckets, lock-free like the counters.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    /// Observations per bucket (not cumulative); the last is above them all.
    buckets: [Counter; BUCKETS.len() + 1],
    sum_micros: Counter,
}

impl Histogram {
    /// Counts one duration.
    pub(crate) fn observe(&self, duration: std::time::Duration) {
        let seconds = duration.as_secs_f64();
        let bucket = BUCKETS.partition_point(|&bound| bound < seconds);
        self.buckets[bucket].inc();
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.0.fetch_add(micros, Ordering::Relaxed);
    }

    /// Cumulative counts per bound of [`BUCKETS`] then `+Inf`, and the sum in
    /// seconds.
    pub(crate) fn read(&self) -> (Vec<u64>, f64) {
        let mut total = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|bucket| {
                total += bucket.get();
                total
            })
            .collect();
        (cumulative, self.sum_micros.get() as f64 / 1e6)
    }
}

/// The duration histograms.
#[derive(Debug, Default)]
pub(crate) struct Timings {
    /// From pulled to settled, per delivery.
    pub handling: Histogram,
    /// The restarter's `restart` call, verification included.
    pub restart: Histogram,
    /// How long a verified host took to come back.
    pub recovery: Histogram,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn histogram_counts_are_cumulative_and_bounds_inclusive() {
        let histogram = Histogram::default();
        for ms in [1, 5, 7, 400_000] {
            histogram.observe(Duration::from_millis(ms));
        }
        let (cumulative, sum) = histogram.read();
        assert_eq!(cumulative.len(), BUCKETS.len() + 1);
        assert_eq!(&cumulative[..3], &[2, 3, 3]);
        assert_eq!(cumulative[BUCKETS.len() - 1], 3);
        assert_eq!(cumulative[BUCKETS.len()], 4);
        assert!((sum - 400.013).abs() < 1e-9, "{sum}");
    }
}
