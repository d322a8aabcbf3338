//! The worker tests' doubles: the in-memory adapters wrapped to inject
//! latency, failures and panics, each keeping a timeline of what happened.
//! One file past 400 lines: one double per adapter, each a whole trait.

use super::*;

/// What happened, when, in order.
#[derive(Clone, Default)]
pub(super) struct Timeline(Arc<Mutex<Vec<(Instant, String)>>>);

impl Timeline {
    pub(super) fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push((Instant::now(), event.into()));
    }

    pub(super) fn events(&self) -> Vec<(Instant, String)> {
        self.0.lock().unwrap().clone()
    }

    pub(super) fn when(&self, prefix: &str) -> Vec<Instant> {
        self.events()
            .into_iter()
            .filter(|(_, e)| e.starts_with(prefix))
            .map(|(t, _)| t)
            .collect()
    }

    pub(super) fn count(&self, prefix: &str) -> usize {
        self.when(prefix).len()
    }
}

/// The memory broker, logging every settlement and extension.
pub(super) struct LoggedBroker {
    pub(super) inner: MemoryBroker,
    pub(super) timeline: Timeline,
    /// Pull fails this many more times before working.
    pub(super) failing_pulls: AtomicU32,
    /// Dead-lettering fails this many more times before working.
    pub(super) failing_dead_letters: AtomicU32,
    /// Acks fail (broker briefly unavailable) this many more times.
    pub(super) failing_acks: AtomicU32,
    /// While set, every extension finds the lease gone.
    pub(super) leases_gone: AtomicBool,
    /// This many more extensions never get an answer.
    pub(super) unanswered_extensions: AtomicU32,
    /// This many more extensions panic.
    pub(super) panicking_extensions: AtomicU32,
    /// The verdicts published to a `reply_to`: destination and payload.
    pub(super) replies: Mutex<Vec<(String, Bytes)>>,
}

fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

impl Close for LoggedBroker {}

#[async_trait]
impl Publisher for LoggedBroker {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.inner.publish(payload).await
    }
}

#[async_trait]
impl Consumer for LoggedBroker {
    fn lease(&self) -> Option<Duration> {
        self.inner.lease()
    }
    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        if self
            .failing_pulls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            self.timeline.push("pull-failed");
            return Err(BrokerError::Unavailable("connection refused".into()));
        }
        self.inner.pull(max).await
    }
    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        if take_one(&self.failing_acks) {
            self.timeline.push("ack-failed");
            return Err(BrokerError::Unavailable("connection reset".into()));
        }
        self.timeline.push(format!("ack {tag}"));
        self.inner.ack(tag).await
    }
    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        self.timeline.push(format!("nack {}", delay.as_millis()));
        self.inner.nack(tag, delay).await
    }
    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.timeline.push(format!("extend {tag}"));
        if take_one(&self.unanswered_extensions) {
            return std::future::pending().await;
        }
        if take_one(&self.panicking_extensions) {
            panic!("the broker adapter panicked extending {tag}");
        }
        if self.leases_gone.load(Ordering::Acquire) {
            return Err(BrokerError::LeaseLost(tag.clone()));
        }
        self.inner.extend(tag).await
    }
    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        if self
            .failing_dead_letters
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            self.timeline.push("dead-letter-failed");
            return Err(BrokerError::Unavailable(
                "dead-letter stream unreachable".into(),
            ));
        }
        self.timeline.push(format!("dead-letter {reason}"));
        self.inner.dead_letter(tag, reason).await
    }
    async fn reply(&self, destination: &str, verdict: Bytes) -> Result<(), BrokerError> {
        self.timeline.push(format!("reply {destination}"));
        self.replies
            .lock()
            .unwrap()
            .push((destination.to_owned(), verdict));
        Ok(())
    }
}

/// The memory store with injected latency and faults.
#[derive(Default)]
pub(super) struct ScriptedStore {
    pub(super) inner: Arc<MemoryStore>,
    pub(super) timeline: Timeline,
    pub(super) claim_delay: Duration,
    /// While set, recording an outcome fails with a transient error.
    pub(super) outcome_fails: AtomicBool,
    /// While set, recording an outcome fails with a permanent error (as
    /// PostgreSQL refusing a value it cannot store).
    pub(super) outcome_refused: AtomicBool,
    /// While set, every operation fails with a transient error (the
    /// database is unreachable).
    pub(super) down: AtomicBool,
    /// When set, claims wait for a permit (never released: they hang).
    pub(super) claim_gate: Option<Semaphore>,
    /// This many more claims are committed, and then answered with a time
    /// out (the answer lost after the commit).
    pub(super) lost_claim_answers: AtomicU32,
    /// When set, each read of the kill switch takes a permit (waiting for
    /// one if none is left).
    pub(super) switch_gate: Option<Semaphore>,
    /// When set, a claim is committed after `claim_delay` whether or not
    /// its caller still waits, as a writer that queued it commits it.
    pub(super) queued_claims: bool,
    /// Setting the kill switch fails with a transient error this many more
    /// times.
    pub(super) failing_switch_sets: AtomicU32,
    /// While set, reading the kill switch fails with a transient error (the
    /// database is unreachable; `down` leaves the switch's reads alone, so
    /// that tests of the handlers' outages do not race the switch's poll).
    pub(super) switch_unreachable: AtomicBool,
}

impl ScriptedStore {
    /// The history entry of request `id`, which must have one.
    pub(super) fn entry(&self, id: Uuid) -> crate::store::HistoryEntry {
        self.inner
            .entries()
            .into_iter()
            .find(|e| e.message_id == Some(id))
            .unwrap_or_else(|| panic!("no history entry for {id}"))
    }

    fn unreachable(&self, what: &str) -> Result<(), StoreError> {
        if self.down.load(Ordering::Acquire) {
            self.timeline.push(format!("{what}-unreachable"));
            let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
            return Err(StoreError::Database(sqlx::Error::Io(refused)));
        }
        Ok(())
    }
}

#[async_trait]
impl Store for ScriptedStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        self.unreachable("lookup")?;
        self.inner.lookup(message_id).await
    }
    async fn claim_restart(
        &self,
        r: &RestartRequest,
        terms: ClaimTerms,
        token: crate::store::ClaimToken,
    ) -> Result<Claim, StoreError> {
        self.unreachable("claim")?;
        if let Some(gate) = &self.claim_gate {
            self.timeline.push("claim-waiting");
            let _permit = gate.acquire().await.unwrap();
        }
        let claim = if self.queued_claims {
            self.timeline.push("claim-queued");
            let (inner, r, delay) = (self.inner.clone(), r.clone(), self.claim_delay);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                inner.claim_restart(&r, terms, token).await
            })
            .await
            .expect("the claim's task")
        } else {
            tokio::time::sleep(self.claim_delay).await;
            self.inner.claim_restart(r, terms, token).await
        };
        self.timeline.push(format!("claim {claim:?}"));
        if claim.is_ok() && take_one(&self.lost_claim_answers) {
            self.timeline.push("claim-answer-lost");
            let after = Duration::from_secs(10);
            return Err(StoreError::TimedOut { after });
        }
        claim
    }
    async fn record_outcome(
        &self,
        r: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        self.unreachable("record")?;
        if self.outcome_fails.load(Ordering::Acquire) {
            self.timeline.push("record-failed");
            return Err(StoreError::Database(sqlx::Error::PoolTimedOut));
        }
        if self.outcome_refused.load(Ordering::Acquire) {
            self.timeline.push("record-refused");
            let refused = "invalid byte sequence for encoding UTF8: 0x00";
            return Err(StoreError::Database(sqlx::Error::Encode(refused.into())));
        }
        self.timeline.push(format!("recorded {}", outcome.status()));
        self.inner.record_outcome(r, attempt, outcome).await
    }
    async fn release_claim(
        &self,
        r: &RestartRequest,
        attempt: u32,
        token: crate::store::ClaimToken,
    ) -> Result<(), StoreError> {
        self.unreachable("release")?;
        self.timeline.push(format!("released {attempt}"));
        self.inner.release_claim(r, attempt, token).await
    }
    async fn record_rejection(
        &self,
        asked: &crate::domain::Asked,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.unreachable("reject")?;
        self.inner.record_rejection(asked, reason, payload).await
    }
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.inner.history(limit).await
    }
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: crate::store::Decision<'_>,
    ) -> Result<crate::store::Recorded, StoreError> {
        self.inner.record_decision(request, attempt, decision).await
    }
    async fn story(&self, message_id: Uuid) -> Result<Option<crate::store::Story>, StoreError> {
        self.inner.story(message_id).await
    }
    async fn group_usage(
        &self,
        starts: crate::store::UsageStarts,
    ) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, StoreError> {
        self.inner.group_usage(starts).await
    }
    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        self.inner.first_received(request).await
    }
    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        self.inner.deferrals(message_id).await
    }
    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        self.inner.prune(before, max_rows).await
    }
    async fn switch(&self) -> Result<crate::store::Switch, StoreError> {
        if self.switch_unreachable.load(Ordering::Acquire) {
            self.timeline.push("switch-unreachable");
            let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
            return Err(StoreError::Database(sqlx::Error::Io(refused)));
        }
        if let Some(gate) = &self.switch_gate {
            self.timeline.push("switch-waiting");
            gate.acquire().await.unwrap().forget();
        }
        self.inner.switch().await
    }
    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        if take_one(&self.failing_switch_sets) {
            self.timeline.push("switch-failed");
            return Err(StoreError::Database(sqlx::Error::PoolTimedOut));
        }
        self.timeline.push(format!("switch {paused} {reason}"));
        self.inner.set_switch(paused, by, reason).await
    }

    async fn set_switch_if(
        &self,
        expected: crate::store::SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        self.inner.set_switch_if(expected, paused, by, reason).await
    }

    async fn group_pauses(&self) -> Result<Vec<crate::store::GroupPause>, StoreError> {
        self.inner.group_pauses().await
    }

    async fn set_group_pause(
        &self,
        group: &str,
        pause: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        self.inner.set_group_pause(group, pause).await
    }
}

/// Decides a scripted restart's result.
pub(super) type Script = fn(&RestartRequest) -> Result<Restarted, RestartError>;

/// A restarter with scripted latency, failures, panics and a gate.
#[derive(Default)]
pub(super) struct ScriptedRestarter {
    pub(super) timeline: Timeline,
    pub(super) delay: Duration,
    /// Every restart fails.
    pub(super) always_fails: bool,
    /// When set, decides each restart's result.
    pub(super) script: Option<Script>,
    /// Restarts of hosts starting with this panic.
    pub(super) panics_on: Option<&'static str>,
    /// This many more restarts panic once under way (the host may be
    /// restarting: the outcome is unknown).
    pub(super) panics_once_issued: AtomicU32,
    /// When set, each restart waits for a permit (released by the test).
    pub(super) gate: Option<Arc<Semaphore>>,
    /// When set, reserving capacity waits for a permit (never released).
    pub(super) reserve_gate: Option<Semaphore>,
    pub(super) running: AtomicU32,
    pub(super) most_running: AtomicU32,
    pub(super) calls: Mutex<HashMap<String, u32>>,
}

impl ScriptedRestarter {
    pub(super) fn calls(&self, host: &str) -> u32 {
        self.calls.lock().unwrap().get(host).copied().unwrap_or(0)
    }
}

#[async_trait]
impl Restarter for ScriptedRestarter {
    fn reserve<'a>(&'a self, _request: &'a RestartRequest) -> Reserving<'a> {
        let Some(gate) = &self.reserve_gate else {
            return Reserving::unlimited();
        };
        Reserving::wait(async move {
            self.timeline.push("reserve-waiting");
            gate.acquire().await.unwrap().forget();
            Ok(Reservation::unlimited())
        })
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        _: Reservation,
    ) -> Result<Restarted, RestartError> {
        let host = &request.hostname;
        *self
            .calls
            .lock()
            .unwrap()
            .entry(host.to_string())
            .or_default() += 1;
        let now_running = self.running.fetch_add(1, Ordering::AcqRel) + 1;
        self.most_running.fetch_max(now_running, Ordering::AcqRel);
        self.timeline.push("restart-started");
        if let Some(prefix) = self.panics_on
            && host.as_str().starts_with(prefix)
        {
            self.running.fetch_sub(1, Ordering::AcqRel);
            panic!("restarter bug for {host}");
        }
        if take_one(&self.panics_once_issued) {
            self.running.fetch_sub(1, Ordering::AcqRel);
            panic!("restarter bug after restarting {host}");
        }
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        tokio::time::sleep(self.delay).await;
        self.running.fetch_sub(1, Ordering::AcqRel);
        self.timeline.push("restarted");
        if self.always_fails {
            return Err(RestartError::failed(host, "host unreachable"));
        }
        if let Some(script) = self.script {
            return script(request);
        }
        Ok(Restarted::default())
    }
}
