//! The calendar guard: when restarts may happen, in one IANA time zone.
//!
//! An instant is inside the calendar when it is outside every freeze, its
//! local date is an allowed weekday and not an excluded date, and its local
//! wall-clock time lies in one of the `hours` windows (start inclusive, end
//! exclusive). Defined on the wall clock, so DST falls out: a window that
//! starts in a skipped hour opens when the clock jumps past its start, and
//! a repeated hour is inside a window each time the clock reads it. Pure:
//! the clock is an argument.
//!
//! The calendar's rule and the time arithmetic it rests on (windows,
//! exclusions, freezes, DST) are one piece, past 400 lines; its text
//! parsing is `calendar/text.rs`.

use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, Zoned};
use serde::{Deserialize, Serialize};

use crate::settings::settings;

use super::Verdict;

settings! {
    /// `[safety.calendar]` as written. Unset fields take Chaos Monkey's
    /// defaults: Monday to Friday, 09:00–15:00, UTC.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct CalendarSettings {
        /// Days restarts may happen, `["mon", …]` (unset with a real backend:
        /// Mon–Fri 09:00–15:00 UTC).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub weekdays: Option<Vec<String>> = None,
        /// Time-of-day windows, `["09:00-15:00"]`, to the second, 24:00
        /// allowed.
        ///
        /// `"HH:MM-HH:MM"` or `"HH:MM:SS-HH:MM:SS"`. A window does not wrap
        /// past midnight: write two.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub hours: Option<Vec<String>> = None,
        /// IANA zone the weekdays, hours and dates are read in (default UTC).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub timezone: Option<String> = None,
        /// No restarts on these dates: `"2026-12-24"` once, `"12-25"` yearly.
        pub excluded_dates: Vec<String> = Vec::new(),
        /// `[[safety.calendar.freezes]]` from, to (RFC 3339 or local), name:
        /// no restarts in between, whatever the other rules say.
        pub freezes: Vec<FreezeSettings> = Vec::new(),
    }
}

/// One `[[safety.calendar.freezes]]`: from (inclusive) to (exclusive), each
/// an RFC 3339 timestamp or a local date-time in the calendar's zone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeSettings {
    /// When the freeze begins.
    pub from: String,
    /// When it ends: the calendar may open at this instant.
    pub to: String,
    /// Why, in a word or two: quoted in the reason of a deferral.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Excluded {
    Once(Date),
    Yearly { month: i8, day: i8 },
}

#[derive(Debug, Clone)]
struct Freeze {
    from: Timestamp,
    to: Timestamp,
    name: Option<String>,
}

/// Seconds since local midnight; a window is `[start, end)`, `end <= 86400`.
type Window = (u32, u32);

const DAY: u32 = 86_400;
/// How far past the last freeze to look for an opening: a year covers
/// every weekday and every yearly exclusion.
const HORIZON_DAYS: i64 = 400;

/// A validated calendar.
#[derive(Debug, Clone)]
pub struct Calendar {
    /// Monday first.
    weekdays: [bool; 7],
    windows: Vec<Window>,
    zone: TimeZone,
    zone_name: String,
    excluded: Vec<Excluded>,
    freezes: Vec<Freeze>,
}

impl Calendar {
    /// Validates the settings; the error names the key and says what is
    /// wrong with it.
    pub fn new(settings: &CalendarSettings) -> Result<Self, (String, String)> {
        let key = |k: &str| format!("safety.calendar.{k}");
        let zone_name = settings.timezone.clone().unwrap_or_else(|| "UTC".into());
        let zone = TimeZone::get(&zone_name).map_err(|error| {
            (
                key("timezone"),
                format!("{zone_name:?} is not a known IANA time zone: {error}"),
            )
        })?;
        let mut weekdays = [false; 7];
        match &settings.weekdays {
            None => weekdays[..5].fill(true),
            Some(names) => {
                for (index, name) in names.iter().enumerate() {
                    let day = weekday_index(name).ok_or_else(|| {
                        (
                            format!("{}[{index}]", key("weekdays")),
                            format!("{name:?} is not a weekday (mon, tue, … sun)"),
                        )
                    })?;
                    weekdays[day] = true;
                }
            }
        }
        if !weekdays.contains(&true) {
            return Err((
                key("weekdays"),
                "names no day: the calendar would never open".into(),
            ));
        }
        let mut windows = match &settings.hours {
            None => vec![(9 * 3600, 15 * 3600)],
            Some(hours) => hours
                .iter()
                .enumerate()
                .map(|(index, raw)| {
                    parse_window(raw).map_err(|why| (format!("{}[{index}]", key("hours")), why))
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        if windows.is_empty() {
            return Err((
                key("hours"),
                "names no window: the calendar would never open".into(),
            ));
        }
        windows.sort_unstable();
        let excluded = settings
            .excluded_dates
            .iter()
            .enumerate()
            .map(|(index, raw)| {
                parse_excluded(raw)
                    .map_err(|why| (format!("{}[{index}]", key("excluded_dates")), why))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let freezes = settings
            .freezes
            .iter()
            .enumerate()
            .map(|(index, freeze)| {
                let at = |field: &str, raw: &str| {
                    parse_instant(raw, &zone)
                        .map_err(|why| (format!("{}[{index}].{field}", key("freezes")), why))
                };
                let (from, to) = (at("from", &freeze.from)?, at("to", &freeze.to)?);
                if from >= to {
                    return Err((
                        format!("{}[{index}].to", key("freezes")),
                        "must be after from".into(),
                    ));
                }
                Ok(Freeze {
                    from,
                    to,
                    name: freeze.name.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            weekdays,
            windows,
            zone,
            zone_name,
            excluded,
            freezes,
        })
    }

    /// Chaos Monkey's: Monday to Friday, 09:00–15:00, UTC.
    pub fn chaos_monkey() -> Self {
        // The defaults are valid by construction.
        Self::new(&CalendarSettings::default()).expect("the default calendar is valid")
    }

    /// Whether a restart may happen at `now`.
    pub fn allows(&self, now: Timestamp) -> bool {
        self.closed_because(now).is_none()
    }

    /// `Allow` inside the calendar; otherwise `Defer` until the next instant
    /// it opens, with the reason in plain words.
    pub fn verdict(&self, now: Timestamp) -> Verdict {
        let Some(why) = self.closed_because(now) else {
            return Verdict::Allow;
        };
        match self.next_opening(now) {
            Some(until) => Verdict::Defer {
                until,
                reason: format!(
                    "deferred by calendar: {why}; next window opens {}",
                    self.local(until)
                ),
            },
            // Only when excluded dates cover every allowed day of a year.
            None => Verdict::Defer {
                until: now + jiff::SignedDuration::from_hours(24),
                reason: format!("deferred by calendar: {why}; no window opens within a year"),
            },
        }
    }

    /// Whether it is open at `now`, in words, as `mandrill status` and the
    /// dashboard say it: "open now", or "closed; next window opens …".
    pub fn now_in_words(&self, now: Timestamp) -> String {
        match self.verdict(now) {
            Verdict::Allow => "open now".to_owned(),
            Verdict::Defer { until, .. } => {
                format!("closed; next window opens {}", self.local(until))
            }
        }
    }

    /// The calendar in a few words: "Mon–Fri 09:00–15:00 Europe/Stockholm".
    pub fn describe(&self) -> String {
        let windows: Vec<String> = self
            .windows
            .iter()
            .map(|&(start, end)| format!("{}–{}", clock(start), clock(end)))
            .collect();
        format!(
            "{} {} {}",
            describe_weekdays(&self.weekdays),
            windows.join(", "),
            self.zone_name
        )
    }

    /// An instant as the calendar's zone reads it: "2026-11-23 09:00 CET".
    pub fn local(&self, instant: Timestamp) -> String {
        let zoned = instant.to_zoned(self.zone.clone());
        let format = if zoned.second() == 0 {
            "%Y-%m-%d %H:%M %Z"
        } else {
            "%Y-%m-%d %H:%M:%S %Z"
        };
        zoned.strftime(format).to_string()
    }

    fn closed_because(&self, now: Timestamp) -> Option<String> {
        if let Some(freeze) = self.freezes.iter().find(|f| f.from <= now && now < f.to) {
            let name = freeze
                .name
                .as_deref()
                .map_or_else(String::new, |name| format!(" ({name})"));
            return Some(format!(
                "frozen{name} from {} to {}",
                self.local(freeze.from),
                self.local(freeze.to)
            ));
        }
        let zoned = now.to_zoned(self.zone.clone());
        if let Some(excluded) = self.excluded_on(zoned.date()) {
            return Some(format!(
                "{} is an excluded date ({})",
                zoned.date(),
                excluded
            ));
        }
        if self.weekdays[weekday_of(&zoned)] && self.in_window(seconds_of_day(&zoned)) {
            return None;
        }
        Some(format!("outside {}", self.describe()))
    }

    fn in_window(&self, second: u32) -> bool {
        self.windows
            .iter()
            .any(|&(start, end)| start <= second && second < end)
    }

    fn excluded_on(&self, date: Date) -> Option<String> {
        self.excluded.iter().find_map(|excluded| match *excluded {
            Excluded::Once(day) if day == date => Some(day.to_string()),
            Excluded::Yearly { month, day } if date.month() == month && date.day() == day => {
                Some(format!("every {month:02}-{day:02}"))
            }
            _ => None,
        })
    }

    /// The first allowed instant after `now`. Being allowed can only begin
    /// where the wall clock reaches a window's start (once, or twice in a
    /// repeated hour), where it jumps (a DST transition: a window starting
    /// in a skipped hour opens there), or where a freeze ends; so those are
    /// the only candidates, tried day by day in order.
    fn next_opening(&self, now: Timestamp) -> Option<Timestamp> {
        let last = self
            .freezes
            .iter()
            .map(|f| f.to)
            .max()
            .unwrap_or(now)
            .max(now);
        let horizon = last
            .to_zoned(self.zone.clone())
            .date()
            .checked_add(jiff::Span::new().days(HORIZON_DAYS))
            .ok()?;
        let mut date = now.to_zoned(self.zone.clone()).date();
        while date <= horizon {
            let start = self.day_start(date)?;
            let next_date = date.tomorrow().ok()?;
            let end = self.day_start(next_date)?;
            let mut candidates: Vec<Timestamp> = Vec::new();
            if self.weekdays[date.weekday().to_monday_zero_offset() as usize]
                && self.excluded_on(date).is_none()
            {
                for &(window_start, _) in &self.windows {
                    let local = date.to_datetime(time_of(window_start));
                    candidates.extend(self.occurrences(local));
                }
            }
            candidates.extend(
                self.zone
                    .following(start - jiff::SignedDuration::from_nanos(1))
                    .map(|transition| transition.timestamp())
                    .take_while(|&at| at < end),
            );
            candidates.extend(
                self.freezes
                    .iter()
                    .map(|f| f.to)
                    .filter(|&to| start <= to && to < end),
            );
            candidates.sort_unstable();
            if let Some(open) = candidates
                .into_iter()
                .find(|&at| at > now && self.allows(at))
            {
                return Some(open);
            }
            date = next_date;
        }
        None
    }

    /// The instants at which the wall clock reads `local`: none in a skipped
    /// hour, two in a repeated one.
    fn occurrences(&self, local: DateTime) -> Vec<Timestamp> {
        let ambiguous = self.zone.to_ambiguous_timestamp(local);
        let offsets = match ambiguous.offset() {
            AmbiguousOffset::Unambiguous { offset } => vec![offset],
            AmbiguousOffset::Gap { .. } => vec![],
            AmbiguousOffset::Fold { before, after } => vec![before, after],
        };
        offsets
            .into_iter()
            .filter_map(|offset| offset.to_timestamp(local).ok())
            .collect()
    }

    /// The instant by which the calendar has been open for `open` since
    /// `from`: closed time does not count. What `safety.max_defer` is
    /// measured in, so that a request published while the calendar is
    /// closed waits for it rather than expiring unseen. `None` when the
    /// calendar never opens again within its horizon (refused at start-up,
    /// [`Self::never_opens_after`]).
    pub fn after_open_time(
        &self,
        from: Timestamp,
        open: jiff::SignedDuration,
    ) -> Option<Timestamp> {
        let mut at = from;
        let mut left = open;
        loop {
            if !self.allows(at) {
                at = self.next_opening(at)?;
            }
            let end = at.saturating_add(left).ok()?;
            match self.next_closing(at, end) {
                Some(close) if close < end => {
                    left -= close.duration_since(at);
                    at = close;
                }
                _ => return Some(end),
            }
        }
    }

    /// The first instant at or after `now` at which the calendar is open.
    pub fn next_open(&self, now: Timestamp) -> Option<Timestamp> {
        if self.allows(now) {
            Some(now)
        } else {
            self.next_opening(now)
        }
    }

    /// Whether the calendar is open at `now`, and when that changes, in
    /// words: "open now (…) until …" or "closed now (…); next opens …".
    /// What start-up logs and `publish` warns with.
    pub fn outlook(&self, now: Timestamp) -> (bool, String) {
        match self.closed_because(now) {
            None => {
                let horizon = now
                    .saturating_add(jiff::SignedDuration::from_hours(24 * HORIZON_DAYS))
                    .unwrap_or(now);
                let until = self.next_closing(now, horizon).map_or_else(
                    || "for a year at least".to_owned(),
                    |t| format!("until {}", self.local(t)),
                );
                (true, format!("open now ({}) {until}", self.describe()))
            }
            Some(why) => {
                let opens = self.next_opening(now).map_or_else(
                    || "never opens within a year".to_owned(),
                    |t| format!("next opens {}", self.local(t)),
                );
                (false, format!("closed now ({why}); {opens}"))
            }
        }
    }

    /// Why the calendar is refused: it is closed at `now` and never opens
    /// within a year after its last freeze (excluded dates cover every
    /// allowed day). A request could then wait for ever, since closed time
    /// does not count against `safety.max_defer`.
    pub fn never_opens_after(&self, now: Timestamp) -> Option<String> {
        (!self.allows(now) && self.next_opening(now).is_none()).then(|| {
            format!(
                "{} never opens within a year (every allowed day is excluded): a request would \
                 wait for ever",
                self.describe()
            )
        })
    }

    /// The spans `[open, close)` in which the calendar allows restarts,
    /// between `from` and `until`, in order; the first and last cut to
    /// them. What the scheduler measures open time with.
    pub fn open_spans(&self, from: Timestamp, until: Timestamp) -> Vec<(Timestamp, Timestamp)> {
        let mut spans = Vec::new();
        let mut at = from;
        while at < until {
            if self.allows(at) {
                let close = self.next_closing(at, until).unwrap_or(until).min(until);
                spans.push((at, close));
                at = close;
            } else {
                match self.next_opening(at) {
                    Some(open) => at = open,
                    None => break,
                }
            }
        }
        spans
    }

    /// The first instant after `now`, before `until`, at which the calendar
    /// no longer allows restarts; `None` if it stays open until then.
    /// Being allowed can only end where the wall clock reaches a window's
    /// end, where the date changes (midnight, or a DST jump across it),
    /// where the clock jumps, or where a freeze begins: the same candidates
    /// as [`Self::next_opening`], mirrored.
    fn next_closing(&self, now: Timestamp, until: Timestamp) -> Option<Timestamp> {
        let last = until.to_zoned(self.zone.clone()).date();
        let mut date = now.to_zoned(self.zone.clone()).date();
        while date <= last {
            let start = self.day_start(date)?;
            let next_date = date.tomorrow().ok()?;
            let end = self.day_start(next_date)?;
            let mut candidates: Vec<Timestamp> = vec![end];
            for &(_, window_end) in &self.windows {
                if window_end < DAY {
                    let local = date.to_datetime(time_of(window_end));
                    candidates.extend(self.occurrences(local));
                }
            }
            candidates.extend(
                self.zone
                    .following(start - jiff::SignedDuration::from_nanos(1))
                    .map(|transition| transition.timestamp())
                    .take_while(|&at| at < end),
            );
            candidates.extend(
                self.freezes
                    .iter()
                    .map(|f| f.from)
                    .filter(|&from| start <= from && from < end),
            );
            candidates.sort_unstable();
            if let Some(close) = candidates
                .into_iter()
                .find(|&at| at > now && !self.allows(at))
            {
                return Some(close);
            }
            date = next_date;
        }
        None
    }

    fn day_start(&self, date: Date) -> Option<Timestamp> {
        date.to_zoned(self.zone.clone()).ok().map(|z| z.timestamp())
    }
}
mod text;

use text::*;

#[cfg(test)]
mod tests;
