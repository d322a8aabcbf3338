//! The checks right before the restart, after the stop conditions: a
//! reload (SIGHUP) or an inventory refresh that lands while they run is
//! honoured. Each test serves the stop condition's HTTP probe itself and
//! changes the policy before answering healthy.

use std::time::SystemTime;

use super::*;
use crate::domain::{SigningKey, WireRequest};
use crate::inventory::{Inventory, InventoryHandle, InventorySettings, Keys, Source};
use crate::safety::{Clock, RequesterSettings, Requesters, StopConditions};

/// Serves a stop condition's HTTP probe, always healthy; before it answers
/// the first probe it runs `meanwhile`, as a reload or an inventory
/// refresh landing while the stop conditions run.
pub(super) async fn probe_that_first(
    meanwhile: impl FnOnce() + Send + 'static,
) -> (StopConditions, JoinHandle<()>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/healthy", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let mut meanwhile = Some(meanwhile);
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_http_request(&mut socket).await;
            if let Some(meanwhile) = meanwhile.take() {
                meanwhile();
            }
            let healthy = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            socket.write_all(healthy).await.unwrap();
        }
    });
    let alerts = http_stop_condition(url);
    (alerts, server)
}

/// Runs a worker under `policy` with a stop condition whose probe puts
/// `reloaded(stop conditions)` in force before it answers healthy.
async fn reload_while_the_stop_conditions_run(
    policy: Policy,
    reloaded: impl FnOnce(StopConditions) -> Policy + Send + 'static,
    restarter: ScriptedRestarter,
) -> (
    Harness,
    Arc<ScriptedStore>,
    Arc<ScriptedRestarter>,
    JoinHandle<()>,
) {
    let handle = PolicyHandle::new(Policy::default());
    let reload = handle.clone();
    let (stop_conditions, server) = probe_that_first(move || {
        let current = reload.current();
        reload.replace(reloaded(current.stop_conditions.clone()));
    })
    .await;
    handle.replace(Policy {
        stop_conditions,
        ..policy
    });
    let config = WorkerConfig {
        policy: handle,
        ..config()
    };
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(restarter);
    let h = start(config, store.clone(), restarter.clone());
    (h, store, restarter, server)
}

/// Waits until request `id` is recorded denied after its claim, and returns
/// the reason.
async fn denied_after_the_claim(
    h: Harness,
    store: &ScriptedStore,
    restarter: &ScriptedRestarter,
    server: JoinHandle<()>,
    id: Uuid,
) -> String {
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(stats.denied.get(), 1);
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Denied);
    assert_eq!(entry.attempts, 1, "recorded against the claimed attempt");
    server.abort();
    h.stop().await.unwrap();
    entry.last_error.unwrap_or_default()
}

/// A deny pattern a SIGHUP adds while the stop conditions run stops the
/// restart: the kill switch is not the only thing read after them.
#[tokio::test(start_paused = true)]
async fn a_deny_added_by_a_reload_while_the_stop_conditions_run_stops_the_restart() {
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        Policy::default(),
        |stop_conditions| Policy {
            eligibility: Eligibility::new(&[], &["cattle-db*".into()], false).unwrap(),
            stop_conditions,
            ..Policy::default()
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = h.publish("cattle-db01").await;
    let reason = denied_after_the_claim(h, &store, &restarter, server, id).await;
    assert!(reason.contains("cattle-db*"), "{reason}");
}

const ALICE_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAiXnPth0YTU/nwanl6fRVhSdyP7GowJ3i9meT7iYSEjw=
-----END PUBLIC KEY-----
";
const ALICE_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJKZIohg0kTgT0r1qaO/WUCF0GokEli8bJBBjTpGeOvA
-----END PRIVATE KEY-----
";

/// A requester a SIGHUP removes from `[[requesters]]` while the stop
/// conditions run is not obeyed: its request, verified at parse, is denied
/// right before the restart.
#[tokio::test(start_paused = true)]
async fn a_requester_removed_by_a_reload_while_the_stop_conditions_run_is_denied() {
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        Policy {
            requesters: alice_with(ALICE_PUBLIC),
            ..Policy::default()
        },
        |stop_conditions| Policy {
            requesters: Arc::new(Requesters::new(&[], false).unwrap()),
            stop_conditions,
            ..Policy::default()
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = Uuid::new_v4();
    h.broker
        .publish(signed_by_alice(id, "cattle-signed"))
        .await
        .unwrap();
    let reason = denied_after_the_claim(h, &store, &restarter, server, id).await;
    assert!(reason.contains("requester alice is no longer"), "{reason}");
}

/// A token signed as alice, for `instance`, valid for an hour from now.
fn signed_by_alice(id: Uuid, instance: &str) -> Bytes {
    let wire = WireRequest {
        message_id: id.to_string(),
        instance_name: instance.into(),
        ..WireRequest::default()
    };
    let token = SigningKey::from_pem(ALICE_PRIVATE)
        .unwrap()
        .sign(&wire, "alice", SystemTime::now(), Duration::from_secs(3600))
        .unwrap();
    Bytes::from(token)
}

/// alice with `public_key`, allowed `cattle-*`.
fn alice_with(public_key: &str) -> Arc<Requesters> {
    let alice = RequesterSettings {
        name: "alice".into(),
        public_key: Some(public_key.into()),
        public_key_file: None,
        allow: vec!["cattle-*".into()],
        groups: Vec::new(),
        quota: None,
    };
    Arc::new(Requesters::new(&[alice], false).unwrap())
}

/// Another public key (P-256) that a reload puts in place of alice's.
const ROTATED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEZpcC+wXjHJWk+hudTxVEj/SobKJ8
w05iow7Fx4RuGrwsPegFABmbHNE9Zuyf1LKSs8IrDZAP7MMxt/hP19EaZw==
-----END PUBLIC KEY-----
";

/// Replacing a requester's key revokes it for every decision made after
/// the reload: a request signed with the old key, verified at its parse,
/// is denied right before the restart though alice is still configured.
#[tokio::test(start_paused = true)]
async fn a_key_replaced_by_a_reload_while_the_stop_conditions_run_is_not_obeyed() {
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        Policy {
            requesters: alice_with(ALICE_PUBLIC),
            ..Policy::default()
        },
        |stop_conditions| Policy {
            requesters: alice_with(ROTATED_PUBLIC),
            stop_conditions,
            ..Policy::default()
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = Uuid::new_v4();
    h.broker
        .publish(signed_by_alice(id, "cattle-signed"))
        .await
        .unwrap();
    let reason = denied_after_the_claim(h, &store, &restarter, server, id).await;
    assert!(reason.contains("replaced by a reload"), "{reason}");
}

/// A token whose `exp` passes while its claim waits (here the stop
/// conditions, with the guards' clock two hours on when they answer) is
/// not restarted: `exp` is read again right before the restart.
#[tokio::test(start_paused = true)]
async fn a_token_that_expires_while_the_stop_conditions_run_is_not_obeyed() {
    let later =
        jiff::Timestamp::try_from(SystemTime::now() + Duration::from_secs(2 * 3600)).unwrap();
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        Policy {
            requesters: alice_with(ALICE_PUBLIC),
            ..Policy::default()
        },
        move |stop_conditions| {
            let mut policy = Policy {
                requesters: alice_with(ALICE_PUBLIC),
                stop_conditions,
                ..Policy::default()
            };
            policy.guards.clock = Clock::Fixed(later);
            policy
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = Uuid::new_v4();
    h.broker
        .publish(signed_by_alice(id, "cattle-signed"))
        .await
        .unwrap();
    let reason = denied_after_the_claim(h, &store, &restarter, server, id).await;
    assert!(reason.contains("expired (exp)"), "{reason}");
}

/// `safety.require_signed` turned on by a SIGHUP while the stop conditions
/// run denies an unsigned request already past its parse.
#[tokio::test(start_paused = true)]
async fn signatures_required_by_a_reload_while_the_stop_conditions_run_deny_an_unsigned_request() {
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        Policy::default(),
        |stop_conditions| Policy {
            requesters: Arc::new(Requesters::refuse_unsigned()),
            stop_conditions,
            ..Policy::default()
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = h.publish("cattle-unsigned").await;
    let reason = denied_after_the_claim(h, &store, &restarter, server, id).await;
    assert!(
        reason.contains("unsigned") && reason.contains("safety.require_signed"),
        "{reason}"
    );
}

/// A policy whose inventory (TOML) is `hosts`.
fn with_inventory(hosts: &str) -> Policy {
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

const HERD: &str = "[[hosts]]\nname = \"cattle-a1\"\ngroup = \"herd\"\naddress = \"10.0.0.1\"\n";

/// An inventory that moves the host to another group while the stop
/// conditions run stops the restart: it would count in the old group.
#[tokio::test(start_paused = true)]
async fn a_host_the_inventory_moves_while_the_stop_conditions_run_is_not_restarted() {
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        with_inventory(HERD),
        |stop_conditions| Policy {
            stop_conditions,
            ..with_inventory(&HERD.replace("herd", "pets"))
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = h.publish("cattle-a1").await;
    let reason = denied_after_the_claim(h, &store, &restarter, server, id).await;
    assert!(reason.contains("moved from group herd to pets"), "{reason}");
}

/// An inventory that gives the host another address while the stop
/// conditions run defers the restart and gives the claim back; the next
/// delivery is placed afresh and restarts the host at its new address, not
/// the old one.
#[tokio::test(start_paused = true)]
async fn a_host_whose_address_changes_while_the_stop_conditions_run_is_placed_afresh() {
    let at_the_new_address = ScriptedRestarter {
        script: Some(
            |request| match request.reach.as_deref().and_then(|r| r.address.as_deref()) {
                Some("10.0.0.2") => Ok(Restarted::default()),
                _ => Err(RestartError::failed(
                    &request.hostname,
                    "restarted at the old address",
                )),
            },
        ),
        ..Default::default()
    };
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        with_inventory(HERD),
        |stop_conditions| Policy {
            stop_conditions,
            ..with_inventory(&HERD.replace("10.0.0.1", "10.0.0.2"))
        },
        at_the_new_address,
    )
    .await;
    let id = h.publish("cattle-a1").await;
    let stats = h.stats.clone();
    wait_until("deferred", || stats.deferred.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);
    let story = store.inner.story(id).await.unwrap().unwrap();
    let decision = story.decisions.last().unwrap();
    assert_eq!(
        (decision.verdict.as_str(), decision.guard.as_str()),
        ("deferred", "inventory")
    );
    assert!(
        decision.reason.contains("address, port or user changed"),
        "{}",
        decision.reason
    );

    wait_until("restarted", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    server.abort();
    h.stop().await.unwrap();
}

/// An inventory that gives the host an alias (another entry at its
/// address) while the stop conditions run defers the restart and gives the
/// claim back: the claim was counted under the machine's old name. The
/// next delivery is placed afresh, counted as the machine, and restarted.
#[tokio::test(start_paused = true)]
async fn a_host_that_gains_an_alias_while_the_stop_conditions_run_is_placed_afresh() {
    let aliased = format!(
        "{HERD}[[hosts]]\nname = \"cattle-a0\"\ngroup = \"herd\"\naddress = \"10.0.0.1\"\n"
    );
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        with_inventory(HERD),
        move |stop_conditions| Policy {
            stop_conditions,
            ..with_inventory(&aliased)
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = h.publish("cattle-a1").await;
    let stats = h.stats.clone();
    wait_until("deferred", || stats.deferred.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);
    let story = store.inner.story(id).await.unwrap().unwrap();
    let decision = story.decisions.last().unwrap();
    assert!(
        decision
            .reason
            .contains("entries sharing cattle-a1's address changed"),
        "{}",
        decision.reason
    );
    wait_until("restarted", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    assert_eq!(store.entry(id).status, Status::Restarted);
    server.abort();
    h.stop().await.unwrap();
}

/// A SIGHUP that leashes the service (`safety.dry_run = true`) while the
/// stop conditions run stops the restart: the claim is given back, and the
/// next delivery records the dry run.
#[tokio::test(start_paused = true)]
async fn a_leash_put_on_by_a_reload_while_the_stop_conditions_run_stops_the_restart() {
    let (h, store, restarter, server) = reload_while_the_stop_conditions_run(
        Policy::default(),
        |stop_conditions| Policy {
            dry_run: true,
            stop_conditions,
            ..Policy::default()
        },
        ScriptedRestarter::default(),
    )
    .await;
    let id = h.publish("cattle-leashed").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.entry(id).status, Status::DryRun);
    server.abort();
    h.stop().await.unwrap();
}

/// `mandrill leash` while the stop conditions run (after the claim read
/// the store's leash, unleashed) stops the restart: the leash is read
/// again with the switch right before it, the claim is given back, and the
/// next delivery's claim reads the leash and records the dry run, though
/// the instance's own policy stays unleashed.
#[tokio::test(start_paused = true)]
async fn an_operators_leash_while_the_stop_conditions_run_stops_the_restart() {
    let store = Arc::new(ScriptedStore::default());
    let inner = store.inner.clone();
    let (stop_conditions, server) = probe_that_first(move || {
        // The memory store answers at once: nothing to wait for.
        futures::executor::block_on(inner.set_leash(true, "ana", "game day over")).unwrap();
    })
    .await;
    let config = WorkerConfig {
        policy: PolicyHandle::new(Policy {
            stop_conditions,
            ..Policy::default()
        }),
        ..config()
    };
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-leashed").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);
    let story = store.inner.story(id).await.unwrap().unwrap();
    let leash = story
        .decisions
        .iter()
        .find(|d| d.verdict == "deferred")
        .expect("deferred by the leash");
    assert_eq!(leash.guard, "leash");
    assert!(
        leash.reason.contains("leashed by ana (game day over)"),
        "{}",
        leash.reason
    );
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::DryRun, 1));
    server.abort();
    h.stop().await.unwrap();
}
