//! A claim committed whose answer never reaches mandrill, lost for real: the
//! real binary's PostgreSQL connections go through a proxy in this test,
//! which lets one claim's `COMMIT` reach the server, reads the server's
//! answer (so the commit is done), drops it, and cuts the connection. The
//! worker tries the claim again in place; it must get the attempt it
//! claimed, not find its own claim "in flight" and later count it as an
//! attempt whose outcome is unknown (with `max_attempts = 1`, the request
//! given up without a restart).

mod services;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use services::Database;
use support::{DEADLINE, Mandrill, mandrill, temp_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Text only the store's batched claim statement holds (its `Parse`
/// message carries it the first time a connection runs it).
const CLAIM_STATEMENT: &[u8] = b"WITH claimed AS";

/// The end of a `COMMIT`, as the client sends it (a simple query, or a
/// statement to parse) and as the server's `CommandComplete` tags it.
const COMMIT: &[u8] = b"COMMIT\0";

/// A TCP proxy in front of PostgreSQL that loses the answer to the first
/// claim's `COMMIT` it sees, and forwards everything else.
struct LosingProxy {
    port: u16,
    /// Answers lost so far (one at most).
    cuts: Arc<AtomicUsize>,
    /// Runs the proxy; dropping it stops every relay.
    _runtime: tokio::runtime::Runtime,
}

impl LosingProxy {
    fn start(upstream: String) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("a free port");
        let port = listener.local_addr().expect("bound").port();
        let cuts = Arc::new(AtomicUsize::new(0));
        let taken = Arc::new(AtomicBool::new(false));
        runtime.spawn({
            let cuts = cuts.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let server = TcpStream::connect(&upstream)
                        .await
                        .expect("postgres reachable for tests");
                    tokio::spawn(relay(client, server, taken.clone(), cuts.clone()));
                }
            }
        });
        Self {
            port,
            cuts,
            _runtime: runtime,
        }
    }

    fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Relays one connection. Once the client has sent the claim statement and
/// then a `COMMIT` (and no other connection's answer was lost yet), the
/// server's answers are no longer forwarded; once the server has answered
/// the `COMMIT` (it committed), both connections are closed.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    taken: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let losing = Arc::new(AtomicBool::new(false));
    let upstream = {
        let losing = losing.clone();
        async move {
            let mut sent: Vec<u8> = Vec::new();
            let mut buffer = vec![0; 64 * 1024];
            loop {
                let n = match from_client.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if !losing.load(Ordering::SeqCst) {
                    sent.extend_from_slice(&buffer[..n]);
                    let commit_after_claim = find(&sent, CLAIM_STATEMENT)
                        .is_some_and(|at| find(&sent[at..], COMMIT).is_some());
                    if commit_after_claim && !taken.swap(true, Ordering::SeqCst) {
                        // Before the COMMIT goes out: none of its answer is
                        // forwarded.
                        losing.store(true, Ordering::SeqCst);
                    }
                    if find(&sent, CLAIM_STATEMENT).is_none() {
                        // Only what follows a claim statement matters.
                        let keep = sent.len().saturating_sub(CLAIM_STATEMENT.len());
                        sent.drain(..keep);
                    }
                }
                if to_server.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let downstream = async move {
        let mut lost: Vec<u8> = Vec::new();
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let n = match from_server.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if losing.load(Ordering::SeqCst) {
                lost.extend_from_slice(&buffer[..n]);
                if find(&lost, COMMIT).is_some() {
                    // Committed, and the answer dropped: cut both sides.
                    cuts.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                continue;
            }
            if to_client.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever side ends first ends the relay, closing both connections.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// Restarts issued, one line each, written before each is issued.
fn journal_lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_claim_whose_commit_answer_is_lost_is_restarted_once_not_given_up() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let mut url = url::Url::parse(&db.url).expect("a database url");
    let upstream = format!(
        "{}:{}",
        url.host_str().expect("a host"),
        url.port().unwrap_or(5432)
    );
    let proxy = LosingProxy::start(upstream);
    url.set_port(Some(proxy.port)).expect("a port can be set");
    // Plain text, so that the proxy can read the statements.
    url.query_pairs_mut().append_pair("sslmode", "disable");

    std::fs::write(dir.join("names"), "lost-reply-0001\n").unwrap();
    let (status, _, stderr) = mandrill(&dir, &["publish", "--file", "names"], &[]);
    assert!(status.success(), "{stderr}");

    let journal = dir.join("restarts.journal");
    let journal_setting = format!("restarter.journal={}", journal.display());
    let db_url = url.to_string();
    let instance = Mandrill::run(
        &dir,
        &[
            "--db",
            &db_url,
            "--set",
            "worker.max_attempts=1",
            "--set",
            "worker.record_backoff=50ms",
            // A short hold, so that the code before the token (which took
            // its own claim for another's, and waited out the hold) fails
            // this test in seconds.
            "--set",
            "worker.restart_timeout=2s",
            "--set",
            "broker.ack_deadline=1s",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.min_latency=1ms",
            "--set",
            "restarter.max_latency=5ms",
            "--set",
            &journal_setting,
        ],
    );
    db.wait_finished(1, DEADLINE);
    instance.signal("TERM");
    let (_, lines) = instance.wait_exit();

    assert_eq!(proxy.cuts(), 1, "the claim's answer was lost");
    let statuses = db.statuses();
    assert_eq!(
        statuses,
        vec![("restarted".to_owned(), 1)],
        "restarted, not given up: {lines:?}"
    );
    assert_eq!(journal_lines(&journal), 1, "restarted exactly once");
    let (attempts, last_error): (i32, Option<String>) = block_on_query(&db.url);
    assert_eq!(attempts, 1, "one attempt, the one claimed");
    assert_eq!(last_error, None, "no attempt counted as unknown");
}

/// The only request's attempts and last error.
fn block_on_query(url: &str) -> (i32, Option<String>) {
    use sqlx::Connection as _;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let mut connection = sqlx::postgres::PgConnection::connect(url)
                .await
                .expect("postgres");
            sqlx::query_as("SELECT attempts, last_error FROM requests")
                .fetch_one(&mut connection)
                .await
                .expect("the request's row")
        })
}
