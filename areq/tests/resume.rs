//! `--state`: a crawl killed at a random moment and resumed writes the same
//! edges as an uninterrupted one, each once, without fetching a completed
//! page again.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{TestServer, site, sorted_edges};

const PAGES: usize = 400;

/// A site where every page is reachable from `/p/0` (tree links) and most
/// links are duplicates (pseudo-random ones), with a little latency so that
/// the crawl is still running when it is killed.
async fn serve_site() -> TestServer {
    fn latency(_: &str) -> Duration {
        Duration::from_millis(2)
    }
    let mut builder = site().latency(latency);
    for i in 0..PAGES {
        let tree = (1..=3).map(|k| i * 3 + k);
        let random = (1..=5).map(|k| (i * 7919 + k * 104_729) % PAGES);
        let links: String = tree
            .chain(random)
            .filter(|&target| target < PAGES)
            .map(|target| format!(r#"<a href="/p/{target}">{target}</a>"#))
            .collect();
        builder = builder.html(&format!("/p/{i}"), links);
    }
    builder.serve().await
}

fn areq(urls: &Path, out: &Path, state: Option<&Path>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_areq"));
    command
        .arg(urls)
        .arg("-o")
        .arg(out)
        .args(["--depth", "50", "--politeness", "off", "--concurrency", "4"])
        .args(["--progress", "never"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(state) = state {
        command.arg("--state").arg(state);
    }
    command
}

async fn run_to_completion(mut command: Command) -> Output {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("waiting does not panic")
        .expect("the areq binary starts");
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// URLs the state file records as done.
fn done_urls(state: &Path) -> BTreeSet<String> {
    let connection = rusqlite::Connection::open(state).expect("the state file opens");
    let mut query = connection
        .prepare("SELECT url FROM urls WHERE done = 1")
        .expect("the state has a urls table");
    query
        .query_map([], |row| row.get::<_, String>(0))
        .expect("the query runs")
        .collect::<Result<_, _>>()
        .expect("urls are text")
}

fn path_of(url: &str) -> String {
    url::Url::parse(url)
        .expect("stored URLs are valid")
        .path()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crawl_killed_at_a_random_moment_resumes_to_the_same_edges_each_written_once() {
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let reference_server = serve_site().await;
    let urls = dir.path().join("urls.txt");
    std::fs::write(&urls, format!("{}\n", reference_server.url("/p/0")))
        .expect("the temporary directory is writable");
    let reference_out = dir.path().join("reference.tsv");
    run_to_completion(areq(&urls, &reference_out, None)).await;
    let reference = std::fs::read_to_string(&reference_out).expect("the output exists");
    let reference = sorted_edges(&reference.replace(&reference_server.base(), "http://site"));
    assert!(
        reference.len() > PAGES,
        "the reference crawl found the site"
    );

    let server = serve_site().await;
    std::fs::write(&urls, format!("{}\n", server.url("/p/0")))
        .expect("the temporary directory is writable");
    let out = dir.path().join("found.tsv");
    let state = dir.path().join("crawl.state");
    // A moment between a tenth and nine tenths of the crawl, different each run.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .subsec_nanos() as usize;
    let kill_after = PAGES / 10 + seed % (PAGES * 8 / 10);
    let mut child = areq(&urls, &out, Some(&state))
        .spawn()
        .expect("the areq binary starts");
    server.site.accounting.wait_for_total(kill_after).await;
    child.kill().expect("SIGKILL is delivered");
    let killed = child.wait().expect("the child can be waited for");
    assert_eq!(
        killed.code(),
        None,
        "killed by a signal (after {kill_after} requests)"
    );

    let done_before_resume = done_urls(&state);
    assert!(
        done_before_resume.len() < PAGES,
        "the crawl was killed before its end (after {kill_after} requests)"
    );
    let hits_before_resume: HashMap<String, usize> = server.site.accounting.all_hits();
    run_to_completion(areq(&urls, &out, Some(&state))).await;

    let hits_after = server.site.accounting.all_hits();
    for url in &done_before_resume {
        let path = path_of(url);
        assert_eq!(
            hits_after.get(&path),
            hits_before_resume.get(&path),
            "{path} was done before the kill (after {kill_after} requests) and fetched again"
        );
    }
    assert!(
        hits_after.values().sum::<usize>() < 2 * PAGES,
        "the resumed crawl did not start over"
    );
    let written = std::fs::read_to_string(&out).expect("the output exists");
    let edges = sorted_edges(&written.replace(&server.base(), "http://site"));
    let distinct: BTreeSet<&String> = edges.iter().collect();
    assert_eq!(distinct.len(), edges.len(), "no edge is written twice");
    assert_eq!(
        edges, reference,
        "same edges as the uninterrupted crawl (killed after {kill_after} requests)"
    );

    // A finished crawl resumed again has nothing left to do, and output
    // written after the last commit (as when killed between the write and
    // the commit) is cut off.
    let mut uncommitted = written.clone();
    uncommitted.push_str("http://site/p/0\thttp://uncommitted/\n");
    std::fs::write(&out, uncommitted).expect("the output is writable");
    let requests = server.site.accounting.total_requests();
    run_to_completion(areq(&urls, &out, Some(&state))).await;
    assert_eq!(server.site.accounting.total_requests(), requests);
    let after = std::fs::read_to_string(&out).expect("the output exists");
    assert!(
        after == written,
        "the output is what was committed; it ends with {:?}",
        after.lines().last()
    );
}

#[test]
fn state_needs_an_output_file() {
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let urls = dir.path().join("urls.txt");
    std::fs::write(&urls, "http://127.0.0.1:9/\n").expect("the temporary directory is writable");
    let output = Command::new(env!("CARGO_BIN_EXE_areq"))
        .arg(&urls)
        .args(["-o", "-", "--state"])
        .arg(dir.path().join("s.db"))
        .output()
        .expect("the areq binary starts");
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--state needs an output file"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_dot_output_keeps_one_header_and_one_footer() {
    let server = site()
        .html("/", r#"<a href="/a">a</a>"#)
        .html("/a", r#"<a href="/">home</a>"#)
        .serve()
        .await;
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let urls = dir.path().join("urls.txt");
    std::fs::write(&urls, format!("{}\n", server.url("/")))
        .expect("the temporary directory is writable");
    let out = dir.path().join("graph.dot");
    let state = dir.path().join("crawl.state");
    let dot_run = || {
        let mut command = areq(&urls, &out, Some(&state));
        command.args(["--format", "dot"]);
        command
    };

    run_to_completion(dot_run()).await;
    let first = std::fs::read_to_string(&out).expect("the output exists");
    run_to_completion(dot_run()).await;
    let second = std::fs::read_to_string(&out).expect("the output exists");

    let expected = format!(
        "digraph links {{\n  \"{home}\" -> \"{a}\";\n  \"{a}\" -> \"{home}\";\n}}\n",
        home = server.url("/"),
        a = server.url("/a")
    );
    assert_eq!(first, expected);
    assert_eq!(second, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crawl_stopped_by_ctrl_c_resumes_with_the_same_command() {
    let server = site()
        .html("/", r#"<a href="/hang">h</a><a href="/done">d</a>"#)
        .html("/done", r#"<a href="/after-done">x</a>"#)
        .route("/hang", common::Route::hanging())
        .serve()
        .await;
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let urls = dir.path().join("urls.txt");
    std::fs::write(&urls, format!("{}\n", server.url("/")))
        .expect("the temporary directory is writable");
    let out = dir.path().join("found.tsv");
    let state = dir.path().join("crawl.state");

    let child = areq(&urls, &out, Some(&state))
        .spawn()
        .expect("the areq binary starts");
    server.site.accounting.wait_for_hit("/hang").await;
    server.site.accounting.wait_for_hit("/after-done").await;
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    let stopped = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("waiting does not panic")
        .expect("the child can be waited for");
    assert_eq!(stopped.status.code(), Some(130));

    // The page that hung now answers; the same command finishes the crawl.
    server.add("/hang", common::Route::html(r#"<a href="/">home</a>"#));
    run_to_completion(areq(&urls, &out, Some(&state))).await;

    assert_eq!(server.hits("/"), 1, "the seed was done before Ctrl-C");
    assert_eq!(server.hits("/done"), 1);
    assert_eq!(
        server.hits("/hang"),
        2,
        "in flight at Ctrl-C: fetched again"
    );
    let written = std::fs::read_to_string(&out).expect("the output exists");
    let at = |path: &str| server.url(path).to_string();
    assert_eq!(
        sorted_edges(&written),
        [
            format!("{}\t{}", at("/"), at("/done")),
            format!("{}\t{}", at("/"), at("/hang")),
            format!("{}\t{}", at("/done"), at("/after-done")),
            format!("{}\t{}", at("/hang"), at("/")),
        ]
    );
}
