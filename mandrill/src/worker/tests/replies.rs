//! Verdicts on a `reply_to`: published only where the policy admits it,
//! only once the final outcome is recorded, never for a request without
//! one.

use super::*;
use crate::safety::ReplyDestinations;

fn with_reply(instance: &str, reply_to: Option<&str>) -> (Uuid, Bytes) {
    let id = Uuid::new_v4();
    let mut json = serde_json::json!({ "message_id": id, "instance_name": instance });
    if let Some(reply_to) = reply_to {
        json["reply_to"] = reply_to.into();
    }
    (id, Bytes::from(json.to_string()))
}

fn replying_policy() -> Policy {
    Policy {
        eligibility: Eligibility::new(&["cattle-*".into()], &["cattle-db*".into()], true).unwrap(),
        reply_to: ReplyDestinations::new(&["verdicts.*".into()]).unwrap(),
        ..Policy::default()
    }
}

#[tokio::test(start_paused = true)]
async fn verdicts_go_only_to_an_allowed_reply_to_once_the_outcome_is_recorded() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(
        with_policy(replying_policy()),
        store.clone(),
        restarter.clone(),
    );
    let (restarted, body) = with_reply("cattle-ok", Some("verdicts.a"));
    h.broker.publish(body).await.unwrap();
    let (denied, body) = with_reply("cattle-db01", Some("verdicts.b"));
    h.broker.publish(body).await.unwrap();
    let (refused, body) = with_reply("cattle-x", Some("elsewhere.c"));
    h.broker.publish(body).await.unwrap();
    let (_, body) = with_reply("cattle-plain", None);
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("all acked", || stats.acked.get() == 4).await;
    let broker = h.broker.clone();
    h.stop().await.unwrap();

    // The one whose destination is not allowed: denied before anything
    // counted, nothing restarted, nothing published anywhere.
    let entry = store.entry(refused);
    assert_eq!(entry.status, Status::Denied);
    let why = entry.last_error.unwrap();
    assert!(
        why.contains("denied by reply_to") && why.contains("elsewhere.c"),
        "{why}"
    );
    assert_eq!(restarter.calls("cattle-x.example.net"), 0);

    let replies = broker.replies.lock().unwrap().clone();
    let mut heard: Vec<(String, serde_json::Value)> = replies
        .iter()
        .map(|(to, verdict)| (to.clone(), serde_json::from_slice(verdict).unwrap()))
        .collect();
    heard.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(heard.len(), 2, "{heard:?}");
    let (to, verdict) = &heard[0];
    assert_eq!(to, "verdicts.a");
    assert_eq!(verdict["message_id"], restarted.to_string());
    assert_eq!(verdict["status"], "restarted");
    assert_eq!(verdict["host"], "cattle-ok.example.net");
    assert_eq!(store.entry(restarted).status, Status::Restarted);
    let (to, verdict) = &heard[1];
    assert_eq!(to, "verdicts.b");
    assert_eq!(verdict["message_id"], denied.to_string());
    assert_eq!(verdict["status"], "denied");
    assert!(
        verdict["reason"].as_str().unwrap().contains("safety.deny"),
        "{verdict}"
    );
    assert_eq!(stats.replies_sent.get(), 2);
    assert_eq!(stats.replies_failed.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn no_verdict_is_published_for_an_outcome_the_store_refused() {
    let store = Arc::new(ScriptedStore {
        outcome_refused: AtomicBool::new(true),
        ..ScriptedStore::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(with_policy(replying_policy()), store.clone(), restarter);
    let (_, body) = with_reply("cattle-ok", Some("verdicts.a"));
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    let broker = h.broker.clone();
    h.stop().await.unwrap();
    assert!(broker.replies.lock().unwrap().is_empty());
    assert_eq!(stats.replies_sent.get(), 0);
}
