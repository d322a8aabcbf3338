//! The report as Markdown: tables, and the distribution as a table with
//! text bars. Names and reasons came from messages: every Markdown and
//! HTML special character in them is escaped, and line breaks flattened,
//! so that none can break a table or inject markup into a rendered page.

use std::fmt::Write as _;

use super::{Report, human, human_recovery, verdict_word};

/// The longest text bar, in characters.
const BAR: u32 = 30;

/// Text safe in a Markdown table cell.
fn cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '!' | '&' | '~' | '('
            | ')' | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The report as Markdown.
pub(crate) fn markdown(report: &Report) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(
        out,
        "# Game-day report\n\nFrom {} to {}.\n",
        report.since, report.until
    );
    let fleet = &report.fleet;
    let _ = writeln!(
        out,
        "| restarts issued | dry runs (nothing issued) | recovered | unrecovered | requests deferred | requests denied | requests expired |\n|---:|---:|---:|---:|---:|---:|---:|\n| {} | {} | {} | {} | {} | {} | {} |\n",
        fleet.restarts,
        fleet.dry_runs,
        fleet.recovered,
        fleet.unrecovered,
        fleet.deferred_requests,
        fleet.denied_requests,
        fleet.expired_requests
    );
    if report.groups.is_empty() {
        out.push_str("Nothing was restarted, deferred or denied in this period.\n\n");
    }
    for group in &report.groups {
        let recovery = &group.recovery;
        let _ = writeln!(out, "## Group {}\n", cell(&group.group));
        let _ = writeln!(
            out,
            "Restarts issued: {}; dry runs (nothing issued): {}; requests expired: {}\n",
            group.restarts, group.dry_runs, group.expired_requests
        );
        if !group.outcomes.is_empty() {
            out.push_str("| outcome | attempts claimed |\n|---|---:|\n");
            for (outcome, n) in &group.outcomes {
                let _ = writeln!(out, "| {} | {n} |", cell(outcome));
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "| recovered | unrecovered | p50 | p95 | objective |\n|---:|---:|---:|---:|---|"
        );
        let objective = group.objective.as_ref().map_or_else(
            || "none".to_owned(),
            |o| {
                format!(
                    "p{} ≤ {}: {} ({})",
                    o.percentile,
                    human(o.max),
                    human_recovery(o.observed),
                    verdict_word(o.met)
                )
            },
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |\n",
            recovery.recovered,
            recovery.unrecovered,
            human_recovery(recovery.p50),
            human_recovery(recovery.p95),
            objective
        );
        if !recovery.buckets.is_empty() || recovery.unrecovered > 0 {
            let highest = recovery
                .buckets
                .iter()
                .map(|b| b.count)
                .chain([recovery.unrecovered, 1])
                .max()
                .unwrap_or(1);
            let bar = |n: u32| "█".repeat((n * BAR).div_ceil(highest) as usize);
            out.push_str("| recovery time | restarts | |\n|---|---:|---|\n");
            for bucket in &recovery.buckets {
                let _ = writeln!(
                    out,
                    "| {} – {} | {} | {} |",
                    human(bucket.from),
                    human(bucket.to),
                    bucket.count,
                    bar(bucket.count)
                );
            }
            if recovery.unrecovered > 0 {
                let n = recovery.unrecovered;
                let _ = writeln!(out, "| never | {n} | {} |", bar(n));
            }
            out.push('\n');
        }
        if !group.unrecovered_hosts.is_empty() {
            let hosts: Vec<String> = group.unrecovered_hosts.iter().map(|h| cell(h)).collect();
            let _ = writeln!(out, "Unrecovered hosts: {}\n", hosts.join(", "));
        }
        for (title, key, counts) in [
            ("guard", "deferred", &group.deferrals_by_guard),
            ("requester", "denied", &group.denials_by_requester),
        ] {
            if counts.is_empty() {
                continue;
            }
            let _ = writeln!(out, "| {title} | requests {key} |\n|---|---:|");
            for (name, n) in counts {
                let _ = writeln!(out, "| {} | {n} |", cell(name));
            }
            out.push('\n');
        }
        if !group.latest_denials.is_empty() {
            out.push_str(
                "| denied at | host | requester | guard | reason |\n|---|---|---|---|---|\n",
            );
            for denial in &group.latest_denials {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} |",
                    denial.at,
                    cell(denial.host.as_deref().unwrap_or("–")),
                    cell(&denial.requester),
                    cell(&denial.guard),
                    cell(&denial.reason)
                );
            }
            out.push('\n');
        }
    }
    for campaign in &report.campaigns {
        let _ = writeln!(
            out,
            "## Campaign {} over {}: {}\n\nStarted {}{}.\n",
            campaign.id,
            cell(&campaign.group),
            campaign.verdict.as_str(),
            campaign.started_at,
            campaign
                .requester
                .as_deref()
                .map(|r| format!(" by {}", cell(r)))
                .unwrap_or_default()
        );
        out.push_str("| host | state | recovered after | why |\n|---|---|---|---|\n");
        for target in &campaign.targets {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                cell(&target.host),
                cell(&target.standing.state),
                target
                    .standing
                    .recovered_after_seconds
                    .map_or("–".to_owned(), |s| format!("{s:.1} s")),
                cell(&target.standing.detail)
            );
        }
        out.push('\n');
    }
    let _ = writeln!(out, "Percentiles: {}.", report.percentile_method);
    out
}

#[cfg(test)]
mod tests {
    use super::cell;

    #[test]
    fn a_cell_cannot_break_the_table_or_carry_markup() {
        assert_eq!(cell("a|b<script>\n*x*"), "a\\|b\\<script\\> \\*x\\*");
    }
}
