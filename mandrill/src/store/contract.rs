//! Behaviour every `Store` must have; each implementation's tests call these.
//!
//! Test code only (the module is `cfg(test)`). [`all`] is the one list of
//! what a store promises, in order; each file beside it holds one kind of
//! promise: claims, retried claims, outcomes, who a request is, the switch
//! and pauses, the counting guards, disruption, quotas, history and the
//! report, campaigns.

use std::time::Duration;

use uuid::Uuid;

use super::*;
use crate::domain::{Domain, Outcome, ParseRules, RestartRequest, Status};
use crate::safety::limits::{self, Limits};

pub(crate) use crate::domain::testing::request;

mod campaigns;
mod claims;
mod disruption;
mod guards;
mod history;
mod identity;
mod outcomes;
mod quotas;
mod retries;
mod switch;

pub(crate) use campaigns::{
    a_campaign_is_read_back_as_recorded_and_only_once,
    a_campaign_stop_never_cancels_another_request_under_a_targets_id,
    a_stopped_campaigns_unissued_targets_are_cancelled_for_every_claim,
};
pub(crate) use claims::{
    a_host_is_never_claimed_for_two_requests_at_once,
    a_late_release_never_frees_another_deliverys_claim, a_released_claim_is_not_a_used_attempt,
    a_waiting_write_holds_its_request_once, claim_holds_and_unknown_outcomes_count,
    two_names_of_one_machine_are_one_host_to_every_counting_guard,
};
pub(crate) use disruption::{
    CLAIMS_EARLIER_SQL, SETTLE_PASSES_SQL, TIE_CLAIMS_SQL,
    a_claim_that_issued_nothing_never_hides_a_disrupted_host,
    a_restarted_host_counts_as_disrupted_until_settle_passes,
    every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption,
};
pub(crate) use guards::{
    STAMP_LATER_SQL, a_claim_stamped_after_now_still_cools_its_host,
    a_claim_that_waits_for_the_guards_locks_is_stamped_when_it_gets_them,
    counting_guards_are_decided_in_the_claim_and_journaled,
};
pub(crate) use history::{
    a_history_read_whole_is_the_history_listed,
    an_attempt_whose_outcome_was_lost_is_reported_unknown_not_in_flight,
    decisions_are_read_before_a_request_has_a_record,
    every_recorded_request_has_a_story_rejected_and_never_claimed_ones_too,
    prune_removes_old_final_entries_only_and_in_bounded_passes,
    recent_recoveries_are_the_groups_latest_verified_restarts,
    rejections_are_listed_but_never_count_as_the_request,
    the_report_reads_the_journal_and_the_verdicts_since_a_moment,
};
pub(crate) use identity::a_payload_under_another_requests_id_never_joins_it;
pub(crate) use outcomes::{
    every_final_status_is_kept, final_outcome_is_never_overwritten, outcome_details_are_kept,
    outcome_without_claim_creates_row, the_first_receipt_is_kept,
};
pub(crate) use quotas::{
    a_request_without_zone_or_requester_is_never_counted_in_them,
    the_requester_quota_and_the_zone_budget_count_across_groups_and_instances,
};
pub(crate) use retries::{
    a_retried_claim_whose_hold_ran_out_gets_the_same_attempt_held_anew,
    a_retried_claim_with_its_own_token_gets_the_same_attempt_and_writes_nothing,
};
pub(crate) use switch::{
    a_conditional_turn_of_the_switch_happens_only_as_expected,
    a_paused_group_defers_its_claims_only_until_resumed,
    the_kill_switch_stops_every_claim_until_resumed,
    the_leash_is_read_by_every_claim_and_turned_apart_from_the_switch,
};

const TERMS: ClaimTerms = ClaimTerms {
    max_attempts: 3,
    hold: Duration::from_secs(3600),
    limits: crate::safety::Limits::NONE,
};

/// Every contract behaviour, in order, on one store.
pub(crate) async fn all(store: &dyn Store) {
    final_outcome_is_never_overwritten(store).await;
    every_final_status_is_kept(store).await;
    outcome_without_claim_creates_row(store).await;
    claim_holds_and_unknown_outcomes_count(store).await;
    a_retried_claim_with_its_own_token_gets_the_same_attempt_and_writes_nothing(store).await;
    a_retried_claim_whose_hold_ran_out_gets_the_same_attempt_held_anew(store).await;
    a_released_claim_is_not_a_used_attempt(store).await;
    a_late_release_never_frees_another_deliverys_claim(store).await;
    a_waiting_write_holds_its_request_once(store).await;
    a_host_is_never_claimed_for_two_requests_at_once(store).await;
    two_names_of_one_machine_are_one_host_to_every_counting_guard(store).await;
    rejections_are_listed_but_never_count_as_the_request(store).await;
    outcome_details_are_kept(store).await;
    the_kill_switch_stops_every_claim_until_resumed(store).await;
    a_conditional_turn_of_the_switch_happens_only_as_expected(store).await;
    a_paused_group_defers_its_claims_only_until_resumed(store).await;
    recent_recoveries_are_the_groups_latest_verified_restarts(store).await;
    counting_guards_are_decided_in_the_claim_and_journaled(store).await;
    the_requester_quota_and_the_zone_budget_count_across_groups_and_instances(store, store).await;
    a_request_without_zone_or_requester_is_never_counted_in_them(store).await;
    the_first_receipt_is_kept(store).await;
    a_payload_under_another_requests_id_never_joins_it(store).await;
    the_report_reads_the_journal_and_the_verdicts_since_a_moment(store).await;
    an_attempt_whose_outcome_was_lost_is_reported_unknown_not_in_flight(store).await;
    prune_removes_old_final_entries_only_and_in_bounded_passes(store).await;
    a_campaign_is_read_back_as_recorded_and_only_once(store).await;
    a_stopped_campaigns_unissued_targets_are_cancelled_for_every_claim(store).await;
    a_campaign_stop_never_cancels_another_request_under_a_targets_id(store).await;
    decisions_are_read_before_a_request_has_a_record(store).await;
    every_recorded_request_has_a_story_rejected_and_never_claimed_ones_too(store).await;
    a_history_read_whole_is_the_history_listed(store).await;
    // Last: nothing unturns the leash, and the claims above expect none.
    the_leash_is_read_by_every_claim_and_turned_apart_from_the_switch(store).await;
}

/// A request of `group`, placed in `zone` and signed by `requester`, as
/// the worker hands it to the store.
fn request_of(
    instance: &str,
    group: &str,
    zone: Option<&str>,
    requester: Option<&str>,
) -> RestartRequest {
    let mut request = request(instance);
    request.group = Some(group.into());
    request.zone = zone.map(Into::into);
    request.requester = requester.map(Into::into);
    request
}

async fn entry(store: &dyn Store, id: Uuid) -> HistoryEntry {
    let history = store.history(1000).await.unwrap();
    history
        .into_iter()
        .find(|e| e.message_id == Some(id))
        .unwrap()
}
