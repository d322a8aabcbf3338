//! The store's part of its file's writer ([`crate::sqlite::writer`]): the
//! statements of a batch of receipts, outcomes and rejections, run in the
//! writer's transaction (shared with the queue's operations when the queue
//! uses the same file), and each caller's answer after the commit.

use std::sync::Arc;

use tokio::sync::oneshot;
use uuid::Uuid;

use super::claims::claim;
use super::outcomes::{insert_outcomes, insert_rejection, prune, release};
use crate::domain::{Asked, Outcome, RestartRequest, Timestamp};
use crate::sqlite::queue::{Claim as Delivered, ack_all};
use crate::sqlite::writer::{Part, Tx};
use crate::store::reads::sqlite::record_decision;
use crate::store::{Claim, ClaimTerms, ClaimToken, Decision, Recorded, StoreError};

/// One write, with whom to tell once it is committed.
#[derive(Debug)]
pub(crate) enum Write {
    Claim {
        request: RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
        reply: oneshot::Sender<Result<Claim, StoreError>>,
    },
    Outcome {
        request: RestartRequest,
        attempt: u32,
        outcome: Outcome,
        /// Committed with the outcome if it is recorded (the file's own
        /// queue's ack); the reply says whether it matched.
        ack: Option<Delivered>,
        reply: oneshot::Sender<Result<(Recorded, bool), StoreError>>,
    },
    Rejection {
        asked: Asked,
        reason: String,
        excerpt: String,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Release {
        message_id: Uuid,
        attempt: u32,
        token: ClaimToken,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Decision {
        request: RestartRequest,
        attempt: u32,
        verdict: String,
        guard: String,
        reason: String,
        reply: oneshot::Sender<Result<Recorded, StoreError>>,
    },
    Prune {
        before: Timestamp,
        max_rows: u32,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
}

/// What one write of a committed batch answers.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Done,
    Claim(Claim),
    /// Whether an outcome was recorded (or the final status already
    /// there, or the conflict); whether its joint ack matched.
    Outcome(Recorded, bool),
    /// Whether a decision was recorded, or the conflict.
    Decision(Recorded),
    Pruned(u64),
}

/// The store's part of a writer: no state of its own.
#[derive(Debug)]
pub(crate) struct StorePart;

impl Part for StorePart {
    const NAME: &'static str = "store";
    type Op = Write;
    type Answer = Answer;

    fn run<'a>(
        &'a mut self,
        tx: &'a mut Tx<'_>,
        ops: &'a [Write],
        now: i64,
    ) -> impl Future<Output = Result<Vec<Answer>, sqlx::Error>> + Send + 'a {
        run_batch(tx, ops, now)
    }

    fn committed_batch(&mut self, _ops: &[Write]) {}

    fn answer(&mut self, op: Write, answer: Answer) {
        self::answer(op, answer);
    }

    fn fail(&mut self, op: Write, error: &Arc<sqlx::Error>) {
        fail(op, StoreError::Batch(error.clone()));
    }

    fn closed(&mut self, op: Write) {
        fail(op, StoreError::Closed);
    }
}

/// Runs the joint acks of the recorded outcomes among `outcomes` (one
/// statement for all of them) and answers each outcome. An outcome not
/// recorded (another was final already) acks nothing: its caller settles
/// the way that case needs.
async fn answer_outcomes(
    tx: &mut Tx<'_>,
    outcomes: Vec<(usize, Recorded, Option<Delivered>)>,
    answers: &mut [Answer],
) -> Result<(), sqlx::Error> {
    let acks: Vec<Delivered> = outcomes
        .iter()
        .filter_map(|(_, recorded, ack)| ack.filter(|_| *recorded == Recorded::Recorded))
        .collect();
    let acked = ack_all(tx, &acks).await?;
    for (index, recorded, ack) in outcomes {
        let acked = recorded == Recorded::Recorded && ack.is_some_and(|ack| acked.contains(&ack));
        answers[index] = Answer::Outcome(recorded, acked);
    }
    Ok(())
}

fn answer(write: Write, answer: Answer) {
    match (write, answer) {
        (Write::Claim { reply, .. }, Answer::Claim(claim)) => {
            let _ = reply.send(Ok(claim));
        }
        (Write::Outcome { reply, .. }, Answer::Outcome(recorded, acked)) => {
            let _ = reply.send(Ok((recorded, acked)));
        }
        (Write::Decision { reply, .. }, Answer::Decision(recorded)) => {
            let _ = reply.send(Ok(recorded));
        }
        (Write::Rejection { reply, .. } | Write::Release { reply, .. }, Answer::Done) => {
            let _ = reply.send(Ok(()));
        }
        (Write::Prune { reply, .. }, Answer::Pruned(rows)) => {
            let _ = reply.send(Ok(rows));
        }
        (write, answer) => {
            // commit_batch answers each write with its own kind.
            fail(
                write,
                StoreError::Corrupt(format!("store writer mismatched answer {answer:?}")),
            );
        }
    }
}

fn fail(write: Write, error: StoreError) {
    match write {
        Write::Claim { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Rejection { reply, .. } | Write::Release { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Decision { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Outcome { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Prune { reply, .. } => {
            let _ = reply.send(Err(error));
        }
    }
}

/// Runs every write of `batch` in one write transaction and answers each.
/// Any error fails the whole batch: nothing is committed.
///
/// Claims go in one pass, then outcomes in one statement, then rejections
/// and prunes one by one. That order is one valid order among concurrent
/// callers as long as no request appears twice in the batch (a handler's own
/// claim is committed before it records its outcome); when one does (two
/// deliveries of a request racing), the batch runs write by write, in
/// arrival order.
async fn run_batch(tx: &mut Tx<'_>, batch: &[Write], now: i64) -> Result<Vec<Answer>, sqlx::Error> {
    let mut answers = vec![Answer::Done; batch.len()];
    let mut seen = std::collections::HashSet::with_capacity(batch.len());
    let repeats = batch.iter().any(|write| match write {
        Write::Claim { request, .. } | Write::Outcome { request, .. } => {
            !seen.insert(request.message_id)
        }
        _ => false,
    });
    if repeats {
        for (write, answer) in batch.iter().zip(&mut answers) {
            match write {
                Write::Claim {
                    request,
                    terms,
                    token,
                    ..
                } => {
                    let one = [(request, *terms, *token)];
                    *answer = Answer::Claim(claim(tx, &one, now).await?.remove(0));
                }
                Write::Outcome {
                    request,
                    attempt,
                    outcome,
                    ack,
                    ..
                } => {
                    let recorded = insert_outcomes(tx, &[(request, *attempt, outcome)], now)
                        .await?
                        .remove(0);
                    let mut one = [Answer::Done];
                    answer_outcomes(tx, vec![(0, recorded, *ack)], &mut one).await?;
                    let [one] = one;
                    *answer = one;
                }
                _ => {}
            }
        }
    } else {
        let (indexes, claims): (Vec<usize>, Vec<_>) = batch
            .iter()
            .enumerate()
            .filter_map(|(index, write)| match write {
                Write::Claim {
                    request,
                    terms,
                    token,
                    ..
                } => Some((index, (request, *terms, *token))),
                _ => None,
            })
            .unzip();
        for (index, decided) in indexes.into_iter().zip(claim(tx, &claims, now).await?) {
            answers[index] = Answer::Claim(decided);
        }
        let (indexes, outcomes): (Vec<usize>, Vec<_>) = batch
            .iter()
            .enumerate()
            .filter_map(|(index, write)| match write {
                Write::Outcome {
                    request,
                    attempt,
                    outcome,
                    ..
                } => Some((index, (request, *attempt, outcome))),
                _ => None,
            })
            .unzip();
        let recorded = insert_outcomes(tx, &outcomes, now).await?;
        let recorded = indexes
            .into_iter()
            .zip(recorded)
            .map(|(index, result)| match &batch[index] {
                Write::Outcome { ack, .. } => (index, result, *ack),
                _ => unreachable!("indexes of outcomes"),
            })
            .collect();
        answer_outcomes(tx, recorded, &mut answers).await?;
    }
    for (write, answer) in batch.iter().zip(&mut answers) {
        match write {
            Write::Rejection {
                asked,
                reason,
                excerpt,
                ..
            } => insert_rejection(tx, asked, reason, excerpt, now).await?,
            // After the claims: a handler releases only a claim it already
            // holds, committed in an earlier batch.
            Write::Release {
                message_id,
                attempt,
                token,
                ..
            } => release(tx, *message_id, *attempt, *token, now).await?,
            // After the claims and outcomes: a decision finds the row a
            // claim of this batch created, and is not written onto it if
            // that row is another request's.
            Write::Decision {
                request,
                attempt,
                verdict,
                guard,
                reason,
                ..
            } => {
                let decision = Decision {
                    verdict,
                    guard,
                    reason,
                };
                *answer =
                    Answer::Decision(record_decision(tx, request, *attempt, decision, now).await?);
            }
            Write::Prune {
                before, max_rows, ..
            } => *answer = Answer::Pruned(prune(tx, *before, *max_rows).await?),
            _ => {}
        }
    }
    Ok(answers)
}
