//! A backend that refuses a reservation: the request is deferred for the
//! backend's retry-after, the refusal is recorded as a decision, and no
//! attempt is used.

use super::*;
use crate::restarter::{Journaled, Refusal};

/// Refuses its first reservation, then reserves like `inner`.
struct RefusesOnce {
    inner: ScriptedRestarter,
    refused: AtomicBool,
    retry_after: Duration,
}

const BACKEND_SAYS: &str = "the webhook is in maintenance until 09:00";
const RETRY_AFTER: Duration = Duration::from_secs(30);

#[async_trait]
impl Restarter for RefusesOnce {
    fn reserve<'a>(&'a self, request: &'a RestartRequest) -> Reserving<'a> {
        if !self.refused.swap(true, Ordering::AcqRel) {
            self.inner.timeline.push("refused");
            return Reserving::now(Err(Refusal::new("backend", BACKEND_SAYS, self.retry_after)));
        }
        self.inner.reserve(request)
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        self.inner.restart(request, reservation).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_reservation_defers_records_the_reason_and_uses_no_attempt() {
    let refusing = Arc::new(RefusesOnce {
        inner: ScriptedRestarter::default(),
        refused: AtomicBool::new(false),
        retry_after: RETRY_AFTER,
    });
    // Through a decorator, which passes the refusal on untouched.
    let journal = tempfile::NamedTempFile::new().unwrap();
    let journaled = Arc::new(Journaled::open(refusing.clone(), journal.path()).unwrap());
    let store = Arc::new(MemoryStore::new());
    let h = start(config(), store.clone(), journaled);
    let id = h.publish("cattle-ab12").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;

    // Deferred once, for the backend's retry-after, then restarted once.
    assert_eq!(h.broker.timeline.count("nack 30000"), 1);
    assert_eq!(refusing.inner.calls("cattle-ab12.example.net"), 1);
    let refused = refusing.inner.timeline.when("refused")[0];
    let restarted = refusing.inner.timeline.when("restart-started")[0];
    assert!(restarted - refused >= RETRY_AFTER);
    assert_eq!((stats.deferred.get(), stats.restarted.get()), (1, 1));
    // One line in the journal: the refusal issued nothing.
    let journaled = std::fs::read_to_string(journal.path()).unwrap();
    assert_eq!(journaled.lines().count(), 1, "{journaled}");

    // `mandrill explain` tells the backend's reason; the refusal counted
    // as a deferral, not as an attempt.
    let story = store.story(id).await.unwrap().unwrap();
    let decisions: Vec<_> = story
        .decisions
        .iter()
        .map(|d| {
            (
                d.attempt,
                d.verdict.as_str(),
                d.guard.as_str(),
                d.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(decisions, [(0, "deferred", "backend", BACKEND_SAYS)]);
    assert_eq!(store.deferrals(id).await.unwrap(), 1);
    assert_eq!(story.attempts.len(), 1);
    assert_eq!(story.attempts[0].attempt, 1);
    assert_eq!(
        (story.entry.status, story.entry.attempts),
        (Status::Restarted, 1)
    );
    h.stop().await.unwrap();
}

/// A backend that says "try again at once" does not get a redelivery loop:
/// the deferral waits at least a second, as an in-flight hold does.
#[tokio::test(start_paused = true)]
async fn a_refusal_without_a_wait_is_deferred_for_at_least_a_second() {
    let refusing = Arc::new(RefusesOnce {
        inner: ScriptedRestarter::default(),
        refused: AtomicBool::new(false),
        retry_after: Duration::ZERO,
    });
    let store = Arc::new(MemoryStore::new());
    let h = start(config(), store.clone(), refusing.clone());
    h.publish("cattle-ab12").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(h.broker.timeline.count("nack 0"), 0);
    assert_eq!(h.broker.timeline.count("nack 1000"), 1);
    assert_eq!(refusing.inner.calls("cattle-ab12.example.net"), 1);
}
