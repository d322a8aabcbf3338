//! The queue's part of its file's writer ([`crate::sqlite::writer`]): the
//! statements of a batch of publishes, claims and settlements, run in the
//! writer's transaction, and each caller's answer after the commit.

use super::claims::{Claim, Claimed, Step, claim, publish, settle};
use super::*;
use std::collections::HashSet;

use crate::sqlite::writer::{Part, Tx};

/// What the writer does for one caller of the queue.
#[derive(Debug)]
pub(crate) enum Op {
    Publish {
        payloads: Vec<Bytes>,
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
    Claim {
        max: usize,
        limits: Limits,
        reply: oneshot::Sender<Result<Claimed, BrokerError>>,
    },
    Settle {
        claim: Claim,
        action: Action,
        limits: Limits,
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
}

#[derive(Debug)]
pub(crate) enum Action {
    Ack,
    Nack(Duration),
    Extend,
    DeadLetter(String),
}

/// One broker's fixed settings, carried by its operations (several brokers
/// of one process may share a file's writer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Milliseconds.
    pub(super) ack_deadline: i64,
    /// Most bytes of a payload a claim reads: one more than the largest
    /// acceptable, so that the worker sees that the payload is too large.
    pub(super) payload_prefix: i64,
}

/// The queue's state in its file's writer.
#[derive(Debug)]
pub(crate) struct QueuePart {
    /// Claims whose puller went away before the answer: released in the
    /// next transaction rather than left to lease expiry.
    orphans: Vec<Claim>,
    /// How many of `orphans` the running transaction releases.
    releasing: usize,
    /// See [`crate::sqlite::FileWriter::available`].
    available: Arc<Notify>,
}

impl QueuePart {
    pub(crate) fn new(available: Arc<Notify>) -> Self {
        Self {
            orphans: Vec::new(),
            releasing: 0,
            available,
        }
    }
}

impl Part for QueuePart {
    const NAME: &'static str = "queue";
    type Op = Op;
    type Answer = Step;

    fn run<'a>(
        &'a mut self,
        tx: &'a mut Tx<'_>,
        ops: &'a [Op],
        now: i64,
    ) -> impl Future<Output = Result<Vec<Step>, sqlx::Error>> + Send + 'a {
        self.releasing = self.orphans.len();
        run_batch(tx, ops, &self.orphans, now)
    }

    fn committed_batch(&mut self, ops: &[Op]) {
        let wakes = self.releasing > 0
            || ops.iter().any(|op| {
                matches!(
                    op,
                    Op::Publish { .. }
                        | Op::Settle {
                            action: Action::Nack(_),
                            ..
                        }
                )
            });
        self.orphans.drain(..self.releasing);
        self.releasing = 0;
        if wakes {
            self.available.notify_waiters();
        }
    }

    fn has_pending(&self) -> bool {
        !self.orphans.is_empty()
    }

    fn answer(&mut self, op: Op, step: Step) {
        match (op, step) {
            (Op::Publish { reply, .. }, _) => {
                let _ = reply.send(Ok(()));
            }
            (Op::Claim { reply, .. }, Step::Claimed(claimed)) => {
                if let Err(Ok(unwanted)) = reply.send(Ok(claimed)) {
                    self.orphans
                        .extend(unwanted.deliveries.iter().map(|(c, _)| *c));
                }
            }
            (Op::Settle { reply, .. }, Step::Settled(result)) => {
                let _ = reply.send(result);
            }
            (op, _) => fail(
                op,
                BrokerError::Fatal("queue writer mismatched answer".into()),
            ),
        }
    }

    fn fail(&mut self, op: Op, error: &Arc<sqlx::Error>) {
        let cause: Arc<dyn std::error::Error + Send + Sync> = error.clone();
        fail(op, BrokerError::Unavailable(Cause::shared(cause)));
    }

    fn closed(&mut self, op: Op) {
        fail(op, closed());
    }
}

fn fail(op: Op, error: BrokerError) {
    match op {
        Op::Publish { reply, .. } | Op::Settle { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Op::Claim { reply, .. } => {
            let _ = reply.send(Err(error));
        }
    }
}

/// Runs `ops` in the open transaction; one step per operation.
async fn run_batch(
    tx: &mut Tx<'_>,
    ops: &[Op],
    orphans: &[Claim],
    now: i64,
) -> Result<Vec<Step>, sqlx::Error> {
    for claim in orphans {
        sqlx::query(
            "UPDATE queue SET lease = NULL, visible_at = ?3, deliveries = deliveries - 1
             WHERE id = ?1 AND lease = ?2",
        )
        .bind(claim.id)
        .bind(claim.delivery)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    }
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    // Publishes and acks are the bulk of the traffic, so each kind goes in
    // one statement for the whole batch; the rest run one by one, in order.
    // Running the acks first is one valid order among concurrent callers: an
    // ack and a claim in one batch never concern the same live lease.
    let payloads: Vec<&[u8]> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Publish { payloads, .. } => Some(payloads.iter().map(|p| p.as_ref())),
            _ => None,
        })
        .flatten()
        .collect();
    publish(tx, &payloads, now).await?;
    let acks: Vec<Claim> = ops
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
    let acked = ack_all(tx, &acks).await?;
    let mut steps = Vec::with_capacity(ops.len());
    for op in ops {
        steps.push(match op {
            Op::Publish { .. } => Step::Settled(Ok(())),
            Op::Claim { max, limits, .. } => claim(tx, *max, now, *limits).await?,
            Op::Settle {
                claim,
                action: Action::Ack,
                ..
            } => Step::Settled(if acked.contains(claim) {
                Ok(())
            } else {
                Err(BrokerError::LeaseLost(claim.tag()))
            }),
            Op::Settle {
                claim,
                action,
                limits,
                ..
            } => settle(tx, *claim, action, now, *limits).await?,
        });
    }
    Ok(steps)
}

/// Acks deliveries: deletes each row whose lease is still the delivery's;
/// returns the claims that matched. Also run by the store, for the joint
/// acks of a batch of outcomes. Bound parameters, not a JSON array taken
/// apart inside SQLite: the JSON functions cost more than the deletes
/// themselves.
pub(in crate::sqlite) async fn ack_all(
    tx: &mut Tx<'_>,
    acks: &[Claim],
) -> Result<HashSet<Claim>, sqlx::Error> {
    /// Claims per statement: two parameters each, far under SQLite's limit.
    const CHUNK: usize = 500;
    let mut matched = HashSet::with_capacity(acks.len());
    for chunk in crate::sqlite::runs(acks, CHUNK) {
        let mut query = QueryBuilder::<Sqlite>::new("DELETE FROM queue WHERE (id, lease) IN ");
        query.push_tuples(chunk, |mut pair, claim| {
            pair.push_bind(claim.id).push_bind(claim.delivery);
        });
        query.push(" RETURNING id, lease");
        let rows: Vec<(i64, i64)> = query.build_query_as().fetch_all(&mut **tx).await?;
        matched.extend(
            rows.into_iter()
                .map(|(id, delivery)| Claim { id, delivery }),
        );
    }
    Ok(matched)
}
