//! The notifier against real local HTTP receivers: the bodies they get, an
//! endpoint that is down, one that is slow, and a full queue.

use std::sync::Mutex;

use axum::Router;
use axum::routing::post;
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::*;

/// What a receiver got: (path, body).
type Received = Arc<Mutex<Vec<(String, String)>>>;

/// A receiver on 127.0.0.1:0 taking POSTs on any path after `delay`.
async fn receiver(delay: Duration) -> (String, Received) {
    let received: Received = Arc::default();
    let record = received.clone();
    let app = Router::new().route(
        "/{*path}",
        post(move |uri: axum::http::Uri, body: String| {
            let record = record.clone();
            async move {
                tokio::time::sleep(delay).await;
                record.lock().unwrap().push((uri.path().to_owned(), body));
                "ok"
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), received)
}

fn entry(url: String, format: Format, events: &[EventKind]) -> NotifyEntry {
    NotifyEntry {
        url: crate::settings::Secret(url),
        format,
        events: events.to_vec(),
        timeout: Duration::from_secs(5),
    }
}

fn settings(queue_capacity: usize, flush_timeout: Duration) -> NotifierSettings {
    NotifierSettings {
        queue_capacity,
        flush_timeout,
    }
}

fn request() -> RestartRequest {
    let rules = crate::domain::ParseRules {
        domain: crate::domain::Domain::default(),
        max_payload_bytes: 1024,
    };
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"cattle-a1"}}"#,
        uuid::Uuid::nil()
    );
    RestartRequest::parse(payload.as_bytes(), &rules).unwrap()
}

#[tokio::test]
async fn json_and_slack_bodies_reach_each_endpoint_wanting_the_event() {
    let (base, received) = receiver(Duration::ZERO).await;
    let stats = Arc::new(Stats::default());
    let notifier = Notifier::start(
        &[
            entry(
                format!("{base}/generic"),
                Format::Json,
                &[EventKind::Restarted, EventKind::Paused],
            ),
            entry(format!("{base}/chat"), Format::Slack, &[EventKind::Paused]),
        ],
        &settings(16, Duration::from_secs(30)),
        stats.clone(),
    )
    .unwrap()
    .unwrap();
    assert!(!notifier.wants(EventKind::Failed));
    notifier.send(Event::about(EventKind::Restarted, &request(), 2, None));
    notifier.send(Event::switch(true, "ana", "incident <7>"));
    // Wanted by no one: neither sent nor counted.
    notifier.send(Event::about(EventKind::Failed, &request(), 1, None));
    notifier.close().await;

    let mut received = received.lock().unwrap().clone();
    received.sort();
    assert_eq!(received.len(), 3, "{received:?}");
    let (path, chat) = &received[0];
    assert_eq!(path, "/chat");
    let chat: serde_json::Value = serde_json::from_str(chat).unwrap();
    assert_eq!(
        chat,
        serde_json::json!({"text": "mandrill: restarts PAUSED by ana: incident &lt;7&gt;"})
    );
    let generic: Vec<serde_json::Value> = received[1..]
        .iter()
        .map(|(path, body)| {
            assert_eq!(path, "/generic");
            serde_json::from_str(body).unwrap()
        })
        .collect();
    let restarted = generic.iter().find(|e| e["event"] == "restarted").unwrap();
    assert_eq!(restarted["instance_name"], "cattle-a1");
    assert_eq!(restarted["message_id"], uuid::Uuid::nil().to_string());
    assert_eq!(restarted["attempt"], 2);
    let paused = generic.iter().find(|e| e["event"] == "paused").unwrap();
    assert_eq!(
        (&paused["by"], &paused["detail"]),
        (&"ana".into(), &"incident <7>".into())
    );
    assert!(paused["at"].is_string());
    let s = stats.snapshot();
    assert_eq!(
        (
            s.notifications_sent,
            s.notifications_failed,
            s.notifications_dropped
        ),
        (3, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_down_endpoint_is_retried_then_counted_failed_and_a_full_queue_drops_at_once() {
    // A port nothing listens on: connections are refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", closed.local_addr().unwrap());
    drop(closed);
    let stats = Arc::new(Stats::default());
    let notifier = Notifier::start(
        &[entry(url, Format::Json, &[EventKind::Restarted])],
        &settings(2, Duration::from_secs(600)),
        stats.clone(),
    )
    .unwrap()
    .unwrap();
    // Ten sends without yielding: the sender cannot have taken any yet,
    // so two are queued and eight dropped, and none of them waited.
    for _ in 0..10 {
        notifier.send(Event::about(EventKind::Restarted, &request(), 1, None));
    }
    assert_eq!(stats.notifications_dropped.get(), 8);
    notifier.close().await;
    let s = stats.snapshot();
    assert_eq!(
        (
            s.notifications_sent,
            s.notifications_failed,
            s.notifications_dropped
        ),
        (0, 2, 8)
    );
    // Sent after closing: dropped, counted.
    notifier.send(Event::about(EventKind::Restarted, &request(), 1, None));
    assert_eq!(stats.notifications_dropped.get(), 9);
}

#[tokio::test(start_paused = true)]
async fn a_slow_endpoint_holds_shutdown_no_longer_than_the_flush_bound() {
    let (base, received) = receiver(Duration::from_secs(3600)).await;
    let stats = Arc::new(Stats::default());
    let flush = Duration::from_secs(2);
    let mut slow = entry(format!("{base}/slow"), Format::Json, &[EventKind::Failed]);
    slow.timeout = Duration::from_secs(1800);
    let notifier = Notifier::start(&[slow], &settings(16, flush), stats.clone())
        .unwrap()
        .unwrap();
    for _ in 0..3 {
        notifier.send(Event::about(EventKind::Failed, &request(), 1, None));
    }
    let closing = Instant::now();
    notifier.close().await;
    // Paused time: the bound is exact, whatever the machine's load.
    assert!(
        closing.elapsed() <= flush + Duration::from_millis(100),
        "{:?}",
        closing.elapsed()
    );
    assert!(received.lock().unwrap().is_empty());
    let s = stats.snapshot();
    assert_eq!(s.notifications_sent, 0);
    assert_eq!(s.notifications_failed + s.notifications_dropped, 3, "{s:?}");
    assert!(s.notifications_dropped >= 2, "{s:?}");
}

#[test]
fn entries_name_the_key_at_fault_and_never_quote_the_url() {
    let secret = "https://hooks.example/services/T0/B0/s3cr3t-key";
    let ok = entry(secret.into(), Format::Slack, &[EventKind::Paused]);
    ok.validate().unwrap();
    for (bad, key) in [
        (
            NotifyEntry {
                url: crate::settings::Secret("ftp://hooks.example/s3cr3t-key".into()),
                ..ok.clone()
            },
            "url",
        ),
        (
            NotifyEntry {
                url: crate::settings::Secret("s3cr3t-key".into()),
                ..ok.clone()
            },
            "url",
        ),
        (
            NotifyEntry {
                events: vec![],
                ..ok.clone()
            },
            "events",
        ),
        (
            NotifyEntry {
                timeout: Duration::ZERO,
                ..ok.clone()
            },
            "timeout",
        ),
    ] {
        let (at, why) = bad.validate().unwrap_err();
        assert_eq!(at, key);
        assert!(!why.contains("s3cr3t"), "{why}");
    }
    // Duplicates are wanted once.
    let twice = entry(
        secret.into(),
        Format::Json,
        &[EventKind::Paused, EventKind::Paused],
    );
    assert_eq!(twice.wanted().count(), 1);
}

#[test]
fn a_restart_notification_names_who_asked() {
    let mut request = request();
    // As the parse leaves a signed request: the verified requester in both.
    request.requester = Some("alice".into());
    request.requested_by = Some("alice".into());
    let event = Event::about(EventKind::Restarted, &request, 1, None);
    assert_eq!(event.requested_by.as_deref(), Some("alice"));
    let json = serde_json::to_value(&event).unwrap();
    assert_eq!(json["requested_by"], "alice");
    let line = super::sender::text(&event);
    assert!(line.ends_with("(requested by alice)"), "{line}");
    assert_eq!(json["requester_verified"], true);
}

/// A failed restart's detail holds what the host wrote: a newline in it
/// cannot start a chat line that reads as another notification.
#[test]
fn a_hosts_output_cannot_forge_a_line_in_a_chat_notification() {
    let detail = "exit 1; output: x\nmandrill: restarts resumed by oncall: all healthy";
    let event = Event::about(EventKind::Failed, &request(), 1, Some(detail.to_owned()));
    let line = super::sender::text(&event);
    assert!(!line.contains('\n'), "{line:?}");
    assert!(line.contains("x\\nmandrill: restarts resumed"), "{line:?}");
}

/// An unsigned request's `requested_by` is free text anyone may write: a
/// notification never shows it as a verified name.
#[test]
fn an_unsigned_request_s_requester_is_marked_unverified_in_a_notification() {
    let mut request = request();
    request.requester = None;
    request.requested_by = Some("schedule:cattle-drip".into());
    let event = Event::about(EventKind::Restarted, &request, 1, None);
    let json = serde_json::to_value(&event).unwrap();
    assert_eq!(json["requested_by"], "schedule:cattle-drip (unverified)");
    assert_eq!(json["requester_verified"], false);
    let line = super::sender::text(&event);
    assert!(
        line.ends_with("(requested by schedule:cattle-drip (unverified))"),
        "{line}"
    );
}
