use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;

fn calendar(weekdays: &[&str], hours: &[&str], zone: &str) -> Calendar {
    Calendar::new(&CalendarSettings {
        weekdays: Some(weekdays.iter().map(|d| (*d).to_owned()).collect()),
        hours: Some(hours.iter().map(|h| (*h).to_owned()).collect()),
        timezone: Some(zone.to_owned()),
        ..CalendarSettings::default()
    })
    .unwrap()
}

fn at(rfc3339: &str) -> Timestamp {
    rfc3339.parse().unwrap()
}

fn until(verdict: Verdict) -> (Timestamp, String) {
    match verdict {
        Verdict::Defer { until, reason } => (until, reason),
        Verdict::Allow => panic!("expected a deferral"),
    }
}

const WORKDAYS: &[&str] = &["mon", "tue", "wed", "thu", "fri"];

#[test]
fn the_second_before_a_window_defers_to_its_start_and_the_start_is_allowed() {
    let stockholm = calendar(WORKDAYS, &["09:00-15:00"], "Europe/Stockholm");
    // Friday 2026-11-20 14:59:59 CET is inside; 15:00:00 is not.
    assert_eq!(
        stockholm.verdict(at("2026-11-20T13:59:59Z")),
        Verdict::Allow
    );
    let (open, reason) = until(stockholm.verdict(at("2026-11-20T14:00:00Z")));
    assert_eq!(open, at("2026-11-23T08:00:00Z"), "Monday 09:00 CET");
    assert_eq!(
        reason,
        "deferred by calendar: outside Mon–Fri 09:00–15:00 Europe/Stockholm; \
         next window opens 2026-11-23 09:00 CET"
    );
    // Monday 08:59:59 defers by one second; 09:00:00 is allowed.
    let (open, _) = until(stockholm.verdict(at("2026-11-23T07:59:59Z")));
    assert_eq!(open, at("2026-11-23T08:00:00Z"));
    assert_eq!(
        stockholm.verdict(at("2026-11-23T08:00:00Z")),
        Verdict::Allow
    );
}

#[test]
fn windows_are_to_the_second_and_all_day_covers_midnight() {
    let precise = calendar(WORKDAYS, &["09:00:30-15:00:00"], "UTC");
    assert!(!precise.allows(at("2026-11-23T09:00:29Z")));
    assert!(precise.allows(at("2026-11-23T09:00:30Z")));
    let (open, reason) = until(precise.verdict(at("2026-11-23T09:00:00Z")));
    assert_eq!(open, at("2026-11-23T09:00:30Z"));
    assert!(
        reason.ends_with("opens 2026-11-23 09:00:30 UTC"),
        "{reason}"
    );

    let always = calendar(&["mon", "tue"], &["00:00-24:00"], "UTC");
    assert!(always.allows(at("2026-11-23T00:00:00Z")));
    assert!(always.allows(at("2026-11-24T23:59:59Z")));
    let (open, _) = until(always.verdict(at("2026-11-25T00:00:00Z")));
    assert_eq!(open, at("2026-11-30T00:00:00Z"));
    assert_eq!(always.describe(), "Mon, Tue 00:00–24:00 UTC");
}

#[test]
fn the_default_is_chaos_monkeys_weekdays_in_utc() {
    let default = Calendar::chaos_monkey();
    assert_eq!(default.describe(), "Mon–Fri 09:00–15:00 UTC");
    assert!(default.allows(at("2026-11-23T09:00:00Z")));
    assert!(!default.allows(at("2026-11-22T12:00:00Z")), "a Sunday");
}

#[test]
fn excluded_dates_fixed_and_yearly_and_freezes_close_the_calendar() {
    let settings = CalendarSettings {
        timezone: Some("Europe/Stockholm".into()),
        excluded_dates: vec!["2026-12-24".into(), "12-25".into()],
        freezes: vec![FreezeSettings {
            from: "2026-12-28T00:00".into(),
            to: "2027-01-05T12:00".into(),
            name: Some("year-end".into()),
        }],
        ..CalendarSettings::default()
    };
    let holidays = Calendar::new(&settings).unwrap();
    let (open, reason) = until(holidays.verdict(at("2026-12-24T10:00:00Z")));
    assert!(
        reason.contains("2026-12-24 is an excluded date"),
        "{reason}"
    );
    // The 25th is yearly, so Friday 2027-12-25 is closed too; in 2026 the
    // next opening after the 24th is past the weekend and into the freeze:
    // Monday 28th is frozen, so the freeze's end, Tuesday 5 Jan 12:00.
    assert_eq!(open, at("2027-01-05T11:00:00Z"));
    assert!(!holidays.allows(at("2031-12-25T10:00:00Z")), "yearly");
    let (_, reason) = until(holidays.verdict(at("2026-12-30T10:00:00Z")));
    assert!(
        reason.starts_with(
            "deferred by calendar: frozen (year-end) from 2026-12-28 00:00 CET to 2027-01-05 12:00 CET"
        ),
        "{reason}"
    );
}

#[test]
fn a_window_starting_in_the_skipped_hour_opens_when_the_clock_jumps() {
    // Europe/Stockholm, Sunday 2026-03-29: 02:00 CET jumps to 03:00 CEST
    // (01:00 UTC).
    let night = calendar(&["sun"], &["02:30-04:00"], "Europe/Stockholm");
    let (open, reason) = until(night.verdict(at("2026-03-29T00:59:59Z")));
    assert_eq!(open, at("2026-03-29T01:00:00Z"));
    assert!(reason.ends_with("opens 2026-03-29 03:00 CEST"), "{reason}");
    assert!(night.allows(at("2026-03-29T01:00:00Z")));
    // America/New_York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    let new_york = calendar(&["sun"], &["02:15-02:45"], "America/New_York");
    let (open, _) = until(new_york.verdict(at("2026-03-08T06:00:00Z")));
    // The whole window is skipped that day: next Sunday 02:15 EDT.
    assert_eq!(open, at("2026-03-15T06:15:00Z"));
}

#[test]
fn a_repeated_hour_is_inside_a_window_each_time_the_clock_reads_it() {
    // America/New_York, 2026-11-01: 02:00 EDT falls back to 01:00 EST
    // (06:00 UTC); 01:00–02:00 local happens twice.
    let new_york = calendar(&["sun"], &["01:30-02:00"], "America/New_York");
    let first = at("2026-11-01T05:30:00Z"); // 01:30 EDT
    assert!(new_york.allows(first));
    assert!(!new_york.allows(at("2026-11-01T06:00:00Z")), "01:00 EST");
    let (open, reason) = until(new_york.verdict(at("2026-11-01T06:29:59Z")));
    assert_eq!(open, at("2026-11-01T06:30:00Z"), "01:30 EST");
    assert!(reason.ends_with("opens 2026-11-01 01:30 EST"), "{reason}");
    // Europe/Stockholm, 2026-10-25: 03:00 CEST falls back to 02:00 CET
    // (01:00 UTC). A window ending at 02:30 reopens when the clock goes back.
    let stockholm = calendar(&["sun"], &["00:00-02:30"], "Europe/Stockholm");
    let (open, _) = until(stockholm.verdict(at("2026-10-25T00:45:00Z")));
    assert_eq!(open, at("2026-10-25T01:00:00Z"), "02:00 CET again");
}

#[test]
fn invalid_settings_name_the_key() {
    let bad = |settings: CalendarSettings| Calendar::new(&settings).unwrap_err().0;
    let hours = |h: &str| CalendarSettings {
        hours: Some(vec![h.into()]),
        ..CalendarSettings::default()
    };
    assert_eq!(bad(hours("15:00-09:00")), "safety.calendar.hours[0]");
    assert_eq!(bad(hours("9-15")), "safety.calendar.hours[0]");
    assert_eq!(bad(hours("09:00-24:01")), "safety.calendar.hours[0]");
    assert_eq!(
        bad(CalendarSettings {
            timezone: Some("Mars/Olympus".into()),
            ..CalendarSettings::default()
        }),
        "safety.calendar.timezone"
    );
    assert_eq!(
        bad(CalendarSettings {
            weekdays: Some(vec!["mon".into(), "funday".into()]),
            ..CalendarSettings::default()
        }),
        "safety.calendar.weekdays[1]"
    );
    assert_eq!(
        bad(CalendarSettings {
            excluded_dates: vec!["13-01".into()],
            ..CalendarSettings::default()
        }),
        "safety.calendar.excluded_dates[0]"
    );
}

const ZONES: &[&str] = &[
    "UTC",
    "Europe/Stockholm",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Santiago",
    "Pacific/Chatham",
];

fn arbitrary_calendar() -> impl Strategy<Value = Calendar> {
    let window = (0u32..DAY, 1u32..(6 * 3600)).prop_map(|(start, length)| {
        let end = (start + length).min(DAY);
        format!("{}-{}", clock_long(start), clock_long(end))
    });
    (
        prop::sample::select(ZONES),
        prop::collection::vec(any::<bool>(), 7),
        prop::collection::vec(window, 1..3),
    )
        .prop_filter_map("at least one weekday", |(zone, days, hours)| {
            let weekdays: Vec<String> = (0..7)
                .filter(|&d| days[d])
                .map(|d| WEEKDAYS[d].to_owned())
                .collect();
            (!weekdays.is_empty()).then(|| {
                Calendar::new(&CalendarSettings {
                    weekdays: Some(weekdays),
                    hours: Some(hours),
                    timezone: Some(zone.to_owned()),
                    ..CalendarSettings::default()
                })
                .unwrap()
            })
        })
}

fn clock_long(second: u32) -> String {
    format!(
        "{:02}:{:02}:{:02}",
        second / 3600,
        second / 60 % 60,
        second % 60
    )
}

/// Whether the wall clock of `instant` is inside, computed without the
/// calendar's own code path.
fn inside(calendar: &Calendar, instant: Timestamp) -> bool {
    let zoned = instant.to_zoned(calendar.zone.clone());
    let day = zoned.weekday().to_monday_zero_offset() as usize;
    let second = u32::from(zoned.hour().unsigned_abs()) * 3600
        + u32::from(zoned.minute().unsigned_abs()) * 60
        + u32::from(zoned.second().unsigned_abs());
    calendar.weekdays[day]
        && calendar
            .windows
            .iter()
            .any(|&(start, end)| start <= second && second < end)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn allow_iff_inside_and_defer_until_the_first_allowed_instant(
        calendar in arbitrary_calendar(),
        // 2000-01-01 to 2040-01-01, where the zones have DST rules.
        second in 946_684_800i64..2_208_988_800i64,
        step in 60i64..1800,
    ) {
        let now = Timestamp::from_second(second).unwrap();
        match calendar.verdict(now) {
            Verdict::Allow => prop_assert!(inside(&calendar, now)),
            Verdict::Defer { until, .. } => {
                prop_assert!(!inside(&calendar, now));
                prop_assert!(until > now);
                prop_assert!(inside(&calendar, until), "until {until} is not inside");
                prop_assert!(!inside(&calendar, until - SignedDuration::from_secs(1)));
                // No allowed instant between now and until, on a grid.
                let mut probe = now;
                while probe < until {
                    prop_assert!(!inside(&calendar, probe), "{probe} is inside, before {until}");
                    probe += SignedDuration::from_secs(step);
                }
            }
        }
    }
}

/// The scheduler measures open time with `open_spans`: each span is open
/// from its first instant to its last, closed at its end, and the spans
/// follow the wall clock across a DST jump (01:00–04:00 on the night the
/// clock skips 02:00–03:00 is two hours long).
#[test]
fn open_spans_are_the_calendars_open_time_across_a_dst_jump() {
    let stockholm = calendar(
        &["sun", "mon"],
        &["01:00-04:00", "09:00-10:00"],
        "Europe/Stockholm",
    );
    let spans = stockholm.open_spans(at("2026-03-28T23:00:00Z"), at("2026-03-30T22:00:00Z"));
    assert_eq!(
        spans,
        vec![
            // Sunday 29 March: 01:00 CET, 04:00 CEST.
            (at("2026-03-29T00:00:00Z"), at("2026-03-29T02:00:00Z")),
            (at("2026-03-29T07:00:00Z"), at("2026-03-29T08:00:00Z")),
            // Monday 30 March, CEST.
            (at("2026-03-29T23:00:00Z"), at("2026-03-30T02:00:00Z")),
            (at("2026-03-30T07:00:00Z"), at("2026-03-30T08:00:00Z")),
        ]
    );
    // Cut to the range asked for; an all-day calendar is one span.
    let cut = stockholm.open_spans(at("2026-03-29T07:30:00Z"), at("2026-03-29T07:45:00Z"));
    assert_eq!(
        cut,
        vec![(at("2026-03-29T07:30:00Z"), at("2026-03-29T07:45:00Z"))]
    );
    let always = calendar(
        &["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        &["00:00-24:00"],
        "UTC",
    );
    let week = always.open_spans(at("2026-11-20T10:00:00Z"), at("2026-11-27T10:00:00Z"));
    assert_eq!(
        week,
        vec![(at("2026-11-20T10:00:00Z"), at("2026-11-27T10:00:00Z"))]
    );
}

proptest! {
    /// Every span is open at its start and just before its end, and closed
    /// at its end (unless the range ends there); between spans it is closed.
    #[test]
    fn open_spans_agree_with_allows(start in 1_790_000_000i64..1_830_000_000, hours in 1i64..400) {
        let stockholm = calendar(WORKDAYS, &["09:00-12:00", "13:00-15:00:30"], "Europe/Stockholm");
        let from = Timestamp::from_second(start).unwrap();
        let until = from + SignedDuration::from_hours(hours);
        let spans = stockholm.open_spans(from, until);
        let nano = SignedDuration::from_nanos(1);
        for (index, &(open, close)) in spans.iter().enumerate() {
            prop_assert!(open < close && from <= open && close <= until);
            prop_assert!(stockholm.allows(open) && stockholm.allows(close - nano));
            if close < until {
                prop_assert!(!stockholm.allows(close));
            }
            if let Some(&(next, _)) = spans.get(index + 1) {
                prop_assert!(close < next);
                let middle = close + SignedDuration::from_nanos(next.duration_since(close).as_nanos() as i64 / 2);
                prop_assert!(!stockholm.allows(middle));
            }
        }
    }
}
