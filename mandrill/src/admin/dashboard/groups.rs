//! The groups: every group the operator knows, with its pause (who, why,
//! since when), its recovery objective judged, its use of its limits, and
//! the button that pauses or resumes it alone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::page::{action, escape};
use crate::safety::Policy;
use crate::safety::objectives::{Judged, Recovery};
use crate::schedule::Planned;
use crate::store::{GroupPause, GroupUsage};

/// One group's line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GroupRow {
    pub(crate) name: String,
    /// Its hosts in the inventory, if it has one.
    pub(crate) hosts: Option<u32>,
    pub(crate) pause: Option<GroupPause>,
    pub(crate) objective: Option<Judged>,
    pub(crate) usage: GroupUsage,
    /// Hosts that may be disrupted at once, if limited.
    pub(crate) budget: Option<u32>,
}

/// The groups the operator named, with their sizes where the inventory
/// gives them: the inventory's, `safety.groups`', and the schedules'.
pub(super) fn known(policy: &Policy, schedules: &[Planned]) -> BTreeMap<String, Option<u32>> {
    let mut known: BTreeMap<String, Option<u32>> = BTreeMap::new();
    if let Some(snapshot) = policy
        .inventory
        .as_ref()
        .and_then(|handle| handle.current())
    {
        for (group, size) in snapshot.inventory.groups() {
            known.insert(group.clone(), Some(*size));
        }
    }
    let named = policy.guards.counting.group_names().map(str::to_owned);
    for group in named.chain(schedules.iter().map(|s| s.group.clone())) {
        known.entry(group).or_default();
    }
    known
}

/// One row per group known, paused, judged or restarted lately, by name.
pub(super) fn rows(
    known: BTreeMap<String, Option<u32>>,
    pauses: Vec<GroupPause>,
    judged: Vec<Judged>,
    mut usage: BTreeMap<String, GroupUsage>,
    budget: impl Fn(&str) -> Option<u32>,
) -> Vec<GroupRow> {
    let mut pauses: BTreeMap<String, GroupPause> = pauses
        .into_iter()
        .map(|pause| (pause.group.clone(), pause))
        .collect();
    let mut judged: BTreeMap<String, Judged> = judged
        .into_iter()
        .map(|judged| (judged.group.clone(), judged))
        .collect();
    let names: BTreeSet<String> = known
        .keys()
        .chain(pauses.keys())
        .chain(judged.keys())
        .chain(usage.keys())
        .cloned()
        .collect();
    names
        .into_iter()
        .map(|name| GroupRow {
            hosts: known.get(&name).copied().flatten(),
            pause: pauses.remove(&name),
            objective: judged.remove(&name),
            usage: usage.remove(&name).unwrap_or_default(),
            budget: budget(&name),
            name,
        })
        .collect()
}

pub(super) fn render(
    html: &mut String,
    groups: Result<&[GroupRow], &'static str>,
    window: Duration,
) {
    html.push_str("<h2>Groups</h2>");
    let groups = match groups {
        Ok(groups) => groups,
        Err(why) => {
            let _ = write!(html, "<p id=\"no-groups\">Groups unknown: {why}.</p>");
            return;
        }
    };
    let _ = write!(
        html,
        "<table id=\"groups\"><tr><th>group</th><th>hosts</th><th>state</th>\
         <th>restarts in the last {}</th><th>disrupted</th><th>recovery</th>\
         <th>objective</th><th></th></tr>",
        crate::settings::duration::per(window)
    );
    for group in groups {
        let name = escape(&group.name);
        let (class, state, button) = match &group.pause {
            Some(pause) => (
                "paused",
                format!(
                    "PAUSED by {} ({}) since {}",
                    escape(&pause.by),
                    escape(&pause.reason),
                    pause.since
                ),
                action("/api/resume", Some(&group.name), "Resume"),
            ),
            None => (
                "",
                "running".to_owned(),
                action("/api/pause", Some(&group.name), "Pause"),
            ),
        };
        let budget = group
            .budget
            .map_or_else(String::new, |budget| format!(" of {budget}"));
        let (recovery, objective) = match &group.objective {
            Some(judged) => recovery(judged),
            None => ("-".to_owned(), "none".to_owned()),
        };
        let _ = write!(
            html,
            "<tr class=\"group {class}\" data-name=\"{name}\"><td>{name}</td><td>{}</td>\
             <td class=\"wrap\">{state}</td><td>{}</td><td>{}{budget}</td><td>{recovery}</td>\
             <td>{objective}</td><td>{button}</td></tr>",
            group
                .hosts
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            group.usage.restarts,
            group.usage.disrupted,
        );
    }
    html.push_str("</table>");
}

/// A group's recovery (p50 and its objective's percentile) and its
/// objective with the verdict, as `mandrill status` judges it.
fn recovery(judged: &Judged) -> (String, String) {
    let show = |r: Option<Recovery>| r.map_or_else(|| "-".to_owned(), |r| r.to_string());
    let verdict = match judged.met {
        Some(true) => "met",
        Some(false) => "BREACHED",
        None => "no verified restart yet",
    };
    let recovery = if judged.samples == 0 {
        "-".to_owned()
    } else {
        format!(
            "p50 {}, p{} {} over {} restarts",
            show(judged.p50),
            judged.percentile,
            show(judged.at_percentile),
            judged.samples
        )
    };
    (
        recovery,
        format!(
            "p{} ≤ {:.1}s: {verdict}",
            judged.percentile,
            judged.max.as_secs_f64()
        ),
    )
}
