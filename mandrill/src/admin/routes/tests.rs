//! The routes' own tests: readiness, and the pages that must render while
//! the store hangs.

use async_trait::async_trait;
use bytes::Bytes;

use super::*;
use crate::broker::{
    Broker, BrokerError, Close, Consumer, Delivery, DeliveryTag, MemoryBroker, Publisher,
};
use crate::domain::Timestamp;
use crate::domain::{Outcome, RestartRequest, Status};
use crate::stats::Stats;
use crate::store::{
    Claim, ClaimTerms, Decision, GroupUsage, HistoryEntry, MemoryStore, Recorded, Store,
    StoreError, Story, Switch,
};
use crate::worker::Shutdown;
use uuid::Uuid;

/// A broker that cannot be reached.
struct Unreachable;

fn down<T>() -> Result<T, BrokerError> {
    Err(BrokerError::Unavailable("connection refused".into()))
}

impl Close for Unreachable {}

#[async_trait]
impl Publisher for Unreachable {
    async fn publish(&self, _: Bytes) -> Result<(), BrokerError> {
        down()
    }
}

#[async_trait]
impl Consumer for Unreachable {
    fn lease(&self) -> Option<Duration> {
        Some(Duration::from_secs(30))
    }
    async fn pull(&self, _: usize) -> Result<Vec<Delivery>, BrokerError> {
        down()
    }
    async fn ack(&self, _: &DeliveryTag) -> Result<(), BrokerError> {
        down()
    }
    async fn nack(&self, _: &DeliveryTag, _: Duration) -> Result<(), BrokerError> {
        down()
    }
    async fn extend(&self, _: &DeliveryTag) -> Result<(), BrokerError> {
        down()
    }
    async fn dead_letter(&self, _: &DeliveryTag, _: &str) -> Result<(), BrokerError> {
        down()
    }
    async fn backlog(&self) -> Result<Option<u64>, BrokerError> {
        down()
    }
}

fn state(broker: Arc<dyn Broker>) -> State {
    with_store(broker, Arc::new(MemoryStore::new()))
}

fn with_store(broker: Arc<dyn Broker>, store: Arc<dyn Store>) -> State {
    State {
        stats: Arc::new(Stats::default()),
        broker,
        store,
        shutdown: Shutdown::new(),
        token: None,
        switch_token: crate::settings::Secret("switch-token".into()),
        policy: crate::safety::PolicyHandle::default(),
        metrics: crate::admin::metrics::Exposition::new(),
        notifier: None,
        schedules: crate::schedule::Outlook::default(),
        instances_dir: None,
        redactor: crate::config::Redactor::default(),
    }
}

#[tokio::test]
async fn not_ready_names_the_broker_the_store_and_shutdown() {
    let memory = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let up = state(memory);
    assert_eq!(not_ready(&up).await, None);
    up.stats.store_down.inc();
    assert_eq!(not_ready(&up).await, Some("store unreachable"));
    up.shutdown.request();
    assert_eq!(not_ready(&up).await, Some("shutting down"));
    let cut_off = state(Arc::new(Unreachable));
    assert_eq!(not_ready(&cut_off).await, Some("broker unreachable"));
}

/// A store whose reads for the pages never answer (a database that accepts
/// connections and then hangs); every other call is the memory store's.
struct Hanging(MemoryStore);

#[async_trait]
impl Store for Hanging {
    async fn lookup(&self, id: Uuid) -> Result<Option<Status>, StoreError> {
        self.0.lookup(id).await
    }
    async fn claim_restart(
        &self,
        r: &RestartRequest,
        terms: ClaimTerms,
        token: crate::store::ClaimToken,
    ) -> Result<Claim, StoreError> {
        self.0.claim_restart(r, terms, token).await
    }
    async fn record_outcome(
        &self,
        r: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        self.0.record_outcome(r, attempt, outcome).await
    }
    async fn release_claim(
        &self,
        r: &RestartRequest,
        attempt: u32,
        token: crate::store::ClaimToken,
    ) -> Result<(), StoreError> {
        self.0.release_claim(r, attempt, token).await
    }
    async fn record_rejection(
        &self,
        asked: &crate::domain::Asked,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.0.record_rejection(asked, reason, payload).await
    }
    async fn history(&self, _: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        std::future::pending().await
    }
    async fn record_decision(
        &self,
        r: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<crate::store::Recorded, StoreError> {
        self.0.record_decision(r, attempt, decision).await
    }
    async fn story(&self, id: Uuid) -> Result<Option<Story>, StoreError> {
        self.0.story(id).await
    }
    async fn group_usage(
        &self,
        _: crate::store::UsageStarts,
    ) -> Result<std::collections::BTreeMap<String, GroupUsage>, StoreError> {
        std::future::pending().await
    }
    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        self.0.first_received(request).await
    }
    async fn deferrals(&self, id: Uuid) -> Result<u32, StoreError> {
        self.0.deferrals(id).await
    }
    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        self.0.prune(before, max_rows).await
    }
    async fn switch(&self) -> Result<Switch, StoreError> {
        std::future::pending().await
    }
    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        self.0.set_switch(paused, by, reason).await
    }

    async fn set_switch_if(
        &self,
        expected: crate::store::SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        self.0.set_switch_if(expected, paused, by, reason).await
    }
}

/// The body of a response, as text.
async fn text(response: Response) -> (StatusCode, String) {
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("an in-memory body");
    (status, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

#[tokio::test(start_paused = true)]
async fn metrics_and_the_dashboard_render_while_the_store_hangs() {
    let memory = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let state = Arc::new(with_store(memory, Arc::new(Hanging(MemoryStore::new()))));
    state.stats.acked.inc();
    // Far past the pages' own bound: the clock is paused, so a page that
    // waits for the store forever reaches this instead of hanging the test,
    // and the time each page took is exact.
    let patience = Duration::from_secs(600);
    let started = tokio::time::Instant::now();
    let metrics = tokio::time::timeout(patience, metrics(Shared(state.clone())))
        .await
        .expect("/metrics answers without the store");
    assert!(started.elapsed() <= crate::admin::STORE_TIMEOUT);
    let (status, body) = text(metrics).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("mandrill_"), "{body}");
    let started = tokio::time::Instant::now();
    let page = tokio::time::timeout(
        patience,
        crate::admin::dashboard::serve(Shared(state), axum::http::HeaderMap::new()),
    )
    .await
    .expect("the dashboard answers without the store");
    // One bound for the page, not one per read (history, then the switch).
    assert!(started.elapsed() <= crate::admin::STORE_TIMEOUT);
    let (status, body) = text(page).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("No history: the store did not answer"),
        "{body}"
    );
}

/// A victim is a host name: with `admin.token` set, only a caller that
/// sends it sees the planned restarts (none configured: nothing to hide);
/// a slot's message id only that caller, never anyone without a token.
#[tokio::test]
async fn planned_restarts_are_shown_only_to_those_the_token_admits_and_slot_ids_only_with_one() {
    use crate::schedule::{Outlook, Plan, ScheduleSettings, Scheduled};
    let memory = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let mut state = state(memory);
    assert!(planned(&state, false).unwrap().is_empty());
    let settings = ScheduleSettings {
        name: "drip".into(),
        group: "cattle".into(),
        mean_time_between: Duration::from_secs(600),
        requester: None,
        key_file: None,
        max_lateness: crate::schedule::DEFAULT_MAX_LATENESS,
    };
    let scheduled = Scheduled {
        plan: Plan::new(&settings, b"seed"),
        signer: None,
    };
    state.schedules = Outlook::new(vec![scheduled], crate::domain::Domain::default());
    let hidden = planned(&state, false).unwrap_err();
    assert!(hidden.contains("admin.token"), "{hidden}");
    let shown = planned(&state, true).unwrap();
    assert_eq!((shown[0].name.as_str(), shown[0].next.len()), ("drip", 3));
    // No inventory to draw from: no victim, said as none.
    assert!(shown[0].next.iter().all(|slot| slot.victim.is_none()));
    // Without admin.token nobody proves who they are: no slot's id, which
    // could be published first, is shown.
    assert!(shown[0].next.iter().all(|slot| slot.message_id.is_none()));
    let json = serde_json::to_value(&shown).unwrap();
    assert!(json[0]["next"][0].get("message_id").is_none(), "{json}");
    // A caller that sent the token sees them.
    state.token = Some(crate::settings::Secret("admin-token".into()));
    let shown = planned(&state, true).unwrap();
    assert!(shown[0].next.iter().all(|slot| slot.message_id.is_some()));
}

/// `POST /api/campaigns/{id}/stop` takes what the pause endpoints take (a
/// token always, JSON `{"reason", "by"}`, `by` defaulting to `admin-api`):
/// the targets not yet issued are recorded cancelled with who and why, and
/// `GET /api/campaigns/{id}` (behind `admin.token`) then shows the
/// campaign judged, as `campaign status --json` prints it.
#[tokio::test]
async fn a_campaign_is_stopped_with_the_pause_endpoints_token_and_body() {
    use crate::admin::campaigns;
    use crate::store::{Campaign, CampaignTarget};
    let memory = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let state = Arc::new(state(memory));
    let campaign = Campaign {
        id: Uuid::new_v4(),
        group: "cattle".into(),
        created_at: Timestamp::now(),
        requester: Some("chaos".into()),
        targets: vec![CampaignTarget {
            instance_name: "cattle-01".into(),
            message_id: Uuid::new_v4(),
            due_at: Timestamp::now(),
        }],
        stopped: None,
    };
    state.store.record_campaign(&campaign).await.unwrap();
    let path = || Path(campaign.id.to_string());
    let body = Bytes::from_static(br#"{"reason":"game day over"}"#);
    let mut headers = HeaderMap::new();
    let refused = campaigns::stop(Shared(state.clone()), path(), headers.clone(), body.clone());
    assert_eq!(refused.await.status(), StatusCode::UNAUTHORIZED);
    let unstopped = state.store.campaign(campaign.id).await.unwrap().unwrap();
    assert_eq!(unstopped.stopped, None, "refused: nothing stopped");
    headers.insert(
        header::AUTHORIZATION,
        "Bearer switch-token".parse().unwrap(),
    );
    let (status, answer) =
        text(campaigns::stop(Shared(state.clone()), path(), headers.clone(), body.clone()).await)
            .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["stopped"]["by"], "admin-api");
    assert_eq!(answer["stopped"]["reason"], "game day over");
    assert_eq!(answer["verdict"], "cancelled");
    assert_eq!(answer["targets"][0]["state"], "cancelled");
    assert_eq!(
        answer["cancelled"][0],
        campaign.targets[0].message_id.to_string()
    );
    let (status, shown) = text(campaigns::status(Shared(state.clone()), path()).await).await;
    assert_eq!(status, StatusCode::OK);
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["verdict"], "cancelled");
    assert_eq!(shown["stopped"]["by"], "admin-api");
    let unknown = Path(Uuid::new_v4().to_string());
    let missing = campaigns::stop(Shared(state.clone()), unknown, headers.clone(), body);
    assert_eq!(missing.await.status(), StatusCode::NOT_FOUND);
    let bad = campaigns::stop(Shared(state), Path("nope".into()), headers, Bytes::new());
    assert_eq!(bad.await.status(), StatusCode::BAD_REQUEST);
}

/// A resume while nothing is paused records nothing (no notifier hears
/// `resumed` of a switch never on), as `mandrill resume`; an unleash with
/// a blank reason is refused, as one with none.
#[tokio::test]
async fn a_resume_of_nothing_records_nothing_and_a_blank_reason_does_not_unleash() {
    use crate::admin::switch;
    let memory = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let state = Arc::new(state(memory));
    let mut headers = HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        "Bearer switch-token".parse().unwrap(),
    );
    let body = Bytes::from_static(br#"{"reason":"all clear","by":"ana"}"#);
    let (status, answer) =
        text(switch::resume(Shared(state.clone()), headers.clone(), body).await).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.contains("nothing was paused"), "{answer}");
    let untouched = state.store.switch().await.unwrap();
    assert_eq!(
        (untouched.paused, untouched.by, untouched.reason),
        (false, None, None),
        "no turn recorded"
    );

    for blank in [&br#"{"reason":"   "}"#[..], br#"{"reason":""}"#] {
        let blank = Bytes::copy_from_slice(blank);
        let (status, answer) =
            text(switch::unleash(Shared(state.clone()), headers.clone(), blank).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(answer.contains("needs a reason"), "{answer}");
    }
    assert_eq!(state.store.switch().await.unwrap().leash, None);
}

/// `/api/status` says which inventory copy the instance decides with and
/// why the last read was not taken: a refresh that lost most of the fleet
/// is refused, and the operator sees it there, not only in the log.
#[tokio::test]
async fn status_shows_a_refused_inventory_refresh() {
    use crate::inventory::{InventoryHandle, Source, load, web_hosts_file};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hosts.toml");
    let settings = web_hosts_file(&file, 10);
    let source = Source::of(&settings).unwrap();
    let handle = InventoryHandle::new(load(&source, &settings).await.unwrap(), &source, &settings);
    web_hosts_file(&file, 2);
    handle.refresh(&source, &settings).await;
    let memory = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let mut state = state(memory);
    state.policy = crate::safety::PolicyHandle::new(crate::safety::Policy {
        inventory: Some(handle),
        ..crate::safety::Policy::default()
    });
    state.token = Some(crate::settings::Secret("admin-token".into()));
    let state = Arc::new(state);
    let ask = |headers: HeaderMap| {
        let state = Arc::clone(&state);
        async move {
            let (code, body) = text(status(Shared(state), headers).await).await;
            assert_eq!(code, StatusCode::OK);
            serde_json::from_str::<serde_json::Value>(&body).unwrap()["inventory"].clone()
        }
    };
    let mut bearer = HeaderMap::new();
    bearer.insert(
        axum::http::header::AUTHORIZATION,
        "Bearer admin-token".parse().unwrap(),
    );
    let inventory = ask(bearer).await;
    assert_eq!(inventory["hosts"], 10, "{inventory}");
    assert_eq!(inventory["refresh_failures"], 1, "{inventory}");
    let why = inventory["last_error"].as_str().unwrap();
    assert!(
        why.contains("lists 2 hosts where the copy in force has 10"),
        "{why}"
    );
    // Without the token the counts are shown, not the words, which can
    // name hosts and paths.
    let inventory = ask(HeaderMap::new()).await;
    assert_eq!(inventory["hosts"], 10, "{inventory}");
    assert_eq!(inventory["refresh_failures"], 1, "{inventory}");
    assert!(inventory["last_error"]["hidden"].is_string(), "{inventory}");
    assert!(inventory["source"]["hidden"].is_string(), "{inventory}");
}
