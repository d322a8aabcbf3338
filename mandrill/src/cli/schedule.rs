//! `mandrill schedule preview [--days N] [--json]`: the restarts the
//! `[[schedule]]` entries plan for the coming days, each with its
//! provisional victim, computed as every running instance computes them
//! (the same plan, the same draw), without publishing anything.

use std::collections::HashSet;
use std::io::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use super::{BadInput, ConfigArgs, command};

/// `mandrill schedule`
#[derive(Debug, Args)]
pub(crate) struct ScheduleArgs {
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Debug, Subcommand)]
enum ScheduleCommand {
    /// Print the planned restarts of the coming days, with the provisional victim of each.
    Preview(PreviewArgs),
}

#[derive(Debug, Args)]
struct PreviewArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// How many days ahead, from now.
    #[arg(long, default_value_t = 7, value_name = "N")]
    days: u32,
    /// One JSON array of slots instead of text.
    #[arg(long)]
    json: bool,
}

/// Longest preview: a year, as far as a plan is looked ahead.
const MAX_DAYS: u32 = 366;

/// Runs `mandrill schedule …`.
pub(super) fn main(args: &ScheduleArgs) -> ExitCode {
    let ScheduleCommand::Preview(args) = &args.command;
    let sources = args.config.sources(Vec::new());
    command(sources, |config| async move {
        if args.days == 0 || args.days > MAX_DAYS {
            return Err(BadInput(format!("--days {} must be 1 to {MAX_DAYS}", args.days)).into());
        }
        let schedules = config.schedules()?;
        if schedules.is_empty() {
            return Err(BadInput("no [[schedule]] is configured".into()).into());
        }
        let policy = super::inventory::policy_with_inventory(&config).await?;
        if let Some(inventory) = &policy.inventory {
            crate::config::schedule_groups_known(&schedules, inventory)?;
        }
        let domain = config.parse_rules().domain;
        let calendar = policy.guards.calendar.clone();
        let from = Timestamp::now();
        let until = from + SignedDuration::from_hours(24 * i64::from(args.days));
        let busy = HashSet::new();
        let mut rows = Vec::new();
        let mut out = std::io::stdout().lock();
        for scheduled in &schedules {
            let plan = &scheduled.plan;
            let slots = plan.slots(calendar.as_ref(), from, until);
            let candidates = scheduled.candidates(&policy);
            if !args.json {
                writeln!(
                    out,
                    "schedule {} (group {}, one restart per {} of open time on average, {}): {} \
                     planned in the next {} day(s)",
                    plan.name,
                    plan.group,
                    humantime::format_duration(plan.mean_time_between),
                    calendar
                        .as_ref()
                        .map_or_else(|| "no calendar".to_owned(), |c| c.describe()),
                    slots.len(),
                    args.days
                )?;
            }
            for slot in slots {
                let victim = candidates
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(|candidates| {
                        scheduled.victim_among(candidates, &policy, &slot, &busy, &domain)
                    });
                let local = calendar
                    .as_ref()
                    .map_or_else(|| slot.at.to_string(), |c| c.local(slot.at));
                if args.json {
                    rows.push(json!({
                        "schedule": plan.name,
                        "group": plan.group,
                        "at": slot.at.to_string(),
                        "local": local,
                        "message_id": slot.message_id,
                        "victim": victim.as_ref().ok().map(|r| r.instance_name.as_str()),
                        "no_victim": victim.as_ref().err(),
                    }));
                } else {
                    let victim = match &victim {
                        Ok(request) => request.instance_name.as_str().to_owned(),
                        Err(why) => format!("(none: {why})"),
                    };
                    writeln!(out, "  {local}  {victim}  {}", slot.message_id)?;
                }
            }
        }
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&rows)?)?;
        } else {
            writeln!(
                out,
                "victims are provisional: each is drawn again at its slot, among the hosts \
                 eligible then"
            )?;
        }
        Ok(())
    })
}
