//! The scheduler's companion in `mandrill run`: one task per schedule that
//! waits for each slot and publishes one request for its victim through
//! the configured broker, with the slot's deterministic message id, so
//! that every guard applies and the store's idempotency makes it happen
//! once however many instances publish it. Nothing here restarts anything
//! or decides past the guards: the worker does, as for any request.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use jiff::SignedDuration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Plan, Slot};
use crate::broker::Broker;
use crate::domain::{Domain, Hostname, InstanceName, RestartRequest, SigningKey};
use crate::inventory::Host;
use crate::safety::{Clock, Policy, PolicyHandle};
use crate::store::Store;

/// How often a wait for a far slot looks at the plan again: a reload may
/// have changed the calendar (and so the slots) meanwhile.
const RECHECK: Duration = Duration::from_secs(30);

/// How far back, at start-up, slots are looked at to record the ones
/// missed while no instance ran.
const MISSED_LOOKBACK: SignedDuration = SignedDuration::from_hours(24);

/// At most this many slots missed while down are looked up and reported
/// at start-up.
const MISSED_CHECKED: u32 = 100;

/// How far ahead slots are planned at a time.
const LOOKAHEAD: SignedDuration = SignedDuration::from_hours(1);

/// How many of the newest requests are read to find hosts still being
/// restarted (passed over as victims; the guards would defer them).
const RECENT_REQUESTS: usize = 500;

/// How soon a publish that failed is tried again, within the slot's
/// lateness bound.
const PUBLISH_RETRY: Duration = Duration::from_secs(1);

/// A schedule's group in one inventory copy, each host with its
/// [`Plan::key`]: read once for many slots by the preview and the outlook
/// (the service reads it at each slot, from the copy in force then).
pub(crate) struct Candidates {
    keyed: Vec<(u64, Arc<Host>)>,
}

/// A schedule ready to run: its plan, and who its requests are signed as.
#[derive(Clone)]
pub(crate) struct Scheduled {
    /// The plan every instance computes alike.
    pub plan: Plan,
    /// The `[[requesters]]` name and private key it signs with; `None`:
    /// unsigned (only where unsigned requests are accepted).
    pub signer: Option<(String, Arc<SigningKey>)>,
}

impl Scheduled {
    /// The requester it signs as.
    pub(crate) fn requester(&self) -> Option<&str> {
        self.signer.as_ref().map(|(name, _)| name.as_str())
    }

    /// The group's hosts in the inventory `policy` holds now, each keyed
    /// for the draw; else why there are none.
    pub(crate) fn candidates(&self, policy: &Policy) -> Result<Candidates, String> {
        let plan = &self.plan;
        let inventory = policy
            .inventory
            .as_ref()
            .ok_or("no [inventory]: a schedule draws its victims from it")?;
        let snapshot = inventory.fresh().map_err(|lookup| lookup.reason)?;
        let keyed: Vec<(u64, Arc<Host>)> = snapshot
            .inventory
            .in_group(&plan.group)
            .map(|host| (plan.key(&host.name), Arc::clone(host)))
            .collect();
        if keyed.is_empty() {
            return Err(format!(
                "group {} has no host in the inventory ({})",
                plan.group, snapshot.source
            ));
        }
        Ok(Candidates { keyed })
    }

    /// The request for `slot`'s victim under `policy`: the first of the
    /// group's hosts, in the slot's own random order, that the inventory
    /// places, `safety.allow`/`deny` and the signing requester admit, and
    /// that is not in `busy` (restarting now). Else why none is.
    pub(crate) fn victim(
        &self,
        policy: &Policy,
        slot: &Slot,
        busy: &HashSet<String>,
        domain: &Domain,
    ) -> Result<RestartRequest, String> {
        let candidates = self.candidates(policy)?;
        self.victim_among(&candidates, policy, slot, busy, domain)
    }

    /// [`Self::victim`] among `candidates` read once for many slots.
    pub(crate) fn victim_among(
        &self,
        candidates: &Candidates,
        policy: &Policy,
        slot: &Slot,
        busy: &HashSet<String>,
        domain: &Domain,
    ) -> Result<RestartRequest, String> {
        let plan = &self.plan;
        let mut chosen = None;
        plan.victim_among(
            slot,
            &candidates.keyed,
            |host| &host.name,
            |name| {
                if busy.contains(name) {
                    return false;
                }
                let Ok(instance) = InstanceName::parse(name) else {
                    return false;
                };
                let mut request = request(slot, instance, domain, self.requester());
                // As the worker decides it: another name or the address of
                // the machine denied denies this name too.
                if policy.place(&mut request).is_err()
                    || policy.eligibility.check(name).is_err()
                    || policy.check_other_names(&request).is_err()
                    || policy
                        .requesters
                        .check(&request, &plan.group, std::time::SystemTime::now())
                        .is_err()
                {
                    return false;
                }
                chosen = Some(request);
                true
            },
        );
        chosen.ok_or_else(|| {
            format!(
                "none of the {} hosts of group {} is eligible now (safety.allow/deny, the \
                 requester's allow, or restarting already)",
                candidates.keyed.len(),
                plan.group
            )
        })
    }

    /// The payload of `request`: signed when the schedule has a key.
    fn encode(&self, request: &RestartRequest) -> Bytes {
        match &self.signer {
            None => Bytes::from(request.to_wire()),
            Some((name, key)) => {
                let mut wire = request.to_wire_request();
                wire.requested_by = None;
                // Signed as of the slot, not of now: every instance that
                // publishes the slot with the same victim then publishes
                // the same bytes, which the broker's duplicate id (a digest
                // of the bytes) collapses into one message.
                let issued = request.published_at.unwrap_or_else(SystemTime::now);
                let token = key
                    .sign(&wire, name, issued, crate::domain::signed::MAX_LIFETIME)
                    // Read and probed at start-up; the claims are plain data.
                    .expect("a key that signed its probe signs a request");
                Bytes::from(token)
            }
        }
    }
}

/// The request of `slot` for `instance`, as published: the slot's id and
/// reason, dated at the slot's time.
fn request(
    slot: &Slot,
    instance: InstanceName,
    domain: &Domain,
    requester: Option<&str>,
) -> RestartRequest {
    RestartRequest {
        message_id: slot.message_id,
        hostname: Hostname::new(&instance, domain),
        instance_name: instance,
        requested_by: Some(format!("schedule:{}", slot.schedule)),
        reason: Some(slot.reason()),
        published_at: Some(SystemTime::from(slot.at)),
        group: None,
        requested_group: None,
        zone: None,
        requester: requester.map(str::to_owned),
        signature: None,
        reach: None,
        machine: None,
        not_before: None,
        reply_to: None,
    }
}

/// Runs `scheduled` until `stop`: records the slots missed while nothing
/// ran, then publishes each slot as it comes (up to its `max_lateness`
/// late), reading the policy in force at each.
pub(crate) async fn run(
    scheduled: Scheduled,
    policy: PolicyHandle,
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    clock: Clock,
    domain: Domain,
    stop: CancellationToken,
) {
    let plan = &scheduled.plan;
    let lateness = SignedDuration::try_from(plan.max_lateness).unwrap_or(SignedDuration::MAX);
    let started = clock.now();
    let bound = started.saturating_sub(lateness).unwrap_or(started);
    let calendar = policy.current().guards.calendar.clone();
    // The newest ones only: a short mean would otherwise mean thousands of
    // lookups before the first slot.
    let lookback = SignedDuration::try_from(plan.mean_time_between.saturating_mul(MISSED_CHECKED))
        .unwrap_or(MISSED_LOOKBACK)
        .min(MISSED_LOOKBACK);
    let earlier = plan.slots(
        calendar.as_ref(),
        bound.saturating_sub(lookback).unwrap_or(bound),
        bound,
    );
    for slot in earlier.iter().rev().take(MISSED_CHECKED as usize) {
        missed_unless_published(
            store.as_ref(),
            slot,
            "no instance was running within its max_lateness",
        )
        .await;
    }
    let mut after = bound - SignedDuration::from_nanos(1);
    // The coming hour's slots, planned again every RECHECK: a reload may
    // have changed the calendar.
    let mut upcoming: VecDeque<Slot> = VecDeque::new();
    let mut planned_at = tokio::time::Instant::now();
    loop {
        if upcoming.is_empty() || planned_at.elapsed() >= RECHECK {
            let calendar = policy.current().guards.calendar.clone();
            let next = after + SignedDuration::from_nanos(1);
            upcoming = plan.slots(calendar.as_ref(), next, next + LOOKAHEAD).into();
            if upcoming.is_empty() {
                upcoming.extend(plan.next_after(calendar.as_ref(), after));
            }
            planned_at = tokio::time::Instant::now();
        }
        let Some(slot) = upcoming.front().cloned() else {
            tokio::select! {
                () = tokio::time::sleep(RECHECK) => continue,
                () = stop.cancelled() => return,
            }
        };
        let now = clock.now();
        if slot.at > now {
            let wait = slot.at.duration_since(now).unsigned_abs().min(RECHECK);
            tokio::select! {
                () = tokio::time::sleep(wait) => continue,
                () = stop.cancelled() => return,
            }
        }
        upcoming.pop_front();
        after = slot.at;
        if now.duration_since(slot.at) > lateness {
            missed_unless_published(
                store.as_ref(),
                &slot,
                "this instance reached it too late (suspended or overloaded)",
            )
            .await;
            continue;
        }
        if !publish(
            &scheduled, &slot, &policy, &*broker, &*store, &clock, &domain, &stop,
        )
        .await
        {
            return;
        }
    }
}

/// Publishes `slot`'s request, retrying within its lateness bound. `false`
/// when `stop` came first.
#[allow(clippy::too_many_arguments)]
async fn publish(
    scheduled: &Scheduled,
    slot: &Slot,
    policy: &PolicyHandle,
    broker: &dyn Broker,
    store: &dyn Store,
    clock: &Clock,
    domain: &Domain,
    stop: &CancellationToken,
) -> bool {
    // Another instance's copy already reached the store: publishing again
    // would only add a duplicate delivery (harmless, but noise).
    if let Ok(Some(_)) = store.lookup(slot.message_id).await {
        debug!(schedule = %slot.schedule, slot = %slot.at, "slot already published by another instance");
        return true;
    }
    let busy = busy_hosts(store).await;
    let request = match scheduled.victim(&policy.current(), slot, &busy, domain) {
        Ok(request) => request,
        Err(why) => {
            missed(slot, &format!("no victim: {why}"));
            return true;
        }
    };
    let payload = scheduled.encode(&request);
    let lateness =
        SignedDuration::try_from(scheduled.plan.max_lateness).unwrap_or(SignedDuration::MAX);
    loop {
        match broker.publish(payload.clone()).await {
            Ok(()) => {
                info!(
                    schedule = %slot.schedule,
                    slot = %slot.at,
                    instance = %request.instance_name,
                    message_id = %slot.message_id,
                    "scheduled restart published"
                );
                metrics::counter!("mandrill_schedule_published_total", "schedule" => slot.schedule.clone())
                    .increment(1);
                return true;
            }
            Err(error) if clock.now().duration_since(slot.at) <= lateness => {
                warn!(schedule = %slot.schedule, slot = %slot.at, error = %error, "could not publish a scheduled restart; trying again");
            }
            Err(error) => {
                missed(
                    slot,
                    &format!("the broker refused it until its max_lateness: {error}"),
                );
                return true;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PUBLISH_RETRY) => {}
            () = stop.cancelled() => return false,
        }
    }
}

/// Hosts with a request still open in the store's recent history: being
/// restarted now. Empty if the store cannot say (the guards still count).
async fn busy_hosts(store: &dyn Store) -> HashSet<String> {
    match store.history(RECENT_REQUESTS).await {
        Ok(entries) => entries
            .into_iter()
            .filter(|entry| !entry.status.is_final())
            .filter_map(|entry| entry.instance_name)
            .collect(),
        Err(error) => {
            warn!(error = %error.with_causes(), "could not read the recent history for the scheduler");
            HashSet::new()
        }
    }
}

/// A slot past its lateness bound: missed (see [`missed`]) only if no
/// instance published it. Another instance, on time, may have; its
/// request is then in the store. A store that cannot say is not counted.
async fn missed_unless_published(store: &dyn Store, slot: &Slot, why: &str) {
    match store.lookup(slot.message_id).await {
        Ok(None) => missed(slot, why),
        Ok(Some(_)) => {}
        Err(error) => warn!(
            schedule = %slot.schedule,
            slot = %slot.at,
            error = %error.with_causes(),
            "could not tell whether a late slot was published; not counted as missed"
        ),
    }
}

/// A slot that will not be published: said in the log and counted, never
/// replayed later.
fn missed(slot: &Slot, why: &str) {
    warn!(
        schedule = %slot.schedule,
        slot = %slot.at,
        message_id = %slot.message_id,
        why,
        "scheduled restart missed"
    );
    metrics::counter!("mandrill_schedule_missed_total", "schedule" => slot.schedule.clone())
        .increment(1);
}
