//! The guards that may defer a request, and the clock they read: what the
//! worker asks after eligibility and before the reservation, and again
//! right before the restart; and the one rule for when a deferred request
//! expires (`safety.max_defer` of open calendar time) and how long a
//! deferral is nacked for (`safety.recheck`).
//!
//! Deferral and expiry are one rule with its timelines tested beside it,
//! so one file past 400 lines.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::{Calendar, Counting, Verdict};
use crate::domain::RestartRequest;

/// Wall-clock time for the guards. Injected so that tests read tokio's
/// (paused) clock instead of the system's.
#[derive(Debug, Clone, Default)]
pub(crate) enum Clock {
    /// The system clock.
    #[default]
    System,
    /// Always this instant.
    #[cfg(test)]
    Fixed(Timestamp),
    /// `origin` at the moment of creation, then advancing with tokio's
    /// clock: paused in tests, so a test moves the calendar's time.
    #[cfg(test)]
    Following {
        /// The wall-clock time at `since`.
        origin: Timestamp,
        /// When this clock was made.
        since: tokio::time::Instant,
        /// Milliseconds the wall clock jumped ahead of tokio's since
        /// (see [`Clock::jump`]), shared by every copy.
        jumped: std::sync::Arc<std::sync::atomic::AtomicI64>,
    },
}

impl Clock {
    /// A clock reading `origin` now and advancing with tokio's time.
    #[cfg(test)]
    pub(crate) fn following_tokio(origin: Timestamp) -> Self {
        Self::Following {
            origin,
            since: tokio::time::Instant::now(),
            jumped: std::sync::Arc::default(),
        }
    }

    /// Moves a following clock, and every copy of it, `by` ahead of
    /// tokio's: the wall clock of a machine that was suspended, whose
    /// monotonic clock did not advance meanwhile.
    #[cfg(test)]
    pub(crate) fn jump(&self, by: SignedDuration) {
        if let Self::Following { jumped, .. } = self {
            let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
            jumped.fetch_add(by, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// The current time.
    pub(crate) fn now(&self) -> Timestamp {
        match self {
            Self::System => Timestamp::now(),
            #[cfg(test)]
            Self::Fixed(at) => *at,
            #[cfg(test)]
            Self::Following {
                origin,
                since,
                jumped,
            } => {
                let elapsed = SignedDuration::try_from(since.elapsed())
                    .unwrap_or(SignedDuration::MAX)
                    .saturating_add(SignedDuration::from_millis(
                        jumped.load(std::sync::atomic::Ordering::SeqCst),
                    ));
                origin.saturating_add(elapsed).unwrap_or(*origin)
            }
        }
    }
}

/// How far ahead of the guards' clock a request's `published_at` may be and
/// still date it. Publishers' clocks drift by seconds; a time minutes ahead
/// is wrong or forged, and trusted it would keep the request from ever
/// expiring (`safety.max_defer` counted from the future). Such a request is
/// dated by its first receipt instead, as one without `published_at` is.
pub(crate) const MAX_PUBLISHED_AHEAD: Duration = Duration::from_secs(5 * 60);

/// What `safety.max_defer` is counted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Since {
    /// The request's own `published_at`, within [`MAX_PUBLISHED_AHEAD`].
    Published(Timestamp),
    /// When the store first received it: its `published_at` is missing or
    /// too far ahead.
    FirstReceived(Timestamp),
}

/// What the deferring guards decide about a request right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hold {
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
#[derive(Debug, Clone)]
pub(crate) struct Guards {
    /// `None`: restarts at any time.
    pub calendar: Option<Calendar>,
    /// Groups, rate limits, host cooldown and the disruption budget.
    pub counting: Counting,
    /// How much open calendar time after it was published a request may
    /// still be deferred (all time is open without a calendar).
    pub max_defer: Duration,
    /// The longest a deferred delivery is nacked for, whatever its guard
    /// waits for: what a reload, a `resume` or a slot freed early is acted
    /// on within (`safety.recheck`).
    pub recheck: Duration,
    /// The time the guards read.
    pub clock: Clock,
}

/// `safety.recheck`'s default: a reload or a `resume` reaches a deferred
/// request within five minutes, and a request waiting out a weekend is
/// redelivered (one deferral recorded) twelve times an hour.
pub(crate) const DEFAULT_RECHECK: Duration = Duration::from_secs(5 * 60);

impl Default for Guards {
    /// No calendar, no counting guards, and `safety.max_defer`'s default
    /// (a day): every request can be deferred and still be dated, so a
    /// zero here would expire each one at its first deferral.
    fn default() -> Self {
        Self {
            calendar: None,
            counting: Counting::default(),
            max_defer: Duration::from_secs(24 * 3600),
            recheck: DEFAULT_RECHECK,
            clock: Clock::default(),
        }
    }
}

impl Guards {
    /// `None` when every deferring guard allows the request now: first the
    /// request's own `not_before` (it can only delay), then the calendar.
    pub(crate) fn hold(&self, request: &RestartRequest) -> Option<Hold> {
        // The clock is read only when a guard needs it: most requests name
        // no `not_before` and most services keep no calendar, and a read of
        // the wall clock per message was a measurable share of the hot path.
        if request.not_before.is_none() && self.calendar.is_none() {
            return None;
        }
        let now = self.clock.now();
        if let Some(not_before) = request.not_before.and_then(|t| Timestamp::try_from(t).ok())
            && not_before > now
        {
            let delay = Duration::try_from(not_before.duration_since(now)).unwrap_or_default();
            let shown = match &self.calendar {
                Some(calendar) => calendar.local(not_before),
                None => not_before.to_string(),
            };
            let reason = format!(
                "deferred by not_before: its publisher asked for no restart before {shown}"
            );
            return Some(self.defer(request, "not_before", delay, reason));
        }
        let calendar = self.calendar.as_ref()?;
        let Verdict::Defer { until, reason } = calendar.verdict(now) else {
            return None;
        };
        let delay = Duration::try_from(until.duration_since(now)).unwrap_or_default();
        Some(self.defer(request, "calendar", delay, reason))
    }

    /// When the request's own `published_at` dates it: set, and no more
    /// than [`MAX_PUBLISHED_AHEAD`] ahead of the clock.
    pub(crate) fn published(&self, request: &RestartRequest) -> Option<Timestamp> {
        let published = Timestamp::try_from(request.published_at?).ok()?;
        let ahead = SignedDuration::try_from(MAX_PUBLISHED_AHEAD).unwrap_or(SignedDuration::MAX);
        let latest = self.clock.now().saturating_add(ahead).ok()?;
        (published <= latest).then_some(published)
    }

    /// A deferral by `guard` for `delay`, or the request's expiry if it
    /// would still wait past `safety.max_defer` after it was published.
    ///
    /// A request its `published_at` cannot date ([`Guards::published`]) is
    /// deferred here: whoever settles the deferral judges its expiry from
    /// its first receipt, which only the store knows
    /// ([`Guards::defer_since`]).
    pub(crate) fn defer(
        &self,
        request: &RestartRequest,
        guard: &'static str,
        delay: Duration,
        reason: String,
    ) -> Hold {
        match self.published(request) {
            Some(published) => self.defer_since(Since::Published(published), guard, delay, reason),
            None => Hold::Defer {
                guard,
                delay: delay.max(Duration::from_millis(1)),
                reason,
            },
        }
    }

    /// A deferral by `guard` for `delay`, or the request's expiry if it
    /// would still wait past `safety.max_defer` after `since`.
    pub(crate) fn defer_since(
        &self,
        since: Since,
        guard: &'static str,
        delay: Duration,
        reason: String,
    ) -> Hold {
        let now = self.clock.now();
        let until = now
            .saturating_add(SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX))
            .unwrap_or(now);
        let (origin, what, why) = match since {
            Since::Published(at) => (at, "it was published", ""),
            Since::FirstReceived(at) => (
                at,
                "it was first received",
                " (its published_at is missing or ahead of the clock)",
            ),
        };
        // Open time is never more than the time that passed: a deferral
        // within `max_defer` of the wall clock needs no walk of the calendar.
        let max_defer = SignedDuration::try_from(self.max_defer).unwrap_or(SignedDuration::MAX);
        let within_wall = until <= origin.saturating_add(max_defer).unwrap_or(Timestamp::MAX);
        if !within_wall && until > self.expires_at(origin) {
            let (origin, open) = match &self.calendar {
                Some(calendar) => (calendar.local(origin), " of open calendar time"),
                None => (origin.to_string(), ""),
            };
            return Hold::Expired {
                guard,
                reason: format!(
                    "expired: {reason}, more than safety.max_defer ({}){open} after {what} at \
                     {origin}{why}",
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

impl Guards {
    /// The one expiry rule: a request dated `origin` expires once the
    /// calendar has been open for `safety.max_defer` since then; closed
    /// time does not count, so a request published on a Saturday waits for
    /// Monday's opening and then has `max_defer` of open time. Without a
    /// calendar all time is open. A calendar that never opens again is
    /// refused at start-up and on reload, so this is always a bound; for
    /// one that does not open within its horizon all the same, the wall
    /// clock's `max_defer` is (a request never waits for ever).
    pub(crate) fn expires_at(&self, origin: Timestamp) -> Timestamp {
        let max_defer = SignedDuration::try_from(self.max_defer).unwrap_or(SignedDuration::MAX);
        let wall = origin.saturating_add(max_defer).unwrap_or(Timestamp::MAX);
        match &self.calendar {
            None => wall,
            Some(calendar) => calendar.after_open_time(origin, max_defer).unwrap_or(wall),
        }
    }

    /// How long a deferral by `delay` is nacked for: never more than
    /// `safety.recheck`, so that what changed meanwhile (a reload, a
    /// `resume`, a slot freed early) is seen at the next delivery.
    pub(crate) fn nack_delay(&self, delay: Duration) -> Duration {
        delay
            .min(self.recheck.max(Duration::from_millis(1)))
            .max(Duration::from_millis(1))
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
            recheck: DEFAULT_RECHECK,
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
        // Published on Friday at 13:00 CET, two hours before the close: it
        // has used two hours of its day of open time, and still waits.
        let mut friday = fresh.clone();
        friday.published_at = Some(SystemTime::from(
            "2026-11-20T12:00:00Z".parse::<Timestamp>().unwrap(),
        ));
        assert!(matches!(sunday.hold(&friday), Some(Hold::Defer { .. })));
        // Published on the Monday before: Mon to Thu were open 24 hours.
        let mut stale = fresh.clone();
        stale.published_at = Some(SystemTime::from(
            "2026-11-16T12:00:00Z".parse::<Timestamp>().unwrap(),
        ));
        match sunday.hold(&stale) {
            Some(Hold::Expired { reason, .. }) => {
                assert!(
                    reason.contains("safety.max_defer (1day) of open calendar time"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let monday = guards("2026-11-23T09:00:00Z");
        assert_eq!(monday.hold(&stale), None, "open: allowed, however old");
        assert_eq!(Guards::default().hold(&stale), None, "no calendar");
    }

    /// Issue 37's trap: with Mon–Fri 09:00–15:00 and a day's `max_defer`,
    /// a request published on Saturday was recorded expired before the
    /// calendar ever opened. Closed time does not count: it waits for
    /// Monday, and expires only once the calendar has been open a day
    /// (Thursday's close), never before.
    #[test]
    fn a_request_published_while_closed_waits_for_the_opening_and_has_max_defer_of_open_time() {
        let calendar = Calendar::chaos_monkey();
        let at = |time: &str| time.parse::<Timestamp>().unwrap();
        let saturday = Guards {
            calendar: Some(calendar),
            max_defer: Duration::from_secs(24 * 3600),
            clock: Clock::Fixed(at("2026-11-28T10:00:00Z")),
            ..Guards::default()
        };
        let mut request = request("cattle-ab12");
        request.published_at = Some(SystemTime::from(at("2026-11-28T10:00:00Z")));
        match saturday.hold(&request) {
            Some(Hold::Defer { delay, guard, .. }) => {
                assert_eq!(guard, "calendar");
                assert_eq!(delay, Duration::from_secs(47 * 3600), "until Monday 09:00");
            }
            other => panic!("expected to wait for Monday: {other:?}"),
        }
        assert_eq!(
            saturday.expires_at(at("2026-11-28T10:00:00Z")),
            at("2026-12-03T15:00:00Z"),
            "Mon, Tue, Wed and Thu open six hours each"
        );
        // Published inside the calendar: its open time starts at once.
        assert_eq!(
            saturday.expires_at(at("2026-11-30T14:00:00Z")),
            at("2026-12-04T14:00:00Z")
        );
        // Without a calendar all time is open.
        let always = Guards {
            calendar: None,
            ..saturday.clone()
        };
        assert_eq!(
            always.expires_at(at("2026-11-28T10:00:00Z")),
            at("2026-11-29T10:00:00Z")
        );
        // A rate limit's wait inside the calendar still expires it once
        // its open time is spent: Thursday 14:00, waiting two hours.
        let thursday = Guards {
            clock: Clock::Fixed(at("2026-12-03T14:00:00Z")),
            ..saturday.clone()
        };
        assert!(matches!(
            thursday.defer(
                &request,
                "rate limit",
                Duration::from_secs(2 * 3600),
                "r".into()
            ),
            Hold::Expired {
                guard: "rate limit",
                ..
            }
        ));
        assert!(matches!(
            thursday.defer(
                &request,
                "rate limit",
                Duration::from_secs(3600),
                "r".into()
            ),
            Hold::Defer { .. }
        ));
    }

    /// A deferral is nacked for at most `safety.recheck`, so that a reload
    /// or a `resume` reaches it; the hold still says how long its guard
    /// waits (and is judged for expiry on that).
    #[test]
    fn a_deferral_is_nacked_for_at_most_the_recheck_interval() {
        let guards = Guards {
            recheck: Duration::from_secs(300),
            ..Guards::default()
        };
        assert_eq!(
            guards.nack_delay(Duration::from_secs(86_362)),
            Duration::from_secs(300)
        );
        assert_eq!(
            guards.nack_delay(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(guards.nack_delay(Duration::ZERO), Duration::from_millis(1));
    }

    /// A request's `not_before` defers it until then (before the calendar
    /// is asked), expires it if that is past `safety.max_defer`, and is
    /// nothing once passed.
    #[test]
    fn not_before_only_delays() {
        let open = Guards {
            calendar: None,
            ..guards("2026-11-23T10:00:00Z")
        };
        let at = |time: &str| SystemTime::from(time.parse::<Timestamp>().unwrap());
        let mut later = request("cattle-ab12");
        later.published_at = Some(at("2026-11-23T10:00:00Z"));
        later.not_before = Some(at("2026-11-23T10:30:00Z"));
        match open.hold(&later) {
            Some(Hold::Defer {
                guard,
                delay,
                reason,
            }) => {
                assert_eq!((guard, delay), ("not_before", Duration::from_secs(1800)));
                assert!(reason.starts_with("deferred by not_before"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        later.not_before = Some(at("2026-11-25T10:00:00Z"));
        assert!(matches!(
            open.hold(&later),
            Some(Hold::Expired {
                guard: "not_before",
                ..
            })
        ));
        later.not_before = Some(at("2026-11-23T09:00:00Z"));
        assert_eq!(open.hold(&later), None, "passed: no guard at all");
        // Passed, the calendar still decides: Sunday evening is closed.
        let sunday = guards("2026-11-22T20:00:00Z");
        later.published_at = Some(at("2026-11-22T19:00:00Z"));
        later.not_before = Some(at("2026-11-22T19:30:00Z"));
        assert!(matches!(
            sunday.hold(&later),
            Some(Hold::Defer {
                guard: "calendar",
                ..
            })
        ));
    }

    /// A `published_at` dates a request unless it is missing or more than
    /// `MAX_PUBLISHED_AHEAD` ahead of the clock (a drifting publisher is
    /// trusted, a forged future is not).
    #[test]
    fn published_at_dates_a_request_only_within_the_bound_ahead() {
        let sunday = guards("2026-11-22T20:00:00Z");
        let at = |time: &str| {
            let mut dated = request("cattle-ab12");
            dated.published_at = Some(SystemTime::from(time.parse::<Timestamp>().unwrap()));
            dated
        };
        let drifting = at("2026-11-22T20:04:59Z");
        assert!(sunday.published(&drifting).is_some());
        assert_eq!(sunday.published(&at("2026-11-22T20:05:01Z")), None);
        assert_eq!(sunday.published(&at("2099-01-01T00:00:00Z")), None);
        assert_eq!(sunday.published(&request("cattle-ab12")), None);
        // Undated: deferred, its expiry left to its first receipt.
        assert!(matches!(
            sunday.hold(&at("2099-01-01T00:00:00Z")),
            Some(Hold::Defer { .. })
        ));
        match sunday.defer_since(
            Since::FirstReceived("2026-11-16T12:00:00Z".parse().unwrap()),
            "calendar",
            Duration::from_secs(13 * 3600),
            "deferred by calendar".into(),
        ) {
            Hold::Expired { reason, .. } => {
                assert!(
                    reason.contains("after it was first received at"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
