//! The writer task: one connection, every queued operation committed in one
//! `BEGIN IMMEDIATE` transaction, each caller answered after the commit.

use super::claims::{Claim, Claimed, Step, Tx, claim, publish, settle};
use super::*;

/// What the writer task does for one caller.
#[derive(Debug)]
pub(super) enum Op {
    Publish {
        payloads: Vec<Bytes>,
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
    Claim {
        max: usize,
        reply: oneshot::Sender<Result<Claimed, BrokerError>>,
    },
    Settle {
        claim: Claim,
        action: Action,
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
    /// Stop after this batch; later operations are refused.
    Close,
}

#[derive(Debug)]
pub(super) enum Action {
    Ack,
    Nack(Duration),
    Extend,
    DeadLetter(String),
}

/// The writer's answer to one operation, sent after the commit.
pub(super) enum Answer {
    Unit(
        oneshot::Sender<Result<(), BrokerError>>,
        Result<(), BrokerError>,
    ),
    Claimed(oneshot::Sender<Result<Claimed, BrokerError>>, Claimed),
}

/// The writer's fixed settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Milliseconds.
    pub(super) ack_deadline: i64,
    /// Most bytes of a payload a claim reads: one more than the largest
    /// acceptable, so that the worker sees that the payload is too large.
    pub(super) payload_prefix: i64,
}

/// Takes every queued operation, commits them in one transaction, answers.
pub(super) async fn write_loop(
    mut writer: WriterConnection,
    mut receiver: mpsc::Receiver<Op>,
    limits: Limits,
    available: Arc<Notify>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // Claims whose puller went away before the answer: released in the next
    // transaction rather than left to lease expiry.
    let mut orphans: Vec<Claim> = Vec::new();
    let mut closing = false;
    while !closing && receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let before = batch.len();
        batch.retain(|op| !matches!(op, Op::Close));
        closing = batch.len() < before;
        let wakes = batch.iter().any(|op| {
            matches!(
                op,
                Op::Publish { .. }
                    | Op::Settle {
                        action: Action::Nack(_),
                        ..
                    }
            )
        }) || !orphans.is_empty();
        let committed = match writer.get().await {
            Ok(conn) => commit_batch(conn, &mut batch, &orphans, limits).await,
            Err(error) => Err(error),
        };
        match committed {
            Ok(answers) => {
                orphans.clear();
                for answer in answers {
                    match answer {
                        Answer::Unit(reply, result) => {
                            let _ = reply.send(result);
                        }
                        Answer::Claimed(reply, claimed) => {
                            if let Err(Ok(unwanted)) = reply.send(Ok(claimed)) {
                                orphans.extend(unwanted.deliveries.iter().map(|(c, _)| *c));
                            }
                        }
                    }
                }
                if wakes {
                    available.notify_waiters();
                }
            }
            Err(error) => {
                warn!(%error, operations = batch.len(), "queue transaction failed");
                // Nothing of the batch was committed; orphans stay for the next one.
                writer.discard().await;
                let cause: Arc<dyn std::error::Error + Send + Sync> = Arc::new(error);
                for op in batch.drain(..) {
                    fail(op, BrokerError::Unavailable(Cause::shared(cause.clone())));
                }
            }
        }
        batch.clear();
    }
    // Whoever is still waiting gets an answer, not a hang.
    receiver.close();
    while let Ok(op) = receiver.try_recv() {
        fail(op, closed());
    }
    writer.close().await;
}

pub(super) fn fail(op: Op, error: BrokerError) {
    match op {
        Op::Publish { reply, .. } | Op::Settle { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Op::Claim { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Op::Close => {}
    }
}

/// Runs `batch` (draining it) in one write transaction. Any SQL error fails
/// the whole batch: nothing of it is committed, and every caller is told.
pub(super) async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: &mut Vec<Op>,
    orphans: &[Claim],
    limits: Limits,
) -> Result<Vec<Answer>, sqlx::Error> {
    let now = now_millis();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    for claim in orphans {
        sqlx::query(
            "UPDATE queue SET lease = NULL, visible_at = ?3, deliveries = deliveries - 1
             WHERE id = ?1 AND lease = ?2",
        )
        .bind(claim.id)
        .bind(claim.delivery)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    // Ops are only drained once the transaction committed; until then a
    // failure must still be able to answer them.
    //
    // Publishes and acks are the bulk of the traffic, so each kind goes in
    // one statement for the whole batch; the rest run one by one, in order.
    // Running the acks first is one valid order among concurrent callers: an
    // ack and a claim in one batch never concern the same live lease.
    let payloads: Vec<&[u8]> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Publish { payloads, .. } => Some(payloads.iter().map(|p| p.as_ref())),
            _ => None,
        })
        .flatten()
        .collect();
    publish(&mut tx, &payloads, now).await?;
    let acks: Vec<Claim> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Settle {
                claim,
                action: Action::Ack,
                ..
            } => Some(*claim),
            _ => None,
        })
        .collect();
    let acked = ack_all(&mut tx, &acks).await?;
    let mut steps = Vec::with_capacity(batch.len());
    for op in batch.iter() {
        match op {
            Op::Publish { .. } | Op::Close => {}
            Op::Claim { max, .. } => steps.push(claim(&mut tx, *max, now, limits).await?),
            Op::Settle {
                claim,
                action: Action::Ack,
                ..
            } => steps.push(Step::Settled(if acked.contains(claim) {
                Ok(())
            } else {
                Err(BrokerError::LeaseLost(claim.tag()))
            })),
            Op::Settle { claim, action, .. } => {
                steps.push(settle(&mut tx, *claim, action, now, limits).await?)
            }
        }
    }
    tx.commit().await?;
    let mut results = steps.into_iter();
    let mut out = Vec::with_capacity(batch.len());
    for op in batch.drain(..) {
        match op {
            Op::Publish { reply, .. } => out.push(Answer::Unit(reply, Ok(()))),
            Op::Claim { reply, .. } => match results.next() {
                Some(Step::Claimed(claimed)) => out.push(Answer::Claimed(reply, claimed)),
                _ => unreachable!("one step per claim, in order"),
            },
            Op::Settle { reply, .. } => match results.next() {
                Some(Step::Settled(result)) => out.push(Answer::Unit(reply, result)),
                _ => unreachable!("one step per settlement, in order"),
            },
            Op::Close => {}
        }
    }
    Ok(out)
}

/// Deletes every acked row whose lease is still the ack's, in one statement;
/// returns the claims that matched.
pub(super) async fn ack_all(
    tx: &mut Tx<'_>,
    acks: &[Claim],
) -> Result<std::collections::HashSet<Claim>, sqlx::Error> {
    if acks.is_empty() {
        return Ok(Default::default());
    }
    let pairs: Vec<[i64; 2]> = acks.iter().map(|c| [c.id, c.delivery]).collect();
    // A vector of integer pairs always serialises.
    let pairs = serde_json::to_string(&pairs).expect("pairs serialise");
    let deleted: Vec<(i64, i64)> = sqlx::query_as(
        "DELETE FROM queue WHERE id IN (
             SELECT q.id FROM json_each(?1) AS j
             JOIN queue AS q ON q.id = j.value ->> 0 AND q.lease = j.value ->> 1)
         RETURNING id, lease",
    )
    .bind(pairs)
    .fetch_all(&mut **tx)
    .await?;
    Ok(deleted
        .into_iter()
        .map(|(id, delivery)| Claim { id, delivery })
        .collect())
}
