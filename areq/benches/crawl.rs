//! Crawl benchmark: serves a generated site from an in-process server on
//! 127.0.0.1:0 and crawls all of it recursively with politeness off.
//!
//! `cargo bench -p areq --bench crawl [-- --pages N --links N --page-kb N --concurrency N]`
//!
//! Prints one JSON line: pages, edges, seconds, pages_per_s, peak_rss_mb
//! (VmHWM of this process, server included).

use std::io;
use std::time::Instant;

use areq::{Config, Console};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use bytes::Bytes;
use clap::Parser;
use tokio_util::sync::CancellationToken;

/// The benchmark's own flags; `--bench`, added by `cargo bench`, is accepted and ignored.
#[derive(Debug, Clone, Parser)]
struct Options {
    /// Pages in the generated site
    #[arg(long, default_value_t = 20_000)]
    pages: usize,
    /// Links per page
    #[arg(long, default_value_t = 50)]
    links: usize,
    /// Approximate page size in KB
    #[arg(long, default_value_t = 30)]
    page_kb: usize,
    /// Global concurrency of the crawler (also its per-host limit: one host)
    #[arg(long, default_value_t = 64)]
    concurrency: u32,
    #[arg(long, hide = true)]
    bench: bool,
}

/// The generated site: page `i` links to its tree children first (so every
/// page is reachable in a few hops), then to pseudo-random pages (so most
/// links are duplicates the crawler must drop), and carries filler markup
/// shaped like real pages (nested tags, classes, entities).
struct Site {
    pages: usize,
    links: usize,
    filler: Bytes,
}

const TREE_FANOUT: usize = 10;

impl Site {
    fn new(pages: usize, links: usize, page_kb: usize) -> Self {
        let row = "<div class=\"row\"><span class=\"label\">Item</span> <p>Lorem ipsum dolor sit amet, \
                   consectetur &amp; adipiscing elit, sed do <em>eiusmod</em> tempor incididunt ut labore \
                   et dolore magna aliqua.</p><img src=\"/img/x.png\" alt=\"\"></div>\n";
        let link_bytes = links * 48;
        let target = (page_kb * 1000).saturating_sub(link_bytes);
        let filler = row.repeat(target / row.len() + 1);
        Self {
            pages,
            links,
            filler: Bytes::from(filler),
        }
    }

    fn page(&self, index: usize) -> Vec<u8> {
        let mut html = Vec::with_capacity(self.filler.len() + self.links * 64);
        html.extend_from_slice(b"<!doctype html><html><head><meta charset=\"utf-8\"><title>page</title></head><body><ul>\n");
        let children = (1..=TREE_FANOUT).map(|k| index * TREE_FANOUT + k);
        let mut state = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let random = std::iter::from_fn(|| {
            // xorshift: cheap, deterministic per page.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            Some(state as usize)
        });
        let targets = children
            .chain(random)
            .map(|n| n % self.pages)
            .take(self.links);
        for target in targets {
            html.extend_from_slice(
                format!("<li><a href=\"/p/{target}\">page {target}</a></li>\n").as_bytes(),
            );
        }
        html.extend_from_slice(b"</ul>\n");
        html.extend_from_slice(&self.filler);
        html.extend_from_slice(b"</body></html>\n");
        html
    }
}

async fn serve_page(
    State(site): State<std::sync::Arc<Site>>,
    Path(index): Path<usize>,
) -> impl IntoResponse {
    if index >= site.pages {
        return (
            axum::http::StatusCode::NOT_FOUND,
            [(CONTENT_TYPE, "text/plain")],
            Vec::new(),
        );
    }
    (
        axum::http::StatusCode::OK,
        [(CONTENT_TYPE, "text/html; charset=utf-8")],
        site.page(index),
    )
}

/// The JSON line, fields in this order.
#[derive(serde::Serialize)]
struct Report {
    pages: u64,
    edges: u64,
    seconds: f64,
    pages_per_s: f64,
    peak_rss_mb: f64,
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let site = std::sync::Arc::new(Site::new(options.pages, options.links, options.page_kb));
        eprintln!(
            "site: {} pages, {} links each, page 0 is {} bytes",
            options.pages,
            options.links,
            site.page(0).len()
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/p/{index}", get(serve_page))
            .with_state(site);
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let concurrency = options.concurrency.to_string();
        let config = Config::parse_from([
            "areq",
            "-",
            "--depth",
            "1000000",
            "--politeness",
            "off",
            "--concurrency",
            &concurrency,
            "--per-host",
            &concurrency,
            "--progress",
            "never",
        ]);
        let seed = url::Url::parse(&format!("http://{addr}/p/0"))?;
        let started = Instant::now();
        let summary = areq::crawl(
            &config,
            vec![seed],
            Box::new(io::sink()),
            &Console::default(),
            CancellationToken::new(),
        )
        .await?;
        let seconds = started.elapsed().as_secs_f64();
        server.abort();

        if summary.pages as usize != options.pages || summary.error_count() > 0 {
            eprintln!("warning: incomplete crawl: {summary}");
        }
        let report = Report {
            pages: summary.pages,
            edges: summary.edges,
            seconds: (seconds * 1000.0).round() / 1000.0,
            pages_per_s: (summary.pages as f64 / seconds).round(),
            peak_rss_mb: (peak_rss_mb() * 10.0).round() / 10.0,
        };
        let report = serde_json::to_string(&report)?;
        println!("{report}");
        Ok(())
    })
}
