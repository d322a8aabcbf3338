//! The binary and `areq::run`: input files, output files, exit codes, Ctrl-C.

mod common;

use std::process::{Command, Stdio};

use areq::Console;
use common::{Route, config, site, sorted_edges};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn run_reads_the_url_file_skips_bad_lines_and_writes_the_output_file() {
    let server = site().html("/", r#"<a href="/x">"#).serve().await;
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let urls = dir.path().join("urls.txt");
    let out = dir.path().join("found.tsv");
    let list = format!(
        "# seeds\n\n{}\nnot a url\n{}#dup\n",
        server.url("/"),
        server.url("/")
    );
    std::fs::write(&urls, list).expect("the temporary directory is writable");

    let mut config = config(&["-o", out.to_str().expect("temporary paths are UTF-8")]);
    config.urls_file = urls;
    let summary = areq::run(config, &Console::default(), CancellationToken::new())
        .await
        .expect("the run succeeds");

    assert_eq!(summary.invalid_seeds, 1);
    assert_eq!(server.hits("/"), 1, "the duplicate seed is fetched once");
    let written = std::fs::read_to_string(&out).expect("the output file exists");
    assert_eq!(
        sorted_edges(&written),
        [format!("{}\t{}", server.url("/"), server.url("/x"))]
    );
}

#[tokio::test]
async fn run_fails_on_a_missing_url_file_and_on_a_list_without_urls() {
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let mut missing = config(&[]);
    missing.urls_file = dir.path().join("nope.txt");
    let error = areq::run(missing, &Console::default(), CancellationToken::new())
        .await
        .expect_err("a missing file is an error");
    assert!(
        error.to_string().starts_with("reading the url list"),
        "{error}"
    );

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "# nothing\n").expect("the temporary directory is writable");
    let mut config = config(&[]);
    config.urls_file = empty;
    let error = areq::run(config, &Console::default(), CancellationToken::new())
        .await
        .expect_err("no url is an error");
    assert!(error.to_string().starts_with("no valid url in"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_stops_the_binary_with_130_after_flushing_what_was_found() {
    let server = site()
        .html("/", r#"<a href="/hang">h</a><a href="/more">m</a>"#)
        .route("/hang", Route::hanging())
        .serve()
        .await;
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let urls = dir.path().join("urls.txt");
    let out = dir.path().join("found.tsv");
    std::fs::write(&urls, format!("{}\n", server.url("/")))
        .expect("the temporary directory is writable");

    let child = Command::new(env!("CARGO_BIN_EXE_areq"))
        .arg(&urls)
        .arg("-o")
        .arg(&out)
        .args(["--depth", "1", "--politeness", "off", "--progress", "log"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("the areq binary starts");
    // The hanging page is requested only after the seed's links were found.
    server.site.accounting.wait_for_hit("/hang").await;
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("waiting does not panic")
        .expect("the child can be waited for");

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "stderr: {stderr}");
    assert!(
        stderr.contains("(interrupted)"),
        "the summary is printed: {stderr}"
    );
    let written = std::fs::read_to_string(&out).expect("the output file exists");
    assert_eq!(
        sorted_edges(&written),
        [
            format!("{}\t{}", server.url("/"), server.url("/hang")),
            format!("{}\t{}", server.url("/"), server.url("/more")),
        ]
    );
}

/// Ctrl-C stops a run still reading its URL list from a standard input
/// left open (a terminal, a pipe whose writer waits), with 130.
#[test]
fn ctrl_c_stops_a_run_still_reading_standard_input() {
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let out = dir.path().join("found.tsv");
    let mut child = Command::new(env!("CARGO_BIN_EXE_areq"))
        .arg("-")
        .arg("-o")
        .arg(&out)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the areq binary starts");
    let stdin = child.stdin.take();
    // Its Ctrl-C handler is installed as it starts.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("areq still reads standard input 10 s after Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(stdin);
    assert_eq!(status.code(), Some(130));
}

#[test]
fn the_binary_reports_bad_arguments_with_exit_code_2() {
    let output = Command::new(env!("CARGO_BIN_EXE_areq"))
        .args(["urls.txt", "--format", "xml"])
        .output()
        .expect("the areq binary starts");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn the_binary_writes_to_stdout_with_dash_and_logs_invalid_lines_with_their_number() {
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let urls = dir.path().join("urls.txt");
    std::fs::write(&urls, "# only bad lines\nhttp://\n")
        .expect("the temporary directory is writable");
    let output = Command::new(env!("CARGO_BIN_EXE_areq"))
        .arg(&urls)
        .args(["-o", "-"])
        .output()
        .expect("the areq binary starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("urls.txt:2: skipping invalid url \"http://\""),
        "{stderr}"
    );
    assert!(stderr.contains("areq: error: no valid url in"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fail_on_broken_sets_exit_code_3_and_the_report_is_written() {
    let server = site()
        .html("/", r#"<a href="/missing">m</a><a href="/ok">o</a>"#)
        .html("/ok", "fine")
        .serve()
        .await;
    let dir = tempfile::tempdir().expect("a temporary directory can be made");
    let urls = dir.path().join("urls.txt");
    let out = dir.path().join("found.tsv");
    let report = dir.path().join("broken.txt");
    std::fs::write(&urls, format!("{}\n", server.url("/")))
        .expect("the temporary directory is writable");
    let run = |extra: &'static [&'static str]| {
        let (urls, out, report) = (urls.clone(), out.clone(), report.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_areq"))
                .arg(&urls)
                .arg("-o")
                .arg(&out)
                .arg("--report")
                .arg(&report)
                .args(["--depth", "1", "--politeness", "off"])
                .args(extra)
                .output()
                .expect("the areq binary starts")
        })
    };

    let lenient = run(&[]).await.expect("waiting does not panic");
    assert_eq!(
        lenient.status.code(),
        Some(0),
        "broken links alone are not a failure"
    );
    let strict = run(&["--fail-on-broken"])
        .await
        .expect("waiting does not panic");
    assert_eq!(
        strict.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&strict.stderr)
    );
    let expected = format!(
        "broken links: 1 url\n\nhttp 404: 1 url\n  {} (http status 404)\n    linked from {}\n",
        server.url("/missing"),
        server.url("/")
    );
    let written = std::fs::read_to_string(&report).expect("the report file exists");
    assert_eq!(written, expected);

    let to_stdout = {
        let (urls, out) = (urls.clone(), out.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_areq"))
                .arg(&urls)
                .arg("-o")
                .arg(&out)
                .args(["--report", "-", "--depth", "1", "--politeness", "off"])
                .output()
                .expect("the areq binary starts")
        })
        .await
        .expect("waiting does not panic")
    };
    assert_eq!(to_stdout.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&to_stdout.stdout), expected);
}
