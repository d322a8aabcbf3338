//! Counters of what the worker did, shared by every task and flushed as the
//! service's last log line. Atomics, because they are bumped on the hot path
//! from every runtime thread.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters; see [`Stats::snapshot`].
        #[derive(Debug, Default)]
        pub struct Stats {
            $($(#[$doc])* pub $name: Counter,)*
        }

        /// A copy of the counters at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct StatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Stats {
            /// Reads every counter.
            pub fn snapshot(&self) -> StatsSnapshot {
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
}

/// One monotonic (or, for `in_flight`, up-and-down) counter, alone on its
/// cache line so that threads bumping different counters do not contend.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Subtracts one; only for gauges such as `in_flight`.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl StatsSnapshot {
    /// Deliveries settled one way or another.
    pub fn settled(&self) -> u64 {
        self.acked + self.nacked + self.dead_lettered
    }
}
