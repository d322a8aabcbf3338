//! The calendar (open now, or when it opens) and each schedule's next
//! planned restarts on its clock, with their provisional victims.

use std::fmt::Write as _;

use super::page::escape;
use crate::schedule::Planned;

pub(super) fn render(
    html: &mut String,
    calendar: Option<&(String, String)>,
    schedules: Result<&[Planned], &'static str>,
) {
    html.push_str("<h2>Calendar and schedules</h2>");
    match calendar {
        Some((rules, now)) => {
            let _ = write!(
                html,
                "<p id=\"calendar\">calendar: {}: <b>{}</b></p>",
                escape(rules),
                escape(now)
            );
        }
        None => html.push_str("<p id=\"calendar\">calendar: none (restarts at any time)</p>"),
    }
    let schedules = match schedules {
        Ok([]) => {
            html.push_str("<p id=\"no-planned\">No [[schedule]].</p>");
            return;
        }
        Ok(schedules) => schedules,
        Err(why) => {
            let _ = write!(
                html,
                "<p id=\"no-planned\">No planned restarts shown: {why}.</p>"
            );
            return;
        }
    };
    html.push_str(
        "<table id=\"planned\"><tr><th>schedule</th><th>group</th><th>next slot</th>\
         <th>victim (provisional)</th></tr>",
    );
    for schedule in schedules {
        if schedule.next.is_empty() {
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td colspan=\"2\">none within a year</td></tr>",
                escape(&schedule.name),
                escape(&schedule.group)
            );
        }
        for slot in &schedule.next {
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&schedule.name),
                escape(&schedule.group),
                escape(&slot.local),
                slot.victim
                    .as_deref()
                    .map_or_else(|| "(no eligible host now)".to_owned(), escape)
            );
        }
    }
    html.push_str("</table>");
}
