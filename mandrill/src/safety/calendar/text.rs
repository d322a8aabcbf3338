//! The calendar's text: parsing its settings (clock times, windows,
//! weekdays, excluded dates, instants) and describing it.

use super::*;

pub(super) fn weekday_of(zoned: &Zoned) -> usize {
    zoned.weekday().to_monday_zero_offset() as usize
}

pub(super) fn seconds_of_day(zoned: &Zoned) -> u32 {
    // Each field is small and non-negative.
    u32::try_from(
        i32::from(zoned.hour()) * 3600 + i32::from(zoned.minute()) * 60 + i32::from(zoned.second()),
    )
    .unwrap_or(0)
}

pub(super) fn time_of(second: u32) -> jiff::civil::Time {
    // `second` is a window start, below 86400.
    jiff::civil::Time::new(
        (second / 3600) as i8,
        (second / 60 % 60) as i8,
        (second % 60) as i8,
        0,
    )
    .unwrap_or(jiff::civil::Time::midnight())
}

pub(super) const WEEKDAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

pub(super) fn weekday_index(name: &str) -> Option<usize> {
    let name = name.to_ascii_lowercase();
    WEEKDAYS.iter().position(|day| *day == name)
}

pub(super) fn describe_weekdays(weekdays: &[bool; 7]) -> String {
    let label = |index: usize| {
        let day = WEEKDAYS[index];
        format!("{}{}", day[..1].to_ascii_uppercase(), &day[1..])
    };
    let days: Vec<usize> = (0..7).filter(|&d| weekdays[d]).collect();
    match days.as_slice() {
        [_, _, _, _, _, _, _] => "every day".into(),
        [first, .., last] if last - first + 1 == days.len() && days.len() > 2 => {
            format!("{}–{}", label(*first), label(*last))
        }
        _ => days
            .iter()
            .map(|&d| label(d))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

pub(super) fn clock(second: u32) -> String {
    let (h, m, s) = (second / 3600, second / 60 % 60, second % 60);
    if s == 0 {
        format!("{h:02}:{m:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// `HH:MM` or `HH:MM:SS`, up to `24:00`.
pub(super) fn parse_clock(raw: &str) -> Option<u32> {
    let parts: Vec<&str> = raw.split(':').collect();
    let number = |part: &str| {
        (part.len() == 2)
            .then(|| part.parse::<u32>().ok())
            .flatten()
    };
    let (h, m, s) = match parts.as_slice() {
        [h, m] => (number(h)?, number(m)?, 0),
        [h, m, s] => (number(h)?, number(m)?, number(s)?),
        _ => return None,
    };
    let second = h * 3600 + m * 60 + s;
    (m < 60 && s < 60 && second <= DAY).then_some(second)
}

pub(super) fn parse_window(raw: &str) -> Result<Window, String> {
    let bad = || format!("{raw:?} is not a window like \"09:00-15:00\" or \"09:00:30-15:00:00\"");
    let (start, end) = raw.trim().split_once('-').ok_or_else(bad)?;
    let (start, end) = (
        parse_clock(start.trim()).ok_or_else(bad)?,
        parse_clock(end.trim()).ok_or_else(bad)?,
    );
    if start >= end {
        return Err(format!(
            "{raw:?} ends before it starts; a window does not wrap past midnight (write two)"
        ));
    }
    Ok((start, end))
}

pub(super) fn parse_excluded(raw: &str) -> Result<Excluded, String> {
    if let Ok(date) = raw.parse::<Date>() {
        return Ok(Excluded::Once(date));
    }
    let bad = || format!("{raw:?} is not a date like \"2026-12-24\" or a yearly \"12-25\"");
    let (month, day) = raw.split_once('-').ok_or_else(bad)?;
    let (month, day) = (
        month.parse::<i8>().map_err(|_| bad())?,
        day.parse::<i8>().map_err(|_| bad())?,
    );
    // A leap year admits every month-day there is, 02-29 included.
    Date::new(2024, month, day).map_err(|_| bad())?;
    Ok(Excluded::Yearly { month, day })
}

pub(super) fn parse_instant(raw: &str, zone: &TimeZone) -> Result<Timestamp, String> {
    if let Ok(instant) = raw.parse::<Timestamp>() {
        return Ok(instant);
    }
    let local: DateTime = raw.parse().map_err(|_| {
        format!("{raw:?} is neither an RFC 3339 timestamp nor a local date-time like \"2026-12-20T00:00\"")
    })?;
    zone.to_ambiguous_timestamp(local)
        .compatible()
        .map_err(|error| format!("{raw:?}: {error}"))
}
