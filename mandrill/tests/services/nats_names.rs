//! NATS names of one's own: a stream, its subjects and a consumer unique to
//! one test or benchmark run, and the streams deleted when dropped. The one
//! copy: the NATS broker's unit tests, the integration tests
//! (`services::NatsNames`) and the benchmark include this file (`#[path]`).
//! No mandrill types here, so that it compiles in each of them.

// Each includer uses part of it.
#![allow(dead_code)]

/// Names for `{kind}` (`test`, `bench`): stream `MANDRILL_{KIND}_{id}`,
/// subjects `mandrill.{kind}.{id}.requests` and `.dead`, consumer
/// `mandrill-{kind}-{id}`.
/// Not `Clone`: each value deletes the streams when dropped.
#[derive(Debug)]
pub struct StreamNames {
    /// The server, to delete the streams from.
    pub url: String,
    pub id: String,
    pub stream: String,
    pub subject: String,
    pub consumer: String,
    pub dead_letter_subject: String,
}

impl StreamNames {
    pub fn new(url: &str, kind: &str) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self {
            url: url.to_owned(),
            stream: format!("MANDRILL_{}_{id}", kind.to_uppercase()),
            subject: format!("mandrill.{kind}.{id}.requests"),
            consumer: format!("mandrill-{kind}-{id}"),
            dead_letter_subject: format!("mandrill.{kind}.{id}.dead"),
            id,
        }
    }
}

impl Drop for StreamNames {
    /// Deletes the stream and its dead-letter stream (`{stream}_DEAD`).
    fn drop(&mut self) {
        let url = self.url.clone();
        let stream = self.stream.clone();
        // Drop runs inside or outside a runtime; a thread with a short-lived
        // one does the work either way.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(url.as_str()).await {
                    let js = async_nats::jetstream::new(client);
                    let _ = js.delete_stream(&stream).await;
                    let _ = js.delete_stream(format!("{stream}_DEAD")).await;
                }
            });
        })
        .join();
    }
}
