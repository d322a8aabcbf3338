//! The pull loop keeps more than one pull outstanding: a pull that waits
//! (for a commit, a slow broker) does not keep the next batch from being
//! pulled and handled.

use super::*;

/// The memory broker, whose first pull never answers.
struct FirstPullHangs {
    inner: MemoryBroker,
    pulls: AtomicU32,
}

impl Close for FirstPullHangs {}

#[async_trait]
impl Consumer for FirstPullHangs {
    fn lease(&self) -> Option<Duration> {
        self.inner.lease()
    }
    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        if self.pulls.fetch_add(1, Ordering::AcqRel) == 0 {
            return std::future::pending().await;
        }
        self.inner.pull(max).await
    }
    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.inner.ack(tag).await
    }
    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        self.inner.nack(tag, delay).await
    }
    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.inner.extend(tag).await
    }
    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        self.inner.dead_letter(tag, reason).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_pull_that_never_answers_does_not_keep_the_next_batch_from_being_handled() {
    let broker = Arc::new(FirstPullHangs {
        inner: MemoryBroker::new(ACK_DEADLINE, Duration::from_millis(50)),
        pulls: AtomicU32::new(0),
    });
    let store = Arc::new(MemoryStore::new());
    let stats = Arc::new(Stats::default());
    let shutdown = Shutdown::new();
    let worker = Worker::new(
        config(),
        broker.clone(),
        store.clone() as Arc<dyn Store>,
        Arc::new(ScriptedRestarter::default()),
        stats.clone(),
    );
    let worker = tokio::spawn(worker.run(shutdown.clone()));
    let mut ids = Vec::new();
    for instance in ["alpha", "bravo", "charlie"] {
        let (id, body) = payload(instance);
        broker.inner.publish(body).await.unwrap();
        ids.push(id);
    }
    wait_until("every request is acked", || stats.acked.get() == 3).await;
    for id in ids {
        assert_eq!(store.lookup(id).await.unwrap(), Some(Status::Restarted));
    }
    // The hanging pull is still outstanding; shutdown drops it.
    assert!(broker.pulls.load(Ordering::Acquire) >= 2);
    shutdown.request();
    worker.await.unwrap().unwrap();
}
