//! The worker's calls on every message allocate nothing for the call itself:
//! through [`AnyStore`] and [`AnyConsumer`] they are a `match`
//! and an unboxed `async fn`, where a call through `dyn Store` or
//! `dyn Consumer` boxes its future. Counted with a global allocator of this
//! test binary's own, on this thread only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mandrill::broker::{AnyConsumer, Consumer, MemoryBroker, Publisher as _};
use mandrill::domain::{Domain, Outcome, ParseRules, RestartRequest};
use mandrill::safety::limits::Limits;
use mandrill::store::{AnyStore, Claim, ClaimTerms, ClaimToken, MemoryStore, Store};

/// Counts the allocations made on the thread that asks.
struct Counting;

thread_local! {
    // `const`: reading it never allocates (no lazy initialisation).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to `System` unchanged; the count is a
// thread-local `Cell` of a `const` initialiser, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// How many allocations `work` made on this thread, its call included (an
/// `#[async_trait]` method boxes when called, before it is polled).
async fn allocations<T, F: Future<Output = T>>(work: impl FnOnce() -> F) -> (T, u64) {
    let before = ALLOCATIONS.with(Cell::get);
    let output = work().await;
    (output, ALLOCATIONS.with(Cell::get) - before)
}

const TERMS: ClaimTerms = ClaimTerms {
    max_attempts: 3,
    hold: Duration::from_secs(60),
    limits: Limits::NONE,
};

fn request(instance: &str) -> RestartRequest {
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"{instance}"}}"#,
        uuid::Uuid::new_v4()
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 4096,
    };
    RestartRequest::parse(payload.as_bytes(), &rules).expect("a valid request")
}

#[tokio::test(flavor = "current_thread")]
async fn the_memory_stores_outcome_and_lookup_allocate_nothing_through_any_store() {
    let memory = Arc::new(MemoryStore::new());
    let store = AnyStore::from(memory.clone());
    assert!(matches!(store, AnyStore::Memory(_)));
    let request = request("cattle-0001");
    let claim = store
        .claim_restart(&request, &TERMS, ClaimToken::new())
        .await
        .unwrap();
    let Claim::Claimed { attempt, .. } = claim else {
        panic!("not claimed: {claim:?}");
    };
    let outcome = Outcome::restarted();
    let (recorded, made) = allocations(|| store.record_outcome(&request, attempt, &outcome)).await;
    recorded.unwrap();
    assert_eq!(made, 0, "recording a plain outcome allocated");
    let (status, made) = allocations(|| store.lookup(request.message_id)).await;
    assert!(status.unwrap().is_some());
    assert_eq!(made, 0, "a lookup allocated");
    // Through the trait object, the same call boxes its future: what the
    // enum saves.
    let dynamic: Arc<dyn Store> = memory;
    let (_, made) = allocations(|| dynamic.lookup(request.message_id)).await;
    assert_eq!(made, 1, "a call through dyn Store boxes once");
}

#[tokio::test(flavor = "current_thread")]
async fn a_claim_through_any_store_allocates_what_the_store_itself_does() {
    // With room for its rows: a map's first insert allocates its table.
    let memory = Arc::new(MemoryStore::with_capacity(64));
    let store = AnyStore::from(memory.clone());
    let (first, second) = (request("cattle-0001"), request("cattle-0002"));
    // The row and its journal entry allocate; the call itself must not.
    // (The tokens are minted outside: the first draw of a thread's random
    // numbers sets up its generator.)
    let tokens = [ClaimToken::new(), ClaimToken::new()];
    let (_, direct) = allocations(|| memory.claim_restart(&first, TERMS, tokens[0])).await;
    let (_, through) = allocations(|| store.claim_restart(&second, &TERMS, tokens[1])).await;
    assert_eq!(through, direct);
    assert!(direct > 0, "a claim's row allocates");
}

#[tokio::test(flavor = "current_thread")]
async fn the_memory_brokers_settlements_allocate_nothing_through_any_consumer() {
    let broker = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let consumer = AnyConsumer::from(broker.clone());
    assert!(matches!(consumer, AnyConsumer::Memory(_)));
    for n in 0..2 {
        broker.publish(Bytes::from(vec![n])).await.unwrap();
    }
    let deliveries = consumer.pull(2).await.unwrap();
    // The first extension grows the deadline heap; the second must not.
    consumer.extend(&deliveries[0].tag).await.unwrap();
    let (extended, made) = allocations(|| consumer.extend(&deliveries[0].tag)).await;
    extended.unwrap();
    assert_eq!(made, 0, "an extension allocated");
    let (acked, made) = allocations(|| consumer.ack(&deliveries[0].tag)).await;
    acked.unwrap();
    assert_eq!(made, 0, "an ack allocated");
    let dynamic: Arc<dyn Consumer> = broker;
    let (acked, made) = allocations(|| dynamic.ack(&deliveries[1].tag)).await;
    acked.unwrap();
    assert_eq!(made, 1, "a call through dyn Consumer boxes once");
}
