//! A scripted HTTP site on 127.0.0.1:0 that counts what it serves, and a
//! helper that crawls it with the library.

#![allow(dead_code)] // each test binary uses its own part of the helpers

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use areq::{Config, Console, Summary};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use clap::Parser;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use url::Url;

/// One scripted response.
#[derive(Clone, Debug)]
pub struct Route {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Answer with `later` after this many requests (for retries).
    pub then: Option<(usize, Box<Route>)>,
    /// Never answer (for timeouts and Ctrl-C).
    pub hang: bool,
}

impl Route {
    pub fn html(body: impl Into<String>) -> Self {
        Self::with_type(200, "text/html; charset=utf-8", body.into().into_bytes())
    }

    pub fn with_type(status: u16, content_type: &str, body: Vec<u8>) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            body,
            then: None,
            hang: false,
        }
    }

    pub fn redirect(to: &str) -> Self {
        Self {
            status: 302,
            headers: vec![("location".into(), to.into())],
            body: Vec::new(),
            then: None,
            hang: false,
        }
    }

    pub fn status(status: u16) -> Self {
        Self::with_type(status, "text/plain", b"no".to_vec())
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn hanging() -> Self {
        Self {
            hang: true,
            ..Self::status(200)
        }
    }
}

/// What the server saw.
#[derive(Default)]
pub struct Accounting {
    hits: Mutex<HashMap<String, usize>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    changed: Notify,
    /// Headers of the latest request.
    last_headers: Mutex<HeaderMap>,
}

/// Site content and behaviour, shared with the handler.
pub struct Site {
    routes: Mutex<HashMap<String, Route>>,
    pub accounting: Arc<Accounting>,
    /// Hold requests under this path prefix until this many requests are
    /// in flight at once (or a deadline passes), so that a concurrency
    /// limit is actually reached rather than assumed.
    hold: Option<(String, usize)>,
    /// Simulated latency per path, to shuffle completion order.
    latency: Option<fn(&str) -> Duration>,
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub site: Arc<Site>,
}

pub struct SiteBuilder {
    routes: HashMap<String, Route>,
    accounting: Option<Arc<Accounting>>,
    hold: Option<(String, usize)>,
    latency: Option<fn(&str) -> Duration>,
}

pub fn site() -> SiteBuilder {
    SiteBuilder {
        routes: HashMap::new(),
        accounting: None,
        hold: None,
        latency: None,
    }
}

impl SiteBuilder {
    pub fn route(mut self, path: &str, route: Route) -> Self {
        self.routes.insert(path.into(), route);
        self
    }

    pub fn html(self, path: &str, body: impl Into<String>) -> Self {
        self.route(path, Route::html(body))
    }

    pub fn hold(mut self, prefix: &str, until_in_flight: usize) -> Self {
        self.hold = Some((prefix.into(), until_in_flight));
        self
    }

    pub fn latency(mut self, latency: fn(&str) -> Duration) -> Self {
        self.latency = Some(latency);
        self
    }

    /// Shares request accounting with another server (a global count).
    pub fn accounting(mut self, accounting: Arc<Accounting>) -> Self {
        self.accounting = Some(accounting);
        self
    }

    pub async fn serve(self) -> TestServer {
        let site = Arc::new(Site {
            routes: Mutex::new(self.routes),
            accounting: self.accounting.unwrap_or_default(),
            hold: self.hold,
            latency: self.latency,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding 127.0.0.1:0 works in tests");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let app = Router::new().fallback(handle).with_state(site.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        TestServer { addr, site }
    }
}

/// Decrements the in-flight count even when the client hangs up.
struct InFlight(Arc<Accounting>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(State(site): State<Arc<Site>>, uri: Uri, headers: HeaderMap) -> Response<Body> {
    let key = uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let accounting = site.accounting.clone();
    *accounting
        .last_headers
        .lock()
        .expect("no test panics while holding the lock") = headers;
    let hits = {
        let mut hits = accounting
            .hits
            .lock()
            .expect("no test panics while holding the lock");
        let count = hits.entry(key.clone()).or_default();
        *count += 1;
        *count
    };
    let now_in_flight = accounting.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _in_flight = InFlight(accounting.clone());
    accounting
        .max_in_flight
        .fetch_max(now_in_flight, Ordering::SeqCst);
    accounting.changed.notify_waiters();

    if let Some((prefix, target)) = &site.hold
        && key.starts_with(prefix.as_str())
    {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut changed = pin!(accounting.changed.notified());
            changed.as_mut().enable();
            if accounting.max_in_flight.load(Ordering::SeqCst) >= *target {
                break;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
    }
    if let Some(latency) = site.latency {
        tokio::time::sleep(latency(&key)).await;
    }

    let route = site
        .routes
        .lock()
        .expect("no test panics while holding the lock")
        .get(&key)
        .cloned();
    let mut route = match route {
        Some(route) => route,
        None => Route::status(404),
    };
    if let Some((after, later)) = route.then.take()
        && hits > after
    {
        route = *later;
    }
    if route.hang {
        std::future::pending::<()>().await;
    }
    let mut response = Response::builder()
        .status(StatusCode::from_u16(route.status).expect("test statuses are valid"));
    for (name, value) in &route.headers {
        response = response.header(name, value);
    }
    response
        .body(Body::from(route.body))
        .expect("test responses are valid")
}

impl TestServer {
    pub fn url(&self, path: &str) -> Url {
        Url::parse(&format!("http://{}{path}", self.addr)).expect("test URLs are valid")
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn hits(&self, path: &str) -> usize {
        self.site.accounting.hits(path)
    }

    pub fn add(&self, path: &str, route: Route) {
        self.site
            .routes
            .lock()
            .expect("no test panics while holding the lock")
            .insert(path.into(), route);
    }
}

impl Accounting {
    pub fn hits(&self, path: &str) -> usize {
        self.hits
            .lock()
            .expect("no test panics while holding the lock")
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    pub fn all_hits(&self) -> HashMap<String, usize> {
        self.hits
            .lock()
            .expect("no test panics while holding the lock")
            .clone()
    }

    pub fn last_header(&self, name: &str) -> Option<String> {
        let headers = self
            .last_headers
            .lock()
            .expect("no test panics while holding the lock");
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn total_requests(&self) -> usize {
        self.all_hits().values().sum()
    }

    /// Waits until this many requests have arrived in all, or panics after a deadline.
    pub async fn wait_for_total(&self, total: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            if self.total_requests() >= total {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => panic!("fewer than {total} requests within 30s"),
            }
        }
    }

    /// Waits until some request for `path` has arrived, or panics after a deadline.
    pub async fn wait_for_hit(&self, path: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            if self.hits(path) > 0 {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => panic!("no request for {path} within 10s"),
            }
        }
    }
}

/// A `Write` whose bytes the test can read, during the run or after it.
#[derive(Clone, Default)]
pub struct SharedBuffer(Arc<Mutex<Vec<u8>>>, Arc<Notify>);

impl Write for SharedBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("no test panics while holding the lock")
            .extend_from_slice(bytes);
        self.1.notify_waiters();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SharedBuffer {
    /// Waits until the text written so far contains `needle`, or panics after a deadline.
    pub async fn wait_for(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut written = pin!(self.1.notified());
            written.as_mut().enable();
            if self.text().contains(needle) {
                return;
            }
            tokio::select! {
                () = written => {}
                () = tokio::time::sleep_until(deadline) => panic!("{needle:?} not written within 10s"),
            }
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8(
            self.0
                .lock()
                .expect("no test panics while holding the lock")
                .clone(),
        )
        .expect("areq writes UTF-8")
    }
}

/// Parses flags as the binary would (the URL file argument is unused here).
pub fn config(flags: &[&str]) -> Config {
    let mut args = vec!["areq", "unused-urls.txt", "--progress", "never"];
    args.extend_from_slice(flags);
    Config::parse_from(args)
}

/// Crawls `seeds` with `flags`; returns the summary and the output text.
pub async fn crawl(seeds: &[Url], flags: &[&str]) -> (Summary, String) {
    let output = SharedBuffer::default();
    let summary = areq::crawl(
        &config(flags),
        seeds.to_vec(),
        Box::new(output.clone()),
        &Console::default(),
        CancellationToken::new(),
    )
    .await
    .expect("crawling a local site does not fail as a whole");
    (summary, output.text())
}

/// The edge lines of tsv output, without the header, sorted.
pub fn sorted_edges(output: &str) -> Vec<String> {
    let mut lines = output.lines();
    assert_eq!(
        lines.next(),
        Some("source_url\tparsed_url"),
        "tsv output starts with its header"
    );
    let mut edges: Vec<String> = lines.map(str::to_owned).collect();
    edges.sort();
    edges
}

/// A port on 127.0.0.1 that refuses connections for as long as the
/// returned socket lives: bound, never listening. A port merely bound and
/// freed again could be handed to the test's own server started next (it
/// was, once: the "refused" link then led home).
pub fn closed_port() -> (u16, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(([127, 0, 0, 1], 0).into())
        .expect("binding 127.0.0.1:0 works in tests");
    let port = socket
        .local_addr()
        .expect("a bound socket has an address")
        .port();
    (port, socket)
}
