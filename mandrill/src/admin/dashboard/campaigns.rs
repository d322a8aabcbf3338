//! The latest campaigns, those in flight first: each target with where it
//! stands, as `campaign status` says it, and a button that stops a
//! campaign in flight.

use std::fmt::Write as _;
use std::time::Duration;

use super::page::escape;
use crate::campaign::{Judged, Verdict};

pub(super) fn render(html: &mut String, campaigns: Result<&[Judged], &str>, lookback: Duration) {
    html.push_str("<h2>Campaigns</h2>");
    let campaigns = match campaigns {
        Ok([]) => {
            let _ = write!(
                html,
                "<p id=\"no-campaigns\">No campaign started in the last {}.</p>",
                crate::settings::duration::per(lookback)
            );
            return;
        }
        Ok(campaigns) => campaigns,
        Err(why) => {
            let _ = write!(
                html,
                "<p id=\"no-campaigns\">Campaigns not shown: {}.</p>",
                escape(why)
            );
            return;
        }
    };
    for (campaign, targets, verdict) in campaigns {
        let id = campaign.id;
        // An id is a UUID: safe in an attribute and a path as it is.
        let stop = if *verdict == Verdict::InProgress {
            format!(
                "<button type=\"button\" data-post=\"/api/campaigns/{id}/stop\" \
                 data-reason-only>Stop</button>"
            )
        } else {
            String::new()
        };
        let _ = write!(
            html,
            "<section class=\"campaign\" id=\"campaign-{id}\"><h3>campaign {id} over group {}, \
             started {} by {}: <span class=\"{}\">{}</span>{stop}</h3>\
             <table><tr><th>target</th><th>due</th><th>state</th><th>detail</th></tr>",
            escape(&campaign.group),
            campaign.created_at,
            escape(campaign.requester.as_deref().unwrap_or("-")),
            verdict.as_str(),
            verdict.as_str(),
        );
        for (target, standing) in targets {
            let _ = write!(
                html,
                "<tr class=\"target {}\"><td>{}</td><td>{}</td><td>{}</td><td class=\"wrap\">{}</td></tr>",
                standing.verdict.as_str(),
                escape(&target.instance_name),
                target.due_at,
                escape(&standing.state),
                escape(&standing.detail),
            );
        }
        html.push_str("</table></section>");
    }
}
