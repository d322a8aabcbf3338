//! Real servers for the integration tests: a fresh PostgreSQL database per
//! test, NATS names unique to the test (`nats_names.rs`), a private `nats-server` that a test
//! may stop and start, a private `sshd` (`sshd.rs`), a private moto server
//! for EC2 and Auto Scaling (`moto.rs`, with `ec2_fleet.py`), and a proxy
//! that turns into a network black hole (`black_hole.rs`). Everything is
//! removed when dropped.

#![allow(dead_code)]

pub mod black_hole;
pub mod moto;
pub mod nats_names;
pub mod postgres;
pub mod private_postgres;
pub mod sshd;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::postgres::PgConnection;
use uuid::Uuid;

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

pub fn postgres_server() -> String {
    postgres::server_url()
}

pub fn nats_server() -> String {
    std::env::var("MANDRILL_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A database of its own, dropped afterwards.
pub struct Database {
    pub name: String,
    pub url: String,
    /// Drops the database when dropped.
    _database: postgres::TestDatabase,
}

impl Database {
    pub fn create() -> Self {
        let database = block_on(postgres::TestDatabase::create_on(
            &postgres_server(),
            "mandrill_test",
        ));
        Self {
            name: database.name.clone(),
            url: database.url.clone(),
            _database: database,
        }
    }

    /// Counts of requests by status.
    pub fn statuses(&self) -> Vec<(String, i64)> {
        block_on(async {
            let mut connection = PgConnection::connect(&self.url).await.expect("postgres");
            let table_exists: bool =
                sqlx::query_scalar("SELECT to_regclass('requests') IS NOT NULL")
                    .fetch_one(&mut connection)
                    .await
                    .expect("query");
            if !table_exists {
                return Vec::new();
            }
            sqlx::query_as("SELECT status, count(*) FROM requests GROUP BY status ORDER BY status")
                .fetch_all(&mut connection)
                .await
                .expect("query")
        })
    }

    /// Requests whose outcome is final.
    pub fn finished(&self) -> i64 {
        self.statuses()
            .iter()
            .filter(|(status, _)| matches!(status.as_str(), "restarted" | "failed" | "rejected"))
            .map(|(_, n)| n)
            .sum()
    }

    /// Waits until `count` requests are final.
    pub fn wait_finished(&self, count: i64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let finished = self.finished();
            if finished >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {finished} of {count} finished: {:?}",
                self.statuses()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// NATS names unique to one test, as `--set` flags; streams deleted on drop.
pub struct NatsNames {
    pub url: String,
    names: nats_names::StreamNames,
}

impl NatsNames {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            names: nats_names::StreamNames::new(url, "test"),
        }
    }

    /// The subject requests are published on.
    #[allow(dead_code)] // not every test binary publishes by hand
    pub fn subject(&self) -> &str {
        &self.names.subject
    }

    /// Flags naming the stream, subjects and consumer.
    pub fn flags(&self) -> Vec<String> {
        let names = &self.names;
        [
            format!("broker.nats.stream={}", names.stream),
            format!("broker.nats.subject={}", names.subject),
            format!("broker.nats.consumer={}", names.consumer),
            format!(
                "broker.nats.dead_letter_subject={}",
                names.dead_letter_subject
            ),
        ]
        .into_iter()
        .flat_map(|setting| ["--set".to_owned(), setting])
        .collect()
    }

    /// Publishes `payload` on the requests subject as any client allowed to
    /// publish there could, with `msg_id` as JetStream's `Nats-Msg-Id`, and
    /// waits for the stream to store it (the stream must exist).
    pub fn publish_as_anyone(&self, msg_id: &str, payload: &'static [u8]) {
        block_on(async {
            let client = async_nats::connect(self.url.as_str()).await.expect("nats");
            let message = async_nats::jetstream::message::PublishMessage::build()
                .message_id(msg_id)
                .payload(payload.into());
            async_nats::jetstream::new(client)
                .send_publish(self.names.subject.clone(), message)
                .await
                .expect("publish")
                .await
                .expect("stored");
        });
    }
}

/// A `nats-server -js` of the test's own, on a free port, with its own store.
pub struct PrivateNats {
    pub port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
    /// Extra arguments, e.g. `--user` and `--pass`.
    auth: Vec<String>,
}

impl PrivateNats {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server that requires this user and password.
    pub fn start_with_user(user: &str, password: &str) -> Self {
        Self::start_with(&["--user", user, "--pass", password])
    }

    fn start_with(auth: &[&str]) -> Self {
        let mut server = Self {
            port: free_port(),
            store: tempfile::tempdir().expect("temp dir"),
            child: None,
            auth: auth.iter().map(|a| a.to_string()).collect(),
        };
        server.resume();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again), on the same port and store.
    pub fn resume(&mut self) {
        let child = Command::new(nats_binary())
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.store.path())
            .args(&self.auth)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the running server with SIGSTOP: connections stay open and
    /// nothing answers, as a hung host.
    pub fn pause(&self) {
        self.send("STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn unpause(&self) {
        self.send("CONT");
    }

    fn send(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args(["-s", signal, &child.id().to_string()])
                .status();
        }
    }

    /// Stops the server, as an operator restarting it would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-s", "TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A port nothing listens on (free when asked; nothing binds it after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port()
}

fn nats_binary() -> String {
    for candidate in [
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
        "/usr/local/bin/nats-server",
    ] {
        if Path::new(candidate).exists() {
            return candidate.to_owned();
        }
    }
    "nats-server".to_owned()
}

/// The Pub/Sub emulator's launcher (package `google-cloud-cli-pubsub-emulator`);
/// it execs the JVM, so the child's PID is the emulator's.
const PUBSUB_EMULATOR: &str =
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// A Pub/Sub emulator of the test's own on a free port, killed by PID on
/// drop; names unique to the test as `--set` flags.
pub struct PrivatePubSub {
    pub host: String,
    child: Child,
    pub id: String,
}

impl PrivatePubSub {
    pub fn start() -> Self {
        let port = free_port();
        let child = Command::new(PUBSUB_EMULATOR)
            .args(["--host=127.0.0.1", &format!("--port={port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the pubsub emulator");
        let emulator = Self {
            host: format!("127.0.0.1:{port}"),
            child,
            id: Uuid::new_v4().simple().to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !emulator.answers() {
            assert!(
                Instant::now() < deadline,
                "the pubsub emulator did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        emulator
    }

    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(&self.host) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.host
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        // The emulator may keep the connection open: what arrived before
        // the read timeout is the answer.
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        response.trim_end().ends_with("Ok")
    }

    /// `pubsub://PROJECT/SUBSCRIPTION`.
    pub fn url(&self) -> String {
        format!("pubsub://mandrill-test/requests-{}", self.id)
    }

    /// Publishes `data` (base64) to the request topic through the
    /// emulator's REST API, as any client allowed to publish there could:
    /// `mandrill publish` refuses what is not a request.
    pub fn publish_raw(&self, data_base64: &str) {
        use std::io::{Read, Write};
        let body = format!(r#"{{"messages":[{{"data":"{data_base64}"}}]}}"#);
        let request = format!(
            "POST /v1/projects/mandrill-test/topics/requests-{}:publish HTTP/1.1\r\n\
             Host: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.id,
            self.host,
            body.len()
        );
        let mut stream = std::net::TcpStream::connect(&self.host).expect("the emulator");
        stream.write_all(request.as_bytes()).expect("publish");
        // The status line is enough (the emulator answers once it stored
        // the message), and it may keep the connection open after it.
        let mut response = Vec::new();
        let mut chunk = [0; 1024];
        while !response.windows(2).any(|w| w == b"\r\n") {
            let read = stream.read(&mut chunk).expect("the emulator's answer");
            assert!(read > 0, "the emulator closed without answering");
            response.extend_from_slice(&chunk[..read]);
        }
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }

    /// Flags naming the endpoint and topics.
    pub fn flags(&self) -> Vec<String> {
        let id = &self.id;
        [
            format!("broker.pubsub.endpoint=http://{}", self.host),
            format!("broker.pubsub.topic=requests-{id}"),
            format!("broker.pubsub.dead_letter_topic=dead-{id}"),
            format!("broker.pubsub.dead_letter_subscription=dead-{id}"),
        ]
        .into_iter()
        .flat_map(|setting| ["--set".to_owned(), setting])
        .collect()
    }
}

impl Drop for PrivatePubSub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
