//! Exponential backoff, deterministic so that tests with paused time can
//! predict every delay.

use std::time::Duration;

/// `initial`, doubling per attempt, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The delay after the first failure.
    pub initial: Duration,
    /// No delay is longer than this.
    pub max: Duration,
}

impl Backoff {
    /// The delay after failure number `failures` (1-based; 0 is treated as 1).
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(32);
        self.initial
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let delays: Vec<_> = (0..7).map(|n| backoff.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(1));
    }
}
