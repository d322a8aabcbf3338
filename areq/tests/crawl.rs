//! End-to-end behaviour of the crawler against local servers.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use areq::report::ErrorKind;
use common::{Accounting, Route, closed_port, crawl, site, sorted_edges};
use url::Url;

fn edges(pairs: &[(String, String)]) -> Vec<String> {
    let mut lines: Vec<String> = pairs.iter().map(|(s, t)| format!("{s}\t{t}")).collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn a_404_and_a_refused_connection_fail_alone_while_other_pages_succeed() {
    let server = site()
        .html("/ok", r#"<a href="/a">a</a> <a href="b">b</a>"#)
        .serve()
        .await;
    let (port, _held_closed) = closed_port();
    let refused = Url::parse(&format!("http://127.0.0.1:{port}/")).expect("valid");
    let seeds = [server.url("/missing"), refused, server.url("/ok")];

    let (summary, output) = crawl(&seeds, &[]).await;

    let base = server.base();
    assert_eq!(
        sorted_edges(&output),
        edges(&[
            (format!("{base}/ok"), format!("{base}/a")),
            (format!("{base}/ok"), format!("{base}/b")),
        ])
    );
    assert_eq!(summary.pages, 1);
    assert_eq!(summary.edges, 2);
    assert_eq!(
        summary.errors,
        BTreeMap::from([(ErrorKind::Http(404), 1), (ErrorKind::Connect, 1)])
    );
}

#[tokio::test]
async fn links_are_resolved_end_to_end_with_base_quoting_entities_and_charset() {
    // Each case is a page body and the links expected from it.
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "/dir/plain",
            r#"<a href="rel">x</a><a href='/abs'>y</a><a href=bare>z</a>"#,
            &["/dir/rel", "/abs", "/dir/bare"],
        ),
        (
            "/dir/base",
            r#"<base href="/other/"><a href="rel">x</a><area href="../up">"#,
            &["/other/rel", "/up"],
        ),
        (
            "/dir/entities",
            r#"<a href="/q?a=1&amp;b=2&#38;c=3">x</a>"#,
            &["/q?a=1&b=2&c=3"],
        ),
        (
            "/dir/fragments",
            r##"<a href="#top">x</a><a href="/page#part">y</a>"##,
            &["/dir/fragments", "/page"],
        ),
    ];
    let mut builder = site();
    for (path, body, _) in cases {
        builder = builder.html(path, *body);
    }
    let latin1 = b"<a href=\"/caf\xe9\">caf\xe9</a>".to_vec();
    builder = builder.route(
        "/latin1",
        Route::with_type(200, "text/html; charset=iso-8859-1", latin1),
    );
    let server = builder.serve().await;

    for (path, _, expected) in cases {
        let (_, output) = crawl(&[server.url(path)], &[]).await;
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|link| (server.url(path).to_string(), server.url(link).to_string()))
            .collect();
        assert_eq!(sorted_edges(&output), edges(&expected), "page {path}");
    }
    let (_, output) = crawl(&[server.url("/latin1")], &[]).await;
    assert_eq!(
        sorted_edges(&output),
        edges(&[(
            server.url("/latin1").to_string(),
            server.url("/caf%C3%A9").to_string()
        )])
    );
}

#[tokio::test]
async fn pages_that_are_not_html_are_fetched_but_not_parsed() {
    let fake_links = b"<a href=\"/should-not-appear\">".to_vec();
    let server = site()
        .html(
            "/",
            r#"<a href="/doc.pdf">pdf</a><a href="/data.json">json</a>"#,
        )
        .route(
            "/doc.pdf",
            Route::with_type(200, "application/pdf", fake_links.clone()),
        )
        .route(
            "/data.json",
            Route::with_type(200, "application/json", fake_links),
        )
        .serve()
        .await;

    let (summary, output) = crawl(&[server.url("/")], &["--depth", "1"]).await;

    assert!(!output.contains("should-not-appear"));
    assert_eq!(server.hits("/doc.pdf"), 1);
    assert_eq!(summary.pages, 3);
    assert_eq!(summary.not_html, 2);
    assert_eq!(server.hits("/should-not-appear"), 0);
}

#[tokio::test]
async fn redirects_are_followed_up_to_the_limit_and_links_resolve_against_the_target() {
    let server = site()
        .route("/r1", Route::redirect("/r2"))
        .route("/r2", Route::redirect("/r3"))
        .route("/r3", Route::redirect("/final/page"))
        .html("/final/page", r#"<a href="next">next</a>"#)
        .serve()
        .await;

    let (summary, output) = crawl(&[server.url("/r1")], &["--max-redirects", "3"]).await;
    assert_eq!(
        sorted_edges(&output),
        edges(&[(
            server.url("/r1").to_string(),
            server.url("/final/next").to_string()
        )])
    );
    assert_eq!(summary.error_count(), 0);

    let (summary, output) = crawl(&[server.url("/r1")], &["--max-redirects", "2"]).await;
    assert!(sorted_edges(&output).is_empty());
    assert_eq!(
        summary.errors,
        BTreeMap::from([(ErrorKind::TooManyRedirects, 1)])
    );
}

#[tokio::test]
async fn recursion_stops_at_the_requested_depth() {
    let server = site()
        .html("/d0", r#"<a href="/d1">"#)
        .html("/d1", r#"<a href="/d2">"#)
        .html("/d2", r#"<a href="/d3">"#)
        .html("/d3", r#"<a href="/d4">"#)
        .serve()
        .await;

    let (summary, output) = crawl(
        &[server.url("/d0")],
        &["--depth", "2", "--politeness", "off"],
    )
    .await;

    let fetched: Vec<usize> = ["/d0", "/d1", "/d2", "/d3"]
        .iter()
        .map(|p| server.hits(p))
        .collect();
    assert_eq!(fetched, [1, 1, 1, 0]);
    // The last page fetched still reports its links; they are just not followed.
    let pairs: Vec<(String, String)> = (0..3)
        .map(|i| {
            (
                server.url(&format!("/d{i}")).to_string(),
                server.url(&format!("/d{}", i + 1)).to_string(),
            )
        })
        .collect();
    assert_eq!(sorted_edges(&output), edges(&pairs));
    assert_eq!(summary.pages, 3);
}

#[tokio::test]
async fn scope_keeps_recursion_on_the_seed_host_unless_widened() {
    let other = site()
        .html("/elsewhere", r#"<a href="/deeper">"#)
        .serve()
        .await;
    let home = site()
        .html(
            "/",
            format!(
                r#"<a href="/local">l</a><a href="/skip/me">s</a><a href="{}/elsewhere">o</a>"#,
                other.base()
            ),
        )
        .html("/local", "no links")
        .html("/skip/me", "no links")
        .serve()
        .await;

    let (_, output) = crawl(&[home.url("/")], &["--depth", "2", "--politeness", "off"]).await;
    assert_eq!(home.hits("/local"), 1);
    assert_eq!(
        other.hits("/elsewhere"),
        0,
        "another host is out of the default scope"
    );
    assert!(
        output.contains(&format!("{}/elsewhere", other.base())),
        "out-of-scope links are still reported"
    );

    assert_eq!(home.hits("/skip/me"), 1);

    let flags = [
        "--depth",
        "2",
        "--politeness",
        "off",
        "--scope",
        "any",
        "--exclude",
        "/skip/",
    ];
    crawl(&[home.url("/")], &flags).await;
    assert_eq!(
        other.hits("/elsewhere"),
        1,
        "--scope any follows other hosts"
    );
    assert_eq!(other.hits("/deeper"), 1);
    assert_eq!(home.hits("/skip/me"), 1, "--exclude is honoured");

    let flags = [
        "--depth",
        "2",
        "--politeness",
        "off",
        "--include",
        "/local$",
    ];
    crawl(&[home.url("/")], &flags).await;
    assert_eq!(
        home.hits("/local"),
        3,
        "--include lets matching links through"
    );
    assert_eq!(
        home.hits("/skip/me"),
        1,
        "links not matching --include are not followed"
    );
}

#[tokio::test]
async fn no_url_is_fetched_twice_whatever_its_spelling() {
    let mut builder = site();
    for i in 0..10 {
        // Every page links to every page, spelled in several equivalent ways.
        let links: String = (0..10)
            .map(|j| format!(r##"<a href="/p{j}"><a href="./p{j}#x"><a href="/a/../p{j}"><a href="HTTP://127.0.0.1:PORT/p{j}">"##))
            .collect();
        builder = builder.html(&format!("/p{i}"), links);
    }
    let server = builder.serve().await;
    // The absolute spelling needs the port, known only now.
    for i in 0..10 {
        let links: String = (0..10)
            .map(|j| {
                format!(r##"<a href="/p{j}"><a href="./p{j}#x"><a href="/a/../p{j}"><a href="HTTP://{}/p{j}">"##, server.addr)
            })
            .collect();
        server.add(&format!("/p{i}"), Route::html(links));
    }

    let (summary, output) = crawl(
        &[server.url("/p0"), server.url("/p0#again")],
        &["--depth", "5", "--politeness", "off"],
    )
    .await;

    let hits = server.site.accounting.all_hits();
    assert_eq!(hits.len(), 10, "all pages fetched: {hits:?}");
    assert!(
        hits.values().all(|&n| n == 1),
        "each page fetched once: {hits:?}"
    );
    assert_eq!(summary.pages, 10);
    assert_eq!(
        sorted_edges(&output).len(),
        100,
        "one edge per distinct (page, link)"
    );
}

#[tokio::test]
async fn robots_txt_disallow_is_honoured_when_polite() {
    let server = site()
        .route(
            "/robots.txt",
            Route::with_type(
                200,
                "text/plain",
                b"User-agent: *\nDisallow: /private\n".to_vec(),
            ),
        )
        .html(
            "/",
            r#"<a href="/private/secret">s</a><a href="/public">p</a>"#,
        )
        .html("/public", "hello")
        .html("/private/secret", "secret")
        .serve()
        .await;

    let (summary, output) =
        crawl(&[server.url("/")], &["--depth", "1", "--min-delay", "1ms"]).await;
    assert_eq!(server.hits("/robots.txt"), 1);
    assert_eq!(server.hits("/public"), 1);
    assert_eq!(server.hits("/private/secret"), 0);
    assert_eq!(summary.robots_disallowed, 1);
    assert!(
        output.contains("/private/secret"),
        "a disallowed link is still an edge"
    );

    crawl(&[server.url("/")], &["--depth", "1", "--politeness", "off"]).await;
    assert_eq!(
        server.hits("/private/secret"),
        1,
        "robots.txt is not read when politeness is off"
    );
    assert_eq!(server.hits("/robots.txt"), 1);
}

#[tokio::test]
async fn per_host_concurrency_is_never_exceeded() {
    let links: String = (0..30)
        .map(|i| format!(r#"<a href="/slow/{i}">"#))
        .collect();
    let mut builder = site().html("/", links).hold("/slow/", 3);
    for i in 0..30 {
        builder = builder.html(&format!("/slow/{i}"), "leaf");
    }
    let server = builder.serve().await;

    let flags = [
        "--depth",
        "1",
        "--politeness",
        "off",
        "--per-host",
        "3",
        "--concurrency",
        "50",
    ];
    let (summary, _) = crawl(&[server.url("/")], &flags).await;

    assert_eq!(summary.pages, 31);
    assert_eq!(
        server.site.accounting.max_in_flight(),
        3,
        "the limit is reached and never exceeded"
    );
}

#[tokio::test]
async fn global_concurrency_is_never_exceeded_across_hosts() {
    let shared = Arc::new(Accounting::default());
    let mut servers = Vec::new();
    for _ in 0..3 {
        let mut builder = site().accounting(shared.clone()).hold("/slow/", 4);
        for i in 0..8 {
            builder = builder.html(&format!("/slow/{i}"), "leaf");
        }
        servers.push(builder.serve().await);
    }
    let seeds: Vec<Url> = servers
        .iter()
        .flat_map(|s| (0..8).map(|i| s.url(&format!("/slow/{i}"))))
        .collect();

    let (summary, _) = crawl(&seeds, &["--per-host", "3", "--concurrency", "4"]).await;

    assert_eq!(summary.pages, 24);
    assert_eq!(shared.max_in_flight(), 4);
}

#[tokio::test]
async fn output_is_the_same_whatever_the_timing() {
    fn page_links(i: usize) -> String {
        (1..=4)
            .map(|k| format!(r#"<a href="/n{}">"#, (i * 7 + k * 3) % 40))
            .collect()
    }
    fn fast_then_slow(path: &str) -> Duration {
        Duration::from_millis(path.len() as u64 % 7)
    }
    fn slow_then_fast(path: &str) -> Duration {
        Duration::from_millis(6 - path.len() as u64 % 7)
    }
    async fn run(latency: fn(&str) -> Duration, concurrency: &str) -> Vec<String> {
        let mut builder = site().latency(latency);
        for i in 0..40 {
            builder = builder.html(&format!("/n{i}"), page_links(i));
        }
        let server = builder.serve().await;
        let flags = [
            "--depth",
            "10",
            "--politeness",
            "off",
            "--concurrency",
            concurrency,
        ];
        let (_, output) = crawl(&[server.url("/n0")], &flags).await;
        // Each run has its own port; compare paths only.
        sorted_edges(&output.replace(&server.base(), "http://site"))
    }

    let serial = run(fast_then_slow, "1").await;
    let parallel = run(slow_then_fast, "16").await;
    assert!(!serial.is_empty());
    assert_eq!(serial, parallel);
}

#[tokio::test]
async fn a_503_with_retry_after_is_retried_and_then_succeeds() {
    let mut flaky = Route::status(503).header("retry-after", "0");
    flaky.then = Some((1, Box::new(Route::html(r#"<a href="/after">"#))));
    let server = site().route("/flaky", flaky).serve().await;

    let (summary, output) = crawl(&[server.url("/flaky")], &["--retry-base", "1ms"]).await;

    assert_eq!(server.hits("/flaky"), 2);
    assert_eq!(summary.retries, 1);
    assert_eq!(summary.error_count(), 0);
    assert_eq!(sorted_edges(&output).len(), 1);
}

#[tokio::test]
async fn retries_give_up_after_the_limit() {
    let server = site().route("/busy", Route::status(429)).serve().await;

    let (summary, _) = crawl(
        &[server.url("/busy")],
        &["--retry-base", "1ms", "--retries", "2"],
    )
    .await;

    assert_eq!(server.hits("/busy"), 3);
    assert_eq!(summary.errors, BTreeMap::from([(ErrorKind::Http(429), 1)]));
}

#[tokio::test]
async fn timeouts_and_oversized_bodies_fail_per_url() {
    let server = site()
        .route("/hang", Route::hanging())
        .html("/big", "x".repeat(5000))
        .html("/small", r#"<a href="/x">"#)
        .serve()
        .await;
    let seeds = [
        server.url("/hang"),
        server.url("/big"),
        server.url("/small"),
    ];

    let (summary, _) = crawl(&seeds, &["--timeout", "300ms", "--max-body", "4096"]).await;

    assert_eq!(summary.pages, 1);
    assert_eq!(
        summary.errors,
        BTreeMap::from([(ErrorKind::Timeout, 1), (ErrorKind::BodyTooLarge, 1)])
    );
}

#[tokio::test]
async fn jsonl_and_dot_formats_describe_the_same_edges() {
    let server = site()
        .route("/start", Route::redirect("/home"))
        .html("/home", r#"<a href="/a">"#)
        .serve()
        .await;

    let (_, jsonl) = crawl(&[server.url("/start")], &["--format", "jsonl"]).await;
    let records: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is a JSON object"))
        .collect();
    assert_eq!(
        records,
        [serde_json::json!({
            "source_url": server.url("/start").as_str(),
            "parsed_url": server.url("/a").as_str(),
            "final_url": server.url("/home").as_str(),
            "status": 200,
            "depth": 0,
            "content_type": "text/html; charset=utf-8",
        })]
    );

    let (_, dot) = crawl(&[server.url("/start")], &["--format", "dot"]).await;
    assert_eq!(
        dot,
        format!(
            "digraph links {{\n  \"{}\" -> \"{}\";\n}}\n",
            server.url("/start"),
            server.url("/a")
        )
    );
}

#[tokio::test]
async fn gzip_bodies_are_decompressed_and_the_client_says_who_it_is() {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(br#"<a href="/inside-gzip">"#)
        .expect("compressing into a Vec cannot fail");
    let compressed = encoder
        .finish()
        .expect("compressing into a Vec cannot fail");
    let page = Route::with_type(200, "text/html", compressed).header("content-encoding", "gzip");
    let server = site().route("/", page).serve().await;

    let (_, output) = crawl(&[server.url("/")], &[]).await;

    assert_eq!(
        sorted_edges(&output),
        edges(&[(
            server.url("/").to_string(),
            server.url("/inside-gzip").to_string()
        )])
    );
    let accounting = &server.site.accounting;
    let accepted = accounting
        .last_header("accept-encoding")
        .unwrap_or_default();
    assert!(
        accepted.contains("gzip") && accepted.contains("br"),
        "accept-encoding: {accepted}"
    );
    let agent = accounting.last_header("user-agent").unwrap_or_default();
    assert!(agent.starts_with("areq/"), "user-agent: {agent}");
}

#[tokio::test]
async fn a_robots_txt_server_error_keeps_the_crawler_off_the_site() {
    let server = site()
        .route("/robots.txt", Route::status(500))
        .html("/", r#"<a href="/page">"#)
        .html("/page", "hello")
        .serve()
        .await;

    let (summary, output) =
        crawl(&[server.url("/")], &["--depth", "1", "--min-delay", "1ms"]).await;

    assert_eq!(server.hits("/"), 0);
    assert_eq!(server.hits("/page"), 0);
    assert_eq!(
        summary.robots_disallowed, 1,
        "the seed itself is disallowed"
    );
    assert!(sorted_edges(&output).is_empty());
}

#[tokio::test]
async fn a_seed_redirected_to_another_host_is_crawled_there() {
    let target = site()
        .html("/home", r#"<a href="/next">"#)
        .html("/next", "end")
        .serve()
        .await;
    let entry = site()
        .route("/", Route::redirect(target.url("/home").as_str()))
        .serve()
        .await;

    crawl(&[entry.url("/")], &["--depth", "2", "--politeness", "off"]).await;

    assert_eq!(target.hits("/home"), 1);
    assert_eq!(
        target.hits("/next"),
        1,
        "the redirect target's host is in scope"
    );
}

#[tokio::test]
async fn edges_are_written_while_the_crawl_is_still_running() {
    let server = site()
        .html("/", r#"<a href="/hang">"#)
        .route("/hang", Route::hanging())
        .serve()
        .await;
    let output = common::SharedBuffer::default();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let config = common::config(&["--depth", "1", "--politeness", "off"]);
    let crawl = tokio::spawn({
        let (output, shutdown, seed) = (output.clone(), shutdown.clone(), server.url("/"));
        async move {
            areq::crawl(
                &config,
                vec![seed],
                Box::new(output),
                &areq::Console::default(),
                shutdown,
            )
            .await
        }
    });

    // The crawl cannot finish (/hang never answers), yet the edge is there.
    output
        .wait_for(&format!("\t{}\n", server.url("/hang")))
        .await;
    assert!(!crawl.is_finished());

    shutdown.cancel();
    let summary = crawl
        .await
        .expect("the crawl task does not panic")
        .expect("the crawl succeeds");
    assert!(summary.interrupted);
    assert_eq!(summary.pages, 1);
}

#[tokio::test]
async fn a_redirect_leaving_the_scope_is_an_edge_but_is_not_followed() {
    let other = site()
        .html("/landing", r#"<a href="/beyond">"#)
        .serve()
        .await;
    let home = site()
        .html("/", r#"<a href="/moved">m</a><a href="/inside">i</a>"#)
        .route("/moved", Route::redirect(other.url("/landing").as_str()))
        .route("/inside", Route::redirect("/local#top"))
        .html("/local", r#"<a href="/leaf">"#)
        .serve()
        .await;
    let flags = ["--depth", "2", "--politeness", "off", "--format", "jsonl"];

    let (summary, jsonl) = crawl(&[home.url("/")], &flags).await;

    assert_eq!(other.hits("/landing"), 0, "the redirect is not followed");
    assert_eq!(home.hits("/local"), 1, "a redirect within the scope is");
    assert_eq!(summary.redirects_not_followed, 1);
    let records: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is a JSON object"))
        .collect();
    let redirect_edge = serde_json::json!({
        "source_url": home.url("/moved").as_str(),
        "parsed_url": other.url("/landing").as_str(),
        "status": 302,
        "depth": 1,
        "content_type": null,
    });
    assert!(records.contains(&redirect_edge), "{jsonl}");
    let inside_edge = serde_json::json!({
        "source_url": home.url("/inside").as_str(),
        "parsed_url": home.url("/leaf").as_str(),
        "final_url": home.url("/local").as_str(),
        "status": 200,
        "depth": 1,
        "content_type": "text/html; charset=utf-8",
    });
    assert!(records.contains(&inside_edge), "{jsonl}");

    let anywhere = [
        "--depth",
        "2",
        "--politeness",
        "off",
        "--follow-redirects-anywhere",
    ];
    let (summary, output) = crawl(&[home.url("/")], &anywhere).await;
    assert_eq!(other.hits("/landing"), 1);
    assert_eq!(
        other.hits("/beyond"),
        0,
        "links of the target are still scoped"
    );
    assert_eq!(summary.redirects_not_followed, 0);
    assert!(output.contains(&format!("{}\t{}", home.url("/moved"), other.url("/beyond"))));
}

#[tokio::test]
async fn the_broken_link_report_groups_failures_by_reason_with_their_referrers() {
    let (port, _held_closed) = closed_port();
    let refused = format!("http://127.0.0.1:{port}/");
    let server = site()
        .route(
            "/robots.txt",
            Route::with_type(200, "text/plain", b"User-agent: *\nDisallow: /private\n".to_vec()),
        )
        .html(
            "/",
            format!(r#"<a href="/a">a</a><a href="/missing">m</a><a href="/private/x">p</a><a href="{refused}">r</a><a href="/slow">s</a>"#),
        )
        .html("/a", r#"<a href="/missing">m</a><a href="/">home</a>"#)
        .route("/slow", Route::hanging())
        .serve()
        .await;
    let flags = [
        "--depth",
        "1",
        "--min-delay",
        "1ms",
        "--scope",
        "any",
        "--timeout",
        "300ms",
        "--report",
        "unused-report.txt",
    ];

    let (summary, _) = crawl(&[server.url("/"), server.url("/gone")], &flags).await;

    let broken = summary
        .broken
        .as_ref()
        .expect("--report keeps the broken links");
    let listed: Vec<(String, String, Vec<String>)> = broken
        .by_reason()
        .iter()
        .flat_map(|(reason, urls)| {
            urls.iter().map(|(url, b)| {
                let referrers = b.referrers.iter().map(|r| r.to_string()).collect();
                (reason.clone(), url.clone(), referrers)
            })
        })
        .collect();
    let at = |path: &str| server.url(path).to_string();
    let home = at("/");
    assert_eq!(
        listed,
        [
            ("connect".into(), refused.clone(), vec![home.clone()]),
            (
                "disallowed by robots.txt".into(),
                at("/private/x"),
                vec![home.clone()]
            ),
            ("http 404".into(), at("/gone"), vec![]),
            (
                "http 404".into(),
                at("/missing"),
                vec![home.clone(), at("/a")]
            ),
            ("timeout".into(), at("/slow"), vec![home]),
        ]
    );
    assert_eq!(summary.broken_count(), 5);
}

#[tokio::test]
async fn the_timeout_covers_a_whole_redirect_chain() {
    fn hop_latency(path: &str) -> Duration {
        if path.starts_with("/hop") {
            Duration::from_millis(200)
        } else {
            Duration::ZERO
        }
    }
    let server = site()
        .latency(hop_latency)
        .route("/hop1", Route::redirect("/hop2"))
        .route("/hop2", Route::redirect("/hop3"))
        .route("/hop3", Route::redirect("/end"))
        .html("/end", r#"<a href="/x">"#)
        .serve()
        .await;

    // Each hop answers well within the timeout; the three together do not.
    let (summary, _) = crawl(&[server.url("/hop1")], &["--timeout", "500ms"]).await;

    assert_eq!(summary.errors, BTreeMap::from([(ErrorKind::Timeout, 1)]));
    assert_eq!(server.hits("/end"), 0);
}
