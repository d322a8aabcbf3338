//! The next planned restarts, as `mandrill status`, `/api/status` and the
//! dashboard show them: each schedule's next slots with their provisional
//! victims, drawn as `schedule preview` draws them (nobody is restarting:
//! the victim at the slot itself is drawn again among the hosts eligible
//! then).

use std::collections::HashSet;
use std::sync::Arc;

use jiff::Timestamp;
use serde::Serialize;
use uuid::Uuid;

use super::Scheduled;
use crate::domain::Domain;
use crate::safety::Policy;

/// How many planned restarts are shown per schedule.
const NEXT_SHOWN: usize = 3;

/// A schedule's next planned restarts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Planned {
    /// The schedule's name.
    pub name: String,
    /// The group its victims are drawn from.
    pub group: String,
    /// The next slots, soonest first.
    pub next: Vec<PlannedSlot>,
}

/// One planned restart.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PlannedSlot {
    /// When, in UTC (RFC 3339).
    pub at: String,
    /// When, on the calendar's clock (UTC without a calendar).
    pub local: String,
    /// The host it would restart if it were due now; `None` when no host
    /// of the group is eligible now.
    pub victim: Option<String>,
    /// Its request's id (a UUIDv5 of the schedule and the slot); `None`
    /// where it is not shown (the admin server shows it only to a caller
    /// with `admin.token`: an id known ahead could be used first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Uuid>,
}

/// The schedules of a running service, for its admin pages: shared, read
/// at each request.
#[derive(Clone, Default)]
pub(crate) struct Outlook {
    schedules: Arc<[Scheduled]>,
    domain: Domain,
}

impl Outlook {
    /// The schedules, with the domain their requests are qualified with.
    pub(crate) fn new(schedules: Vec<Scheduled>, domain: Domain) -> Self {
        Self {
            schedules: schedules.into(),
            domain,
        }
    }

    /// Whether no `[[schedule]]` is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.schedules.is_empty()
    }

    /// Each schedule's next [`NEXT_SHOWN`] slots after `now`, with their
    /// provisional victims under `policy`.
    pub(crate) fn next(&self, policy: &Policy, now: Timestamp) -> Vec<Planned> {
        let calendar = policy.guards.calendar.as_ref();
        let busy = HashSet::new();
        self.schedules
            .iter()
            .map(|scheduled| {
                let plan = &scheduled.plan;
                let candidates = scheduled.candidates(policy).ok();
                let mut after = now;
                let mut next = Vec::new();
                while next.len() < NEXT_SHOWN {
                    let Some(slot) = plan.next_after(calendar, after) else {
                        break;
                    };
                    after = slot.at;
                    let victim = candidates.as_ref().and_then(|candidates| {
                        scheduled
                            .victim_among(candidates, policy, &slot, &busy, &self.domain)
                            .ok()
                    });
                    next.push(PlannedSlot {
                        at: slot.at.to_string(),
                        local: calendar.map_or_else(|| slot.at.to_string(), |c| c.local(slot.at)),
                        victim: victim.map(|request| request.instance_name.as_str().to_owned()),
                        message_id: Some(slot.message_id),
                    });
                }
                Planned {
                    name: plan.name.clone(),
                    group: plan.group.clone(),
                    next,
                }
            })
            .collect()
    }
}
