//! What the store reads back: decisions, rejections, recoveries and the
//! report; and what pruning removes.
//!
//! One promise a function, each read alone; one file past 400 lines.

use super::*;

/// A request deferred before any claim has no record of its own, only its
/// decisions: they are read all the same, oldest first.
pub(crate) async fn decisions_are_read_before_a_request_has_a_record(store: &dyn Store) {
    let deferred = request("cattle-0d01");
    assert_eq!(store.decisions(deferred.message_id).await.unwrap(), vec![]);
    for reason in [
        "deferred by not_before: first",
        "deferred by calendar: second",
    ] {
        let decision = Decision {
            verdict: "deferred",
            guard: reason.split(' ').nth(2).unwrap().trim_end_matches(':'),
            reason,
        };
        store.record_decision(&deferred, 0, decision).await.unwrap();
    }
    // The first decision records the request (who asked is bound from
    // its first record), received and never claimed.
    let story = store.story(deferred.message_id).await.unwrap().unwrap();
    assert_eq!(
        (story.entry.status, story.entry.attempts),
        (Status::Received, 0)
    );
    let decisions = store.decisions(deferred.message_id).await.unwrap();
    let read: Vec<(&str, &str)> = decisions
        .iter()
        .map(|d| (d.guard.as_str(), d.reason.as_str()))
        .collect();
    assert_eq!(
        read,
        [
            ("not_before", "deferred by not_before: first"),
            ("calendar", "deferred by calendar: second")
        ]
    );
    assert!(
        decisions
            .iter()
            .all(|d| d.verdict == "deferred" && d.attempt == 0)
    );
    // `history --json` reads every entry's decisions with it: the same.
    let mut told = Vec::new();
    store
        .each_history(1000, true, &mut |entry, decided| {
            told.push((entry, decided));
            true
        })
        .await
        .unwrap();
    let listed: Vec<_> = told
        .iter()
        .filter(|(entry, _)| entry.message_id == Some(deferred.message_id))
        .collect();
    assert_eq!(listed.len(), 1, "{told:?}");
    assert_eq!(listed[0].1, decisions);
}

/// `explain` tells every recorded request's story: a rejected payload's
/// (nothing attempted), and a request deferred and never claimed, which has
/// only the guards' verdicts; a request's own record wins over a payload
/// rejected under its id.
pub(crate) async fn every_recorded_request_has_a_story_rejected_and_never_claimed_ones_too(
    store: &dyn Store,
) {
    let rejected = Uuid::new_v4();
    store
        .record_rejection(
            &crate::domain::Asked {
                message_id: Some(rejected),
                ..crate::domain::Asked::default()
            },
            "instance_name \"X\" is bad",
            b"{}",
        )
        .await
        .unwrap();
    let story = store
        .story(rejected)
        .await
        .unwrap()
        .expect("a rejection's story");
    assert_eq!(story.entry.message_id, Some(rejected));
    assert_eq!(story.entry.status, Status::Rejected);
    assert_eq!(story.entry.attempts, 0, "nothing was attempted");
    assert_eq!(
        story.entry.last_error.as_deref(),
        Some("instance_name \"X\" is bad")
    );
    assert!(story.attempts.is_empty());
    let listed = entry(store, rejected).await;
    assert_eq!(listed.attempts, 0, "history agrees: nothing was attempted");
    assert!(
        story.explain().contains("rejected (0 attempts)"),
        "{}",
        story.explain()
    );

    let waiting = request("cattle-0d02");
    let decision = Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "deferred by calendar: closed",
    };
    store.record_decision(&waiting, 0, decision).await.unwrap();
    let story = store
        .story(waiting.message_id)
        .await
        .unwrap()
        .expect("a never-claimed request's story");
    assert_eq!(story.entry.status, Status::Received);
    assert_eq!(story.entry.attempts, 0);
    assert_eq!(story.decisions.len(), 1);
    let told = story.explain();
    assert!(told.contains("deferred by calendar: closed"), "{told}");
    assert!(told.contains("never claimed"), "{told}");

    // A valid request under a rejected payload's id: its own story.
    let mut valid = request("cattle-0d03");
    valid.message_id = rejected;
    store
        .claim_restart(&valid, TERMS, ClaimToken::new())
        .await
        .unwrap();
    let story = store.story(rejected).await.unwrap().unwrap();
    assert_eq!(story.entry.status, Status::Received);
    assert_eq!(story.entry.instance_name.as_deref(), Some("cattle-0d03"));
    assert_eq!(story.attempts.len(), 1);
    assert_eq!(store.story(Uuid::new_v4()).await.unwrap(), None);
    // Settled as issuing nothing, so that no claim is left in flight for
    // the checks that follow the contract.
    let dry = Outcome::DryRun {
        action: "would restart".into(),
    };
    store.record_outcome(&valid, 1, &dry).await.unwrap();
}

pub(crate) async fn rejections_are_listed_but_never_count_as_the_request(store: &dyn Store) {
    store
        .record_rejection(
            &crate::domain::Asked::default(),
            "payload is not a valid request",
            b"garbage",
        )
        .await
        .unwrap();
    let valid = request("cattle-0005");
    let id = valid.message_id;
    store
        .record_rejection(
            &crate::domain::Asked {
                message_id: Some(id),
                ..crate::domain::Asked::default()
            },
            "instance_name \"X\" is bad",
            b"{}",
        )
        .await
        .unwrap();
    let history = store.history(100).await.unwrap();
    let rejected: Vec<_> = history
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .collect();
    assert_eq!(rejected.len(), 2);
    assert!(rejected.iter().any(|e| e.message_id == Some(id)));
    // A malformed payload that carried this id does not make a later
    // valid request with the same id count as done.
    assert_eq!(store.lookup(id).await.unwrap(), None);
    assert_eq!(
        store
            .claim_restart(&valid, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None,
            leashed: None,
        }
    );
}

/// A group's verified restarts, newest first: each recovery time, or
/// `None` for a host that never came back; restarts nobody probed, failed
/// ones and other groups' are not among them.
pub(crate) async fn recent_recoveries_are_the_groups_latest_verified_restarts(store: &dyn Store) {
    let verified = |secs: u64| {
        Outcome::Restarted(crate::domain::Restarted {
            recovered_after: Some(Duration::from_secs(secs)),
            output: None,
        })
    };
    let outcomes = [
        ("recov-0001", verified(10)),
        ("recov-0002", Outcome::restarted()),
        (
            "recov-0003",
            Outcome::Unrecovered {
                error: "probe never passed".into(),
                output: None,
            },
        ),
        (
            "recov-0004",
            Outcome::Failed {
                error: "refused".into(),
            },
        ),
        ("elsewhere-0001", verified(1)),
        ("recov-0005", verified(30)),
    ];
    for (instance, outcome) in outcomes {
        let request = request(instance);
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap();
        store.record_outcome(&request, 1, &outcome).await.unwrap();
        // Claims a millisecond apart at least: newest first is then one order.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        store.recent_recoveries("recov", 10).await.unwrap(),
        [
            Some(Duration::from_secs(30)),
            None,
            Some(Duration::from_secs(10))
        ]
    );
    assert_eq!(
        store.recent_recoveries("recov", 2).await.unwrap(),
        [Some(Duration::from_secs(30)), None]
    );
    assert!(
        store
            .recent_recoveries("nobody", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// An attempt whose outcome was never recorded (the handler died after
/// issuing it) is in flight only while its request has not gone on: once
/// a later attempt is claimed, or the request ends, its outcome is lost
/// (the restart may have run), and the report says so rather than count a
/// restart running on the host for good.
pub(crate) async fn an_attempt_whose_outcome_was_lost_is_reported_unknown_not_in_flight(
    store: &dyn Store,
) {
    let since = Timestamp::from_millis(Timestamp::now().as_millis() - 1);
    let expired = ClaimTerms {
        hold: Duration::ZERO,
        ..TERMS
    };
    let lost = request_of("tally-0101", "tally", None, None);
    let running = request_of("tally-0102", "tally", None, None);
    store
        .claim_restart(&lost, expired, ClaimToken::new())
        .await
        .unwrap();
    store
        .claim_restart(&running, TERMS, ClaimToken::new())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let again = store
        .claim_restart(&lost, expired, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(
            again,
            Claim::Claimed {
                attempt: 2,
                unknown: Some(1),
                ..
            }
        ),
        "{again:?}"
    );
    store
        .record_outcome(&lost, 2, &Outcome::restarted())
        .await
        .unwrap();
    let report = store.report(since).await.unwrap();
    let mut attempts: Vec<_> = report
        .attempts
        .iter()
        .filter(|a| [lost.message_id, running.message_id].contains(&a.message_id))
        .map(|a| (a.instance_name.as_str(), a.attempt, a.outcome, a.lost))
        .collect();
    attempts.sort_by_key(|a| (a.0, a.1));
    assert_eq!(
        attempts,
        [
            ("tally-0101", 1, None, true),
            ("tally-0101", 2, Some(Status::Restarted), false),
            ("tally-0102", 1, None, false),
        ]
    );
}

/// `report(since)` lists the attempts claimed since then with their
/// outcome, group and requester, the recovery time and last error on a
/// request's latest attempt only, and the verdicts recorded since then
/// with the request's host, requester and group where the store knows
/// them; nothing from before `since`.
pub(crate) async fn the_report_reads_the_journal_and_the_verdicts_since_a_moment(
    store: &dyn Store,
) {
    let before = request_of("tally-0001", "tally", None, Some("ci"));
    store
        .claim_restart(&before, TERMS, ClaimToken::new())
        .await
        .unwrap();
    store
        .record_outcome(&before, 1, &Outcome::restarted())
        .await
        .unwrap();
    // A moment after the first claim's stamp, and well before the next
    // claims' (a store's clock may read a millisecond or two behind the
    // wall clock).
    let claimed = store.story(before.message_id).await.unwrap().unwrap();
    let since = Timestamp::from_millis(claimed.attempts[0].claimed_at.as_millis() + 1);
    while Timestamp::now().as_millis() < since.as_millis() + 20 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let retried = request_of("tally-0002", "tally", None, Some("ci"));
    for attempt in 1..=2 {
        store
            .claim_restart(&retried, TERMS, ClaimToken::new())
            .await
            .unwrap();
        let outcome = if attempt == 1 {
            Outcome::Retrying {
                error: "ssh: timeout".into(),
            }
        } else {
            Outcome::Restarted(crate::domain::Restarted {
                recovered_after: Some(Duration::from_millis(4_500)),
                output: None,
            })
        };
        store
            .record_outcome(&retried, attempt, &outcome)
            .await
            .unwrap();
    }
    let lost = request_of("tally-0003", "tally", None, None);
    store
        .claim_restart(&lost, TERMS, ClaimToken::new())
        .await
        .unwrap();
    let unrecovered = Outcome::Unrecovered {
        error: "<b>not healthy</b> after 60s".into(),
        output: None,
    };
    store.record_outcome(&lost, 1, &unrecovered).await.unwrap();
    let deferred = Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "closed until monday",
    };
    store.record_decision(&lost, 0, deferred).await.unwrap();
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"tally-0004","requested_by":"mallory"}}"#,
        Uuid::new_v4()
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    let denied = RestartRequest::parse(payload.as_bytes(), &rules).unwrap();
    let denial = Decision {
        verdict: "denied",
        guard: "eligibility",
        reason: "<script>deny-listed</script>",
    };
    store.record_decision(&denied, 0, denial).await.unwrap();
    let reason = "<script>deny-listed</script>".to_owned();
    store
        .record_outcome(&denied, 0, &Outcome::Denied { reason })
        .await
        .unwrap();

    let report = store.report(since).await.unwrap();
    let ours = [before.message_id, retried.message_id, lost.message_id];
    let mut attempts: Vec<_> = report
        .attempts
        .iter()
        .filter(|a| ours.contains(&a.message_id))
        .map(|a| {
            (
                a.instance_name.as_str(),
                a.attempt,
                a.group.as_str(),
                a.requester.as_deref(),
                a.outcome,
                a.settled_at.is_some(),
                a.recovered_after,
                a.last_error.as_deref(),
            )
        })
        .collect();
    // In claim order; claims within one millisecond in any order.
    attempts.sort_by_key(|a| (a.0, a.1));
    assert_eq!(
        attempts,
        [
            (
                "tally-0002",
                1,
                "tally",
                Some("ci"),
                Some(Status::Retrying),
                true,
                None,
                None
            ),
            (
                "tally-0002",
                2,
                "tally",
                Some("ci"),
                Some(Status::Restarted),
                true,
                Some(Duration::from_millis(4_500)),
                None
            ),
            (
                "tally-0003",
                1,
                "tally",
                None,
                Some(Status::Unrecovered),
                true,
                None,
                Some("<b>not healthy</b> after 60s")
            ),
        ]
    );
    let mut decisions: Vec<_> = report
        .decisions
        .iter()
        .filter(|d| [lost.message_id, denied.message_id].contains(&d.message_id))
        .map(|d| {
            (
                d.verdict.as_str(),
                d.guard.as_str(),
                d.reason.as_str(),
                d.instance_name.as_deref(),
                d.group.as_deref(),
                d.requested_by.as_deref(),
            )
        })
        .collect();
    // Both recorded within a millisecond or not: in time order, ties in
    // any order.
    decisions.sort();
    assert_eq!(
        decisions,
        [
            (
                "deferred",
                "calendar",
                "closed until monday",
                Some("tally-0003"),
                Some("tally"),
                None
            ),
            (
                "denied",
                "eligibility",
                "<script>deny-listed</script>",
                Some("tally-0004"),
                None,
                // Unsigned: free text, marked as such wherever it is shown.
                Some("mallory (unverified)")
            ),
        ]
    );
    let later = Timestamp::from_millis(Timestamp::now().as_millis() + 3_600_000);
    assert_eq!(store.report(later).await.unwrap(), ReportData::default());
}

pub(crate) async fn prune_removes_old_final_entries_only_and_in_bounded_passes(store: &dyn Store) {
    let before = store.history(1000).await.unwrap();
    let finals = before.iter().filter(|e| e.status.is_final()).count();
    let open = before.len() - finals;
    assert!(
        finals >= 3,
        "the earlier contract steps leave final entries"
    );
    // Nothing completed a day ago or earlier: nothing to prune.
    let yesterday = Timestamp::from_millis(Timestamp::now().as_millis() - 86_400_000);
    assert_eq!(store.prune(yesterday, 1000).await.unwrap(), 0);
    let tomorrow = Timestamp::from_millis(Timestamp::now().as_millis() + 86_400_000);
    assert_eq!(store.prune(tomorrow, 2).await.unwrap(), 2);
    let rest = u64::try_from(finals - 2).unwrap();
    assert_eq!(store.prune(tomorrow, 1000).await.unwrap(), rest);
    let after = store.history(1000).await.unwrap();
    assert_eq!(after.len(), open);
    assert!(after.iter().all(|e| !e.status.is_final()));
    // Nothing of the pruned requests is left behind: no journal rows (every
    // one was claimed before `tomorrow`), no deferral counts.
    let epoch = Timestamp::from_millis(0);
    assert_eq!(
        store
            .group_usage(crate::store::UsageStarts::since(epoch))
            .await
            .unwrap(),
        std::collections::BTreeMap::new()
    );
    for pruned in before.iter().filter(|e| e.status.is_final()) {
        if let Some(id) = pruned.message_id {
            assert_eq!(store.deferrals(id).await.unwrap(), 0, "{pruned:?}");
        }
    }
}

/// `history` read whole (`each_history`, page by page: a page is 7
/// entries in tests) tells the entries `history` lists, in its order, each
/// with its own decisions; a payload rejected under a request's id
/// carries none of that request's; a false answer stops the read.
pub(crate) async fn a_history_read_whole_is_the_history_listed(store: &dyn Store) {
    let decided = request("cattle-0d04");
    let decision = Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "deferred by calendar: closed",
    };
    store.record_decision(&decided, 0, decision).await.unwrap();
    let asked = crate::domain::Asked {
        message_id: Some(decided.message_id),
        ..crate::domain::Asked::default()
    };
    store
        .record_rejection(&asked, "asks another host under its id", b"{}")
        .await
        .unwrap();
    let everything = store.history(1000).await.unwrap();
    assert!(
        everything.len() > 15,
        "more than two pages: {}",
        everything.len()
    );
    for limit in [0, 1, 7, 8, 15, 1000] {
        for with_decisions in [true, false] {
            let mut told = Vec::new();
            store
                .each_history(limit, with_decisions, &mut |entry, decisions| {
                    told.push((entry, decisions));
                    true
                })
                .await
                .unwrap();
            let entries: Vec<&HistoryEntry> = told.iter().map(|(entry, _)| entry).collect();
            let listed = store.history(limit).await.unwrap();
            assert_eq!(entries, listed.iter().collect::<Vec<_>>(), "limit {limit}");
            for (entry, decisions) in &told {
                let own = match entry.message_id {
                    Some(id) if with_decisions && entry.status != Status::Rejected => {
                        store.decisions(id).await.unwrap()
                    }
                    _ => Vec::new(),
                };
                assert_eq!(decisions, &own, "{entry:?}");
            }
        }
    }
    let mut told = Vec::new();
    store
        .each_history(1000, true, &mut |entry, decisions| {
            if entry.message_id == Some(decided.message_id) {
                told.push((entry.status, decisions.len()));
            }
            true
        })
        .await
        .unwrap();
    told.sort_by_key(|(status, _)| status.as_str());
    assert_eq!(told, [(Status::Received, 1), (Status::Rejected, 0)]);
    let mut count = 0;
    store
        .each_history(1000, true, &mut |_, _| {
            count += 1;
            count < 3
        })
        .await
        .unwrap();
    assert_eq!(count, 3, "a false answer stops the read");
}
