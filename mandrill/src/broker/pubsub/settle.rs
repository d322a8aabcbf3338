//! Batched settlements, as Google's own clients send them: acks and
//! deadline changes queue for a few milliseconds and go out as one
//! `Acknowledge` or `ModifyAckDeadline` call per kind, each waiter told the
//! outcome of the call that carried its ack id.

use std::collections::HashMap;
use std::time::Duration;

use gcloud_gax::grpc::{Code, Status};
use gcloud_googleapis::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest};
use gcloud_pubsub::apiv1::subscriber_client::SubscriberClient;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// How long an ack or deadline change waits for others to share its call.
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_millis(5);

/// Most ack ids in one call (Google's clients use the same bound; the
/// request stays far below the 512 KiB limit).
const MAX_IDS_PER_CALL: usize = 2500;

/// What to do with an ack id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Settlement {
    Ack,
    /// Set the deadline to this many seconds from now (0: redeliver now).
    Deadline(i32),
}

struct Request {
    settlement: Settlement,
    ack_id: String,
    done: oneshot::Sender<Result<(), Status>>,
}

/// The queue and the task that drains it (stopped by [`Settler::close`]).
pub(super) struct Settler {
    queue: std::sync::Mutex<Option<mpsc::UnboundedSender<Request>>>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Settler {
    pub(super) fn start(client: SubscriberClient, subscription: String) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let task = tokio::spawn(drain(client, subscription, requests));
        Self {
            queue: std::sync::Mutex::new(Some(queue)),
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }

    /// Queues a settlement and waits for the call that carries it.
    pub(super) async fn settle(
        &self,
        settlement: Settlement,
        ack_id: String,
    ) -> Result<(), Status> {
        let (done, outcome) = oneshot::channel();
        let sent = {
            // Poisoned only if a holder panicked; the queue is still usable.
            let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.as_ref().is_some_and(|queue| {
                queue
                    .send(Request {
                        settlement,
                        ack_id,
                        done,
                    })
                    .is_ok()
            })
        };
        if !sent {
            return Err(Status::cancelled("the broker is closed"));
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(Status::cancelled("the broker is closed")))
    }

    /// Sends what is queued and stops the task.
    pub(super) async fn close(&self) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Settler {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().take() {
            task.abort();
        }
    }
}

async fn drain(
    client: SubscriberClient,
    subscription: String,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    while let Some(first) = requests.recv().await {
        let flush_at = tokio::time::Instant::now() + FLUSH_INTERVAL;
        let mut batch = vec![first];
        while batch.len() < MAX_IDS_PER_CALL {
            match tokio::time::timeout_at(flush_at, requests.recv()).await {
                Ok(Some(request)) => batch.push(request),
                Ok(None) | Err(_) => break,
            }
        }
        let mut groups: HashMap<Settlement, Vec<Request>> = HashMap::new();
        for request in batch {
            groups.entry(request.settlement).or_default().push(request);
        }
        let calls = groups
            .into_iter()
            .map(|(settlement, requests)| send(&client, &subscription, settlement, requests));
        futures::future::join_all(calls).await;
    }
}

/// One call for a group; if the service refuses the group as a whole (one
/// malformed or, on exactly-once subscriptions, one expired ack id fails
/// the call), each id is sent alone so that each waiter learns its own fate.
async fn send(
    client: &SubscriberClient,
    subscription: &str,
    settlement: Settlement,
    requests: Vec<Request>,
) {
    let ack_ids: Vec<String> = requests.iter().map(|r| r.ack_id.clone()).collect();
    let outcome = call(client, subscription, settlement, ack_ids).await;
    let per_id = matches!(&outcome, Err(status) if refused_ids(status)) && requests.len() > 1;
    if !per_id {
        for request in requests {
            let _ = request.done.send(outcome.clone());
        }
        return;
    }
    let alone = requests.into_iter().map(|request| async move {
        let outcome = call(
            client,
            subscription,
            settlement,
            vec![request.ack_id.clone()],
        )
        .await;
        let _ = request.done.send(outcome);
    });
    futures::future::join_all(alone).await;
}

/// Whether a failed call was refused for its ack ids rather than for the
/// service's state.
pub(super) fn refused_ids(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::InvalidArgument | Code::FailedPrecondition
    )
}

async fn call(
    client: &SubscriberClient,
    subscription: &str,
    settlement: Settlement,
    ack_ids: Vec<String>,
) -> Result<(), Status> {
    let subscription = subscription.to_owned();
    match settlement {
        Settlement::Ack => client
            .acknowledge(
                AcknowledgeRequest {
                    subscription,
                    ack_ids,
                },
                None,
            )
            .await
            .map(drop),
        Settlement::Deadline(seconds) => client
            .modify_ack_deadline(
                ModifyAckDeadlineRequest {
                    subscription,
                    ack_ids,
                    ack_deadline_seconds: seconds,
                },
                None,
            )
            .await
            .map(drop),
    }
}
