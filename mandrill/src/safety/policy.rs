//! The safety policy a running service may change without a restart
//! (SIGHUP reloads `[safety]`), and the shared handle the worker reads it
//! through.
//!
//! One piece, past 400 lines before its tests: the policy, its
//! placement of a request in the operator's fleet, and the handle that
//! swaps it on reload and keeps the leash, which is the policy's `dry_run`
//! as the operator last turned it. A reload and the leash read each other,
//! so they stay together.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::leash::{Leash, LeashFrom, LeashRecord};
use super::{Eligibility, Guards, Hold, Limits, ReplyDestinations, Requesters, StopConditions};
use crate::domain::RestartRequest;
use crate::inventory::InventoryHandle;
use crate::restarter::hosts::HostMap;

/// What a reload of `[safety]` may change. Everything the handler decides
/// with, so that one message is decided under one policy at a time.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Leashed: every decision is made and recorded, the would-be action
    /// recorded as `dry-run`, and no restart is issued.
    pub dry_run: bool,
    /// Which instances may be restarted at all.
    pub eligibility: Eligibility,
    /// The guards that may defer a request (the calendar, the counting
    /// guards), and their clock.
    pub guards: Guards,
    /// Turn the kill switch on when a host does not come back.
    pub pause_on_unrecovered: bool,
    /// Checks run right before each restart; one that fails defers it.
    pub stop_conditions: StopConditions,
    /// How soon a delivery a stop condition deferred comes back.
    pub stop_retry: Duration,
    /// The operator's inventory, when `[inventory]` names a source: the
    /// hosts that exist, their groups, zones and addresses. The handle is
    /// the service's, kept current by its refresh task.
    pub inventory: Option<InventoryHandle>,
    /// `[[requesters]]` and `safety.require_signed`: the keys signed
    /// requests are verified with, what each requester may restart, its
    /// quota. Reloaded with the rest, so that a key is revoked or rotated
    /// by a SIGHUP.
    pub requesters: Arc<Requesters>,
    /// `broker.reply_to_allowed`: where a request may ask for its verdict.
    pub reply_to: ReplyDestinations,
    /// `[[recovery_objective]]`: how fast each group's hosts must come
    /// back; judged by the service's companion, shown by the admin pages.
    pub recovery_objectives: Vec<super::objectives::RecoveryObjective>,
    /// The `[[hosts]]` map the backends reach hosts through (the running
    /// configuration's: a reload does not change it): `safety.deny`
    /// matches the address it gives a host too.
    pub hosts: Arc<HostMap>,
}

/// How soon a request the inventory moved to another zone or address
/// after its placement comes back, to be placed afresh.
const REPLACED_RETRY: Duration = Duration::from_secs(1);

/// Why a request is not counted at all: what [`Policy::place`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Denied for good (recorded `denied`, acked): not in the inventory,
    /// no group there, the message names another group, or a `reply_to`
    /// the operator does not allow.
    Denied {
        /// `inventory`, `group` or `reply_to`.
        guard: &'static str,
        /// In plain words, with the names involved.
        reason: String,
    },
    /// Not decidable now (no inventory loaded, or too old): deferred.
    Deferred {
        /// In plain words, naming the inventory.
        reason: String,
        /// How soon to look again.
        retry: Duration,
    },
}

impl Default for Policy {
    /// Everything allowed, nothing checked, unleashed: what tests of other
    /// behaviour start from (a configuration's policy comes from
    /// `Config::policy`).
    fn default() -> Self {
        Self {
            dry_run: false,
            eligibility: Eligibility::everyone(),
            guards: Guards::default(),
            pause_on_unrecovered: false,
            stop_conditions: StopConditions::default(),
            stop_retry: Duration::from_secs(30),
            inventory: None,
            requesters: Arc::default(),
            reply_to: ReplyDestinations::default(),
            recovery_objectives: Vec::new(),
            hosts: Arc::default(),
        }
    }
}

impl Policy {
    /// Places `request` with the operator: assigns its group (the
    /// inventory's, else `safety.groups` or the name's default), and with
    /// an inventory its zone and where it is reached, before anything
    /// counts. `Err` when it must not be counted at all: denied (not in
    /// the inventory, no group there, a message naming another group) or
    /// deferred (the inventory is missing or older than its `max_age`).
    pub(crate) fn place(&self, request: &mut RestartRequest) -> Result<(), Placement> {
        // Before anything counts: a requester who would not hear the
        // verdict gets nothing restarted.
        if let Some(destination) = &request.reply_to {
            self.reply_to
                .check(destination)
                .map_err(|reason| Placement::Denied {
                    guard: "reply_to",
                    reason,
                })?;
        }
        let Some(inventory) = &self.inventory else {
            return self
                .guards
                .counting
                .assign(request)
                .map_err(|reason| Placement::Denied {
                    guard: "group",
                    reason,
                });
        };
        let snapshot = inventory.fresh().map_err(|lookup| Placement::Deferred {
            reason: lookup.reason,
            retry: lookup.retry,
        })?;
        let name = request.instance_name.as_str();
        let Some(host) = snapshot.inventory.host(name) else {
            return Err(Placement::Denied {
                guard: "inventory",
                reason: format!(
                    "denied by inventory: {name} is not in the inventory ({})",
                    snapshot.source
                ),
            });
        };
        let Some(group) = &host.group else {
            return Err(Placement::Denied {
                guard: "inventory",
                reason: format!(
                    "denied by inventory: {name} has no group: {}",
                    host.no_group.as_deref().unwrap_or("none given")
                ),
            });
        };
        request.group = Some(group.to_string());
        request.zone = host.zone.as_deref().map(str::to_owned);
        request.reach = Some(host.reach.clone());
        request.machine = snapshot.inventory.machine(name).map(str::to_owned);
        super::group_mismatch(request, group).map_err(|reason| Placement::Denied {
            guard: "group",
            reason,
        })
    }

    /// The operator's group for `instance`, with no message in hand (what
    /// `mandrill report` places a never-claimed request by): the
    /// inventory's, from its latest copy however old, else the matching
    /// `safety.groups` entry's. `None` when the operator places it
    /// nowhere: never a group made from the name.
    pub(crate) fn operators_group(&self, instance: &str) -> Option<String> {
        match &self.inventory {
            Some(inventory) => {
                let current = inventory.current()?;
                current
                    .inventory
                    .host(instance)?
                    .group
                    .as_deref()
                    .map(str::to_owned)
            }
            None => self
                .guards
                .counting
                .configured_group(instance)
                .map(str::to_owned),
        }
    }

    /// Whether `request`, placed earlier, is still placed the same under
    /// this policy (checked again after the claim, which may have waited,
    /// and after the stop conditions): with an inventory, still listed, in
    /// the same group, in the same zone and reached the same way, and the
    /// copy not too old. No allocation unless it is not. `Err` as
    /// [`Self::place`]; a host whose zone or reach changed is deferred, so
    /// that the next delivery is placed afresh (the restart would go to the
    /// old address, and count in the old zone).
    pub(crate) fn still_placed(&self, request: &RestartRequest) -> Result<(), Placement> {
        let Some(inventory) = &self.inventory else {
            return Ok(());
        };
        let snapshot = inventory.fresh().map_err(|lookup| Placement::Deferred {
            reason: lookup.reason,
            retry: lookup.retry,
        })?;
        let name = request.instance_name.as_str();
        let Some(host) = snapshot.inventory.host(name) else {
            return Err(Placement::Denied {
                guard: "inventory",
                reason: format!(
                    "denied by inventory: {name} is not in the inventory ({})",
                    snapshot.source
                ),
            });
        };
        if host.group.as_deref() != request.group.as_deref() {
            return Err(Placement::Denied {
                guard: "inventory",
                reason: format!(
                    "denied by inventory: {name} moved from group {} to {} while its claim \
                     was made",
                    request.group(),
                    host.group.as_deref().unwrap_or("none")
                ),
            });
        }
        let changed = if host.zone.as_deref() != request.zone.as_deref() {
            format!(
                "{name} moved from zone {} to {}",
                request.zone.as_deref().unwrap_or("none"),
                host.zone.as_deref().unwrap_or("none")
            )
        } else if request.reach.as_deref() != Some(&*host.reach) {
            format!("{name}'s address, port or user changed")
        } else if snapshot.inventory.machine(name) != request.machine.as_deref() {
            format!("the entries sharing {name}'s address changed")
        } else {
            return Ok(());
        };
        Err(Placement::Deferred {
            reason: format!(
                "deferred by inventory: {changed} while its claim was made; placed afresh at \
                 the next delivery"
            ),
            retry: REPLACED_RETRY,
        })
    }

    /// `Ok` unless another name of the machine `request` names (the
    /// address it is reached at: the inventory's, else the `[[hosts]]`
    /// map's; and the inventory's entries sharing that address) is denied:
    /// by `safety.deny`, or, for an entry, by the verified requester's
    /// `allow`. Allocates only to match `safety.deny` against another
    /// spelling of an address (see [`Eligibility::check_other_name`]).
    pub(crate) fn check_other_names(&self, request: &RestartRequest) -> Result<(), String> {
        let instance = request.instance_name.as_str();
        let address = match request.reach.as_ref().and_then(|r| r.address.as_deref()) {
            Some(listed) => Some(listed),
            None => self.hosts.address(instance),
        };
        if let Some(address) = address {
            self.eligibility.check_other_name(instance, address)?;
        }
        let Some(snapshot) = self.inventory.as_ref().and_then(InventoryHandle::current) else {
            return Ok(());
        };
        for alias in snapshot.inventory.aliases(instance) {
            self.eligibility.check_other_name(instance, alias)?;
            self.requesters.check_alias(request, alias)?;
        }
        Ok(())
    }

    /// The limits a claim in `group` enforces: with an inventory, a
    /// percentage budget counts the group's size there.
    pub(crate) fn limits(&self, group: &str) -> Result<Limits, String> {
        match self.inventory.as_ref().and_then(InventoryHandle::current) {
            Some(snapshot) => self
                .guards
                .counting
                .limits_sized(group, snapshot.inventory.group_size(group)),
            None => self.guards.counting.limits(group),
        }
    }

    /// A deferral for `delay` (a short retry: a stop condition), or
    /// `Expired` when the request would then be older than
    /// `safety.max_defer` since it was published.
    pub(crate) fn defer(&self, request: &RestartRequest, delay: Duration, reason: String) -> Hold {
        self.guards.defer(request, "stop condition", delay, reason)
    }
}

/// The policy in force, shared by the worker (which reads it) and the
/// service (which swaps it on reload). Cheap to clone.
///
/// A `std::sync::RwLock` around an `Arc`: a reader holds the lock only to
/// clone the `Arc` (never across an `.await`), so the lock is uncontended
/// but for the instant of a reload, and a handler keeps the policy it read
/// for as long as it needs it while a reload installs the next one.
#[derive(Debug, Clone)]
pub(crate) struct PolicyHandle {
    policy: Arc<RwLock<Arc<Policy>>>,
    /// The instance's own leash (`Policy::dry_run`), since when and by
    /// what, and the store's record as last read: what `/api/status` and
    /// `mandrill status` tell an operator, who must not have to guess it
    /// from the file (a start-up flag may differ, an operator may have
    /// turned it in the store).
    leash: Arc<RwLock<Leashes>>,
}

/// The two words on the leash (see [`super::leash`]).
#[derive(Debug, Clone)]
struct Leashes {
    own: Leash,
    record: Option<LeashRecord>,
}

/// What [`PolicyHandle::replace`] records when a policy turns the leash.
pub(crate) const TURNED_BY_RELOAD: &str = "a reload (SIGHUP) whose file changed safety.dry_run";

impl PolicyHandle {
    /// A handle on `policy`, leashed or not since now by start-up.
    pub(crate) fn new(policy: Policy) -> Self {
        let own = Leash {
            leashed: policy.dry_run,
            since: crate::domain::Timestamp::now(),
            by: "start-up".into(),
            reason: None,
            from: LeashFrom::Instance,
        };
        Self {
            policy: Arc::new(RwLock::new(Arc::new(policy))),
            leash: Arc::new(RwLock::new(Leashes { own, record: None })),
        }
    }

    /// The policy in force now.
    pub(crate) fn current(&self) -> Arc<Policy> {
        // A poisoned lock still holds a whole `Arc` (a writer only ever
        // replaces it in one store), so its value is safe to read.
        self.policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts `policy` in force for every delivery decided from now on;
    /// returns the one it replaces. A policy that turns the instance's own
    /// leash is recorded as turned now, by a reload.
    pub(crate) fn replace(&self, policy: Policy) -> Arc<Policy> {
        let policy = Arc::new(policy);
        let mut current = self
            .policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.dry_run != policy.dry_run {
            // Under the policy's lock, so that the two never disagree.
            self.leashes().own = Leash {
                leashed: policy.dry_run,
                since: crate::domain::Timestamp::now(),
                by: TURNED_BY_RELOAD.into(),
                reason: None,
                from: LeashFrom::Instance,
            };
        }
        std::mem::replace(&mut *current, policy)
    }

    /// The mode in force: the store's record as last read, else the
    /// instance's own ([`Leash::of`]).
    pub(crate) fn leash(&self) -> Leash {
        let leashes = self.leashes();
        Leash::of(&leashes.own, leashes.record.as_ref())
    }

    /// The mode in force if the store's record is `record` (as just read
    /// by `/api/status`), without taking it as seen: the worker's poll
    /// tells a change.
    pub(crate) fn leash_with(&self, record: Option<&LeashRecord>) -> Leash {
        Leash::of(&self.leashes().own, record)
    }

    /// The store's record as the worker just read it (before its first
    /// pull, then every `safety.poll_interval`); the mode in force when it changed it (to be
    /// said loudly), else `None`. The claims read the record themselves:
    /// this is what the instance tells, not what it decides by.
    pub(crate) fn observe(&self, record: Option<&LeashRecord>) -> Option<Leash> {
        let mut leashes = self.leashes();
        if leashes.record.as_ref() == record {
            return None;
        }
        let before = Leash::of(&leashes.own, leashes.record.as_ref());
        leashes.record = record.cloned();
        let after = Leash::of(&leashes.own, leashes.record.as_ref());
        (after != before).then_some(after)
    }

    /// Names what leashed (or unleashed) the instance at start-up, `by`
    /// (`--unleash`, the configuration file, the backend's default).
    pub(crate) fn leashed_at_start_by(&self, by: &str) {
        let mut leashes = self.leashes();
        if leashes.own.by == "start-up" {
            leashes.own.by = format!("{by} at start-up");
        }
    }

    fn leashes(&self) -> std::sync::RwLockWriteGuard<'_, Leashes> {
        // Poisoned only by a panic while one whole value was stored.
        self.leash
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Default for PolicyHandle {
    fn default() -> Self {
        Self::new(Policy::default())
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use jiff::Timestamp;

    use super::*;
    use crate::domain::testing::request;
    use crate::safety::Clock;

    #[test]
    fn a_replaced_policy_is_read_by_later_readers_and_not_by_earlier_ones() {
        let handle = PolicyHandle::new(Policy::default());
        let shared = handle.clone();
        let before = handle.current();
        assert!(before.eligibility.check("cattle-db01").is_ok());

        let old = shared.replace(Policy {
            dry_run: true,
            eligibility: Eligibility::new(&[], &["cattle-db*".into()], false).unwrap(),
            ..Policy::default()
        });
        assert!(Arc::ptr_eq(&old, &before));
        // A handler that read the policy before keeps deciding with it...
        assert!(!before.dry_run);
        assert!(before.eligibility.check("cattle-db01").is_ok());
        // ...and every read after the swap, through any clone, sees the new.
        let after = handle.current();
        assert!(after.dry_run);
        assert!(
            after
                .eligibility
                .check("cattle-db01")
                .unwrap_err()
                .contains("safety.deny")
        );
    }

    /// A policy whose inventory lists `cattle-a1` as `hosts` (TOML) says.
    fn with_inventory(hosts: &str) -> Policy {
        use crate::inventory::{Inventory, InventorySettings, Keys, Source};
        let inventory = Inventory::parse(hosts, true, &Keys::default()).unwrap();
        let handle = InventoryHandle::new(
            inventory,
            &Source::File("hosts.toml".into()),
            &InventorySettings::default(),
        );
        Policy {
            inventory: Some(handle),
            ..Policy::default()
        }
    }

    /// The placement is checked whole after the claim: a host the inventory
    /// gave another zone, address, port or user since is deferred to be
    /// placed afresh: comparing its group alone would send the restart to
    /// the old address, counted in the old zone.
    #[test]
    fn a_host_whose_zone_or_reach_changed_since_its_placement_is_placed_afresh() {
        let placed_by = with_inventory(
            "[[hosts]]\nname = \"cattle-a1\"\ngroup = \"herd\"\nzone = \"eu-1\"\n\
             address = \"10.0.0.1\"\nport = 22\nuser = \"ops\"\n",
        );
        let mut placed = request("cattle-a1");
        placed_by.place(&mut placed).unwrap();
        assert_eq!(placed_by.still_placed(&placed), Ok(()));
        // The same inventory read again (another copy, equal): unchanged.
        let same = with_inventory(
            "[[hosts]]\nname = \"cattle-a1\"\ngroup = \"herd\"\nzone = \"eu-1\"\n\
             address = \"10.0.0.1\"\nport = 22\nuser = \"ops\"\n",
        );
        assert_eq!(same.still_placed(&placed), Ok(()));
        for (changed, what) in [
            (
                "zone = \"eu-2\"\naddress = \"10.0.0.1\"\nport = 22\nuser = \"ops\"",
                "zone",
            ),
            ("address = \"10.0.0.1\"\nport = 22\nuser = \"ops\"", "zone"),
            (
                "zone = \"eu-1\"\naddress = \"10.0.0.2\"\nport = 22\nuser = \"ops\"",
                "address",
            ),
            (
                "zone = \"eu-1\"\naddress = \"10.0.0.1\"\nport = 2222\nuser = \"ops\"",
                "address",
            ),
            (
                "zone = \"eu-1\"\naddress = \"10.0.0.1\"\nport = 22\nuser = \"root\"",
                "address",
            ),
            ("zone = \"eu-1\"\nport = 22\nuser = \"ops\"", "address"),
        ] {
            let policy = with_inventory(&format!(
                "[[hosts]]\nname = \"cattle-a1\"\ngroup = \"herd\"\n{changed}\n"
            ));
            match policy.still_placed(&placed) {
                Err(Placement::Deferred { reason, .. }) => {
                    assert!(
                        reason.starts_with("deferred by inventory: cattle-a1")
                            && reason.contains(what)
                            && reason.contains("placed afresh"),
                        "{changed}: {reason}"
                    );
                }
                other => panic!("{changed}: {other:?}"),
            }
        }
        // Another group is still a denial, as before.
        let moved = with_inventory("[[hosts]]\nname = \"cattle-a1\"\ngroup = \"pets\"\n");
        assert!(matches!(
            moved.still_placed(&placed),
            Err(Placement::Denied { .. })
        ));
    }

    #[test]
    fn a_short_deferral_expires_past_max_defer() {
        let now: Timestamp = "2026-11-23T10:00:00Z".parse().unwrap();
        let policy = Policy {
            guards: Guards {
                max_defer: Duration::from_secs(3600),
                clock: Clock::Fixed(now),
                ..Guards::default()
            },
            ..Policy::default()
        };
        let mut fresh = request("cattle-ab12");
        fresh.published_at = Some(SystemTime::from(
            "2026-11-23T09:30:00Z".parse::<Timestamp>().unwrap(),
        ));
        let retry = Duration::from_secs(30);
        assert!(matches!(
            policy.defer(&fresh, retry, "deferred by stop condition \"x\": down".into()),
            Hold::Defer { delay, .. } if delay == retry
        ));
        let mut stale = fresh.clone();
        stale.published_at = Some(SystemTime::from(
            "2026-11-23T08:59:50Z".parse::<Timestamp>().unwrap(),
        ));
        match policy.defer(
            &stale,
            retry,
            "deferred by stop condition \"x\": down".into(),
        ) {
            Hold::Expired { reason, .. } => {
                assert!(
                    reason.starts_with("expired: deferred by stop condition"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let mut unknown = fresh;
        unknown.published_at = None;
        assert!(matches!(
            policy.defer(&unknown, retry, "why".into()),
            Hold::Defer { .. }
        ));
    }
}
