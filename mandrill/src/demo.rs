//! The built-in demo publisher (`--simulate`): random tutorial-style requests
//! (`cattle-` plus 4 characters) at a steady, reloadable rate, with an
//! optional share of deliberately malformed payloads.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use tokio::sync::watch;
use tracing::{info, warn};
use uuid::Uuid;

use crate::broker::Publisher;
use crate::domain::{Domain, Hostname, RestartRequest, new_message_id, random_instance_name};

/// How often the publisher wakes up; requests due in between are published
/// together, so rates far above 1/tick are met.
const TICK: Duration = Duration::from_millis(10);

/// A random, valid request.
pub(crate) fn random_request(rng: &mut impl Rng) -> RestartRequest {
    let instance_name = random_instance_name(rng);
    let now = std::time::SystemTime::now();
    RestartRequest {
        message_id: new_message_id(now, rng),
        hostname: Hostname::new(&instance_name, &Domain::default()),
        instance_name,
        requested_by: Some("mandrill-simulate".into()),
        reason: None,
        published_at: Some(now),
        group: None,
        requested_group: None,
        zone: None,
        requester: None,
        signature: None,
        reach: None,
        machine: None,
        not_before: None,
        reply_to: None,
    }
}

/// A malformed payload of one of several kinds.
fn malformed_payload(rng: &mut impl Rng) -> Bytes {
    match rng.random_range(0..3) {
        0 => Bytes::from_static(b"{\"message_id\": "),
        1 => Bytes::from(format!(
            r#"{{"message_id":"{}","instance_name":"Cattle_Bad"}}"#,
            Uuid::new_v4()
        )),
        _ => Bytes::from_static(b"\xff\xfe not utf-8"),
    }
}

/// Publishes until `stop` completes, at `rate` requests per second. When
/// publishing falls behind, at most a second's worth of requests is owed:
/// a demo has no backlog to honour. `stop` is checked before every publish
/// and interrupts one in progress.
pub(crate) async fn publish(
    broker: Arc<dyn Publisher>,
    mut rate: watch::Receiver<f64>,
    malformed_rate: f64,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut due = 0.0_f64;
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = &mut stop => return,
        }
        if rate.has_changed().unwrap_or(false) {
            info!(
                rate = *rate.borrow_and_update(),
                "simulated publish rate changed"
            );
        }
        let now = tokio::time::Instant::now();
        let per_second = *rate.borrow();
        due = (due + per_second * (now - last).as_secs_f64()).min(per_second.max(1.0));
        last = now;
        while due >= 1.0 {
            due -= 1.0;
            let (payload, request) = {
                let mut rng = rand::rng();
                if malformed_rate > 0.0 && rng.random_bool(malformed_rate) {
                    (malformed_payload(&mut rng), None)
                } else {
                    let request = random_request(&mut rng);
                    (Bytes::from(request.to_wire()), Some(request))
                }
            };
            tokio::select! {
                biased;
                () = &mut stop => return,
                published = broker.publish(payload) => match (published, request) {
                    (Ok(()), Some(request)) => {
                        info!(message_id = %request.message_id, host = %request.hostname, "published");
                    }
                    (Ok(()), None) => {}
                    (Err(error), _) => warn!(%error, "simulated publish failed"),
                },
            }
        }
    }
}
