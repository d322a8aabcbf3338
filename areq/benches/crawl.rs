//! Crawl benchmark: serves a generated site from an in-process server on
//! 127.0.0.1:0 and crawls it with politeness off, in two modes:
//!
//! - `recursive`: all of a site of `--pages` pages from one seed, following
//!   links (`--concurrency` connections);
//! - `list`: a non-recursive list of `--list-pages` URLs of the same kind of
//!   pages (`--list-concurrency` connections), as areq.py does.
//!
//! `cargo bench -p areq --bench crawl [-- --mode both|recursive|list --pages N --list-pages N --links N --page-kb N]`
//!
//! Prints one JSON line per mode: mode, pages, edges, seconds, pages_per_s,
//! peak_rss_mb (VmHWM of this process, server included, reset before each
//! mode).

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

/// The same allocator as the `areq` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Global concurrency of the recursive crawl (also its per-host limit: one host)
    #[arg(long, default_value_t = 64)]
    concurrency: u32,
    /// Which modes to run
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    mode: Mode,
    /// URLs in the list of the non-recursive mode
    #[arg(long, default_value_t = 5_000)]
    list_pages: usize,
    /// Connections of the non-recursive mode
    #[arg(long, default_value_t = 100)]
    list_concurrency: u32,
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    Both,
    Recursive,
    List,
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
    mode: &'static str,
    pages: u64,
    edges: u64,
    seconds: f64,
    pages_per_s: f64,
    /// CPU time of the whole process (crawler and server) per page: less
    /// sensitive than pages/s to other work on the machine.
    cpu_ms_per_page: f64,
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

/// User plus system CPU time of this process so far, from /proc/self/stat
/// (in clock ticks of 10 ms, the Linux default).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |index: usize| fields.get(index).and_then(|f| f.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of the line: 11 and 12 counted from 0 after ')'.
    ticks(11)
        .zip(ticks(12))
        .map_or(0.0, |(user, system)| (user + system) / 100.0)
}

/// Resets VmHWM to the current RSS (Linux 4.0+), so that each mode reports
/// its own peak; on failure the peak covers the earlier modes too.
fn reset_peak_rss() {
    if std::fs::write("/proc/self/clear_refs", "5").is_err() {
        eprintln!("warning: cannot reset the peak RSS; later modes include earlier peaks");
    }
}

/// One measured crawl of `seeds` against the in-process site.
async fn measure(
    mode: &'static str,
    flags: &[&str],
    seeds: Vec<url::Url>,
    expected_pages: usize,
) -> anyhow::Result<Report> {
    let mut args = vec!["areq", "-", "--politeness", "off", "--progress", "never"];
    args.extend_from_slice(flags);
    let config = Config::parse_from(args);
    reset_peak_rss();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let summary = areq::crawl(
        &config,
        seeds,
        Box::new(io::sink()),
        &Console::default(),
        CancellationToken::new(),
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    if summary.pages as usize != expected_pages || summary.error_count() > 0 {
        eprintln!("warning: incomplete {mode} crawl: {summary}");
    }
    Ok(Report {
        mode,
        pages: summary.pages,
        edges: summary.edges,
        seconds: (seconds * 1000.0).round() / 1000.0,
        pages_per_s: (summary.pages as f64 / seconds).round(),
        cpu_ms_per_page: (cpu * 1000.0 / summary.pages.max(1) as f64 * 1000.0).round() / 1000.0,
        peak_rss_mb: (peak_rss_mb() * 10.0).round() / 10.0,
    })
}

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        // The list mode's URLs are pages of the same site, which is made
        // large enough for both.
        let site_pages = options.pages.max(options.list_pages);
        let site = std::sync::Arc::new(Site::new(site_pages, options.links, options.page_kb));
        eprintln!(
            "site: {site_pages} pages, {} links each, page 0 is {} bytes",
            options.links,
            site.page(0).len()
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/p/{index}", get(serve_page))
            .with_state(site);
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let page_url = |index: usize| url::Url::parse(&format!("http://{addr}/p/{index}"));

        let mut reports = Vec::new();
        if options.mode != Mode::Recursive {
            let concurrency = options.list_concurrency.to_string();
            let seeds = (0..options.list_pages)
                .map(page_url)
                .collect::<Result<Vec<_>, _>>()?;
            let flags = ["--concurrency", &concurrency, "--per-host", &concurrency];
            reports.push(measure("list", &flags, seeds, options.list_pages).await?);
        }
        if options.mode != Mode::List {
            let concurrency = options.concurrency.to_string();
            let flags = [
                "--depth",
                "1000000",
                "--concurrency",
                &concurrency,
                "--per-host",
                &concurrency,
            ];
            let seeds = vec![page_url(0)?];
            reports.push(measure("recursive", &flags, seeds, site_pages).await?);
        }
        server.abort();
        for report in reports {
            println!("{}", serde_json::to_string(&report)?);
        }
        Ok(())
    })
}
