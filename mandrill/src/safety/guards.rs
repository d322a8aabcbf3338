//! The guards that may defer a request, and the clock they read: what the
//! worker asks after eligibility and before the reservation, and again
//! right before the restart.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::{Calendar, Counting, Verdict};
use crate::domain::RestartRequest;

/// Wall-clock time for the guards. Injected so that tests read tokio's
/// (paused) clock instead of the system's.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system clock.
    #[default]
    System,
    /// Always this instant: `policy check --at`, and tests.
    Fixed(Timestamp),
    /// `origin` at the moment of creation, then advancing with tokio's
    /// clock: paused in tests, so a test moves the calendar's time.
    Following {
        /// The wall-clock time at `since`.
        origin: Timestamp,
        /// When this clock was made.
        since: tokio::time::Instant,
    },
}

impl Clock {
    /// A clock reading `origin` now and advancing with tokio's time.
    pub fn following_tokio(origin: Timestamp) -> Self {
        Self::Following {
            origin,
            since: tokio::time::Instant::now(),
        }
    }

    /// The current time.
    pub fn now(&self) -> Timestamp {
        match self {
            Self::System => Timestamp::now(),
            Self::Fixed(at) => *at,
            Self::Following { origin, since } => {
                let elapsed =
                    SignedDuration::try_from(since.elapsed()).unwrap_or(SignedDuration::MAX);
                origin.saturating_add(elapsed).unwrap_or(*origin)
            }
        }
    }
}

/// What the deferring guards decide about a request right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Not yet: nack, to be redelivered after `delay`.
    Defer {
        /// Which guard.
        guard: &'static str,
        /// Until the guard could pass (never past the expiry).
        delay: Duration,
        /// Which guard, why, and when it opens.
        reason: String,
    },
    /// Deferred past `safety.max_defer` since it was published, or it would
    /// be before the guard opens: recorded `expired`, acked.
    Expired {
        /// Which guard.
        guard: &'static str,
        /// What deferred it, and since when.
        reason: String,
    },
}

/// The deferring guards: the calendar, and the counting guards that the
/// store's claim decides.
#[derive(Debug, Clone, Default)]
pub struct Guards {
    /// `None`: restarts at any time.
    pub calendar: Option<Calendar>,
    /// Groups, rate limits, host cooldown and the disruption budget.
    pub counting: Counting,
    /// How long after it was published a request may still be deferred.
    pub max_defer: Duration,
    /// The time the guards read.
    pub clock: Clock,
}

impl Guards {
    /// `None` when every deferring guard allows the request now.
    ///
    /// A request without `published_at` never expires here: nothing records
    /// when a deferred request was first seen, and the broker's delivery
    /// count is not time.
    pub fn hold(&self, request: &RestartRequest) -> Option<Hold> {
        let calendar = self.calendar.as_ref()?;
        let now = self.clock.now();
        let Verdict::Defer { until, reason } = calendar.verdict(now) else {
            return None;
        };
        let delay = Duration::try_from(until.duration_since(now)).unwrap_or_default();
        Some(self.defer(request, "calendar", delay, reason))
    }

    /// A deferral by `guard` for `delay`, or the request's expiry if it
    /// would still wait past `safety.max_defer` after it was published.
    pub fn defer(
        &self,
        request: &RestartRequest,
        guard: &'static str,
        delay: Duration,
        reason: String,
    ) -> Hold {
        let now = self.clock.now();
        let until = now
            .saturating_add(SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX))
            .unwrap_or(now);
        let expires = request
            .published_at
            .and_then(|published| Timestamp::try_from(published).ok())
            .map(|published| {
                let max_defer =
                    SignedDuration::try_from(self.max_defer).unwrap_or(SignedDuration::MAX);
                (
                    published,
                    published.saturating_add(max_defer).unwrap_or(published),
                )
            });
        if let Some((published, expires)) = expires
            && until > expires
        {
            let published = match &self.calendar {
                Some(calendar) => calendar.local(published),
                None => published.to_string(),
            };
            return Hold::Expired {
                guard,
                reason: format!(
                    "expired: {reason}, more than safety.max_defer ({}) after it was published at {published}",
                    humantime::format_duration(self.max_defer),
                ),
            };
        }
        Hold::Defer {
            guard,
            delay: delay.max(Duration::from_millis(1)),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::domain::testing::request;
    use crate::safety::CalendarSettings;

    fn guards(now: &str) -> Guards {
        let calendar = Calendar::new(&CalendarSettings {
            timezone: Some("Europe/Stockholm".into()),
            ..CalendarSettings::default()
        })
        .unwrap();
        Guards {
            counting: crate::safety::Counting::none(),
            calendar: Some(calendar),
            max_defer: Duration::from_secs(24 * 3600),
            clock: Clock::Fixed(now.parse().unwrap()),
        }
    }

    #[test]
    fn defers_until_the_opening_and_expires_when_it_opens_too_late() {
        // Sunday 2026-11-22 20:00 UTC; Monday 09:00 CET is 12 hours away.
        let sunday = guards("2026-11-22T20:00:00Z");
        let mut fresh = request("cattle-ab12");
        fresh.published_at = Some(SystemTime::from(
            "2026-11-22T19:00:00Z".parse::<Timestamp>().unwrap(),
        ));
        match sunday.hold(&fresh) {
            Some(Hold::Defer { delay, reason, .. }) => {
                assert_eq!(delay, Duration::from_secs(12 * 3600));
                assert!(
                    reason.starts_with("deferred by calendar: outside Mon–Fri"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let mut stale = fresh.clone();
        stale.published_at = Some(SystemTime::from(
            "2026-11-21T12:00:00Z".parse::<Timestamp>().unwrap(),
        ));
        match sunday.hold(&stale) {
            Some(Hold::Expired { reason, .. }) => {
                assert!(reason.contains("safety.max_defer (1day)"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let monday = guards("2026-11-23T09:00:00Z");
        assert_eq!(monday.hold(&stale), None, "open: allowed, however old");
        assert_eq!(Guards::default().hold(&stale), None, "no calendar");
    }
}
