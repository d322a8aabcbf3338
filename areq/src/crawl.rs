//! The crawl loop: takes ready jobs from the [`Frontier`], runs each fetch
//! as a task in one `JoinSet`, and turns results into output records, new
//! jobs, retries and counters. It is the only owner of the frontier and the
//! summary, so neither needs a lock.
//!
//! Just over 400 lines: the loop and the bookkeeping of its results read
//! best together; the fetch and robots.txt tasks it spawns are in
//! `crawl/task.rs`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use url::Url;

use crate::broken::BrokenLinks;
use crate::config::Config;
use crate::extract::ExtractOptions;
use crate::fetch::{FetchSettings, Fetcher};
use crate::frontier::{Dispatch, Frontier, FrontierSettings, Job};
use crate::output::{Output, PageRecord, Persist, Step};
use crate::report::{Console, ErrorKind, LOG_INTERVAL, Progress, Summary};
use crate::robots::RobotsRules;
use crate::scope::{ScopeFilter, normalize};
use crate::state::{Change, Resumed, State};

mod task;

use task::{Outcome, PageError, fetch_page, fetch_robots};

/// State changes to commit with the next output step; collects nothing
/// without `--state`, so a plain crawl does not pay for it.
#[derive(Debug)]
struct Journal {
    enabled: bool,
    changes: Vec<Change>,
}

impl Journal {
    fn record(&mut self, change: impl FnOnce() -> Change) {
        if self.enabled {
            self.changes.push(change());
        }
    }

    /// Sends the changes, with a page's edges if any, to the writer.
    async fn send(
        &mut self,
        output: &Output,
        record: Option<PageRecord>,
    ) -> Result<(), crate::output::OutputClosed> {
        if record.is_none() && self.changes.is_empty() {
            return Ok(());
        }
        let changes = std::mem::take(&mut self.changes);
        output.send_step(Step { record, changes }).await
    }
}

/// What each running task is doing, so that a panicking task still
/// releases its host.
#[derive(Debug)]
enum Running {
    Page(Url),
    Robots(String),
}

/// Crawls from `seeds`, writing edges to `sink`, until the frontier is
/// empty or `shutdown` is cancelled. Every spawned task is awaited before
/// this returns, and the output is flushed in both cases.
pub async fn crawl(
    config: &Config,
    seeds: Vec<Url>,
    sink: Box<dyn Write + Send>,
    console: &Console,
    shutdown: CancellationToken,
) -> anyhow::Result<Summary> {
    crawl_with(config, seeds, sink, None, console, shutdown).await
}

/// [`crawl`], resuming from and recording to a state when one is given
/// (`sink` is then the output file, already cut to the committed length).
pub(crate) async fn crawl_with(
    config: &Config,
    seeds: Vec<Url>,
    sink: Box<dyn Write + Send>,
    resume: Option<(State, Resumed)>,
    console: &Console,
    shutdown: CancellationToken,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let polite = config.is_polite();
    let per_host = config.per_host as usize;
    let concurrency = config.concurrency as usize;
    let fetcher = Fetcher::new(&FetchSettings {
        user_agent: config.user_agent.clone(),
        timeout: config.timeout,
        connect_timeout: config.connect_timeout,
        max_redirects: config.max_redirects,
        max_body: config.max_body,
        idle_per_host: per_host.min(concurrency),
    })?;
    // Shared with fetch tasks, which check redirect targets against it;
    // the rare change (a seed's redirect target) copies it.
    let mut scope = Arc::new(ScopeFilter::new(
        config.scope,
        &seeds,
        config.include.clone(),
        config.exclude.clone(),
    ));
    let mut frontier = Frontier::new(FrontierSettings {
        per_host,
        min_delay: if polite {
            config.min_delay
        } else {
            Duration::ZERO
        },
        check_robots: polite,
    });
    let mut summary = Summary {
        broken: config.report.is_some().then(BrokenLinks::default),
        ..Summary::default()
    };
    let mut journal = Journal {
        enabled: resume.is_some(),
        changes: Vec::new(),
    };
    let mut persist = None;
    if let Some((state, resumed)) = resume {
        for url in &resumed.done {
            frontier.mark_seen(url);
        }
        for (url, depth) in resumed.queued {
            frontier.enqueue(Job {
                url,
                depth,
                attempt: 0,
            });
        }
        if polite {
            for (host, disallow_all, body) in resumed.robots {
                frontier.preset_robots(&host, robots_rules(disallow_all, body.as_deref()));
            }
        }
        for seed in &resumed.scope_seeds {
            Arc::make_mut(&mut scope).add_seed(seed);
        }
        persist = Some(Persist {
            state,
            output_len: resumed.output_len,
        });
    }
    for url in seeds {
        let url = normalize(url);
        if frontier.enqueue(Job {
            url: url.clone(),
            depth: 0,
            attempt: 0,
        }) {
            if let Some(broken) = &mut summary.broken {
                broken.queued(&url, None);
            }
            journal.record(|| Change::Queued { url, depth: 0 });
        }
    }
    let extract_options = ExtractOptions {
        all_hrefs: config.all_hrefs,
        keep_schemes: config.keep_schemes,
    };
    let output = Output::spawn(config.format, sink, persist);
    let progress = Progress::new(config.progress, console);
    let mut log_tick = tokio::time::interval_at(started + LOG_INTERVAL, LOG_INTERVAL);
    log_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = JoinSet::new();
    let mut running = foldhash::HashMap::default();

    loop {
        let now = Instant::now();
        while tasks.len() < concurrency {
            match frontier.next_ready(now) {
                None => break,
                Some(Dispatch::Fetch(job)) => {
                    let url = job.url.clone();
                    // Seeds follow their redirects anywhere: the target joins the scope.
                    let redirect_scope =
                        (job.depth > 0 && !config.follow_redirects_anywhere).then(|| scope.clone());
                    let page = fetch_page(fetcher.clone(), job, extract_options, redirect_scope);
                    let handle = tasks.spawn(page);
                    running.insert(handle.id(), Running::Page(url));
                }
                Some(Dispatch::FetchRobots { host, url }) => {
                    let handle = tasks.spawn(fetch_robots(fetcher.clone(), host.clone(), url));
                    running.insert(handle.id(), Running::Robots(host));
                }
                Some(Dispatch::Disallowed(job)) => {
                    summary.robots_disallowed += 1;
                    info!("skipping {}: disallowed by robots.txt", job.url);
                    if let Some(broken) = &mut summary.broken {
                        let reason = "disallowed by robots.txt";
                        broken.failed(&job.url, reason.into(), reason.into());
                    }
                    // Committed with the next step, or at the end.
                    journal.record(|| Change::Done(job.url));
                }
            }
        }
        progress.update(&summary, frontier.queued(), tasks.len());
        if tasks.is_empty() && frontier.queued() == 0 {
            break;
        }
        // With every slot taken, only a finishing task can unblock anything.
        let wakeup = (tasks.len() < concurrency)
            .then(|| frontier.next_wakeup(now))
            .flatten();
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                summary.interrupted = true;
                break;
            }
            Some(joined) = tasks.join_next_with_id() => match joined {
                Ok((id, outcome)) => {
                    running.remove(&id);
                    let record = handle(outcome, config, &mut scope, &mut frontier, &mut journal, &mut summary);
                    if journal.send(&output, record).await.is_err() {
                        // The writer stopped on an error; finish() reports it.
                        break;
                    }
                }
                Err(error) => {
                    summary.count_error(ErrorKind::Panic);
                    match running.remove(&error.id()) {
                        Some(Running::Page(url)) => {
                            warn!("fetching {url} failed: task panicked: {error}");
                            frontier.finished(&url);
                            if let Some(broken) = &mut summary.broken {
                                let detail = format!("task panicked: {error}");
                                broken.failed(&url, ErrorKind::Panic.to_string(), detail);
                            }
                            journal.record(|| Change::Done(url));
                        }
                        Some(Running::Robots(host)) => {
                            warn!("fetching robots.txt of {host} failed: task panicked: {error}");
                            frontier.set_robots(&host, RobotsRules::AllowAll);
                        }
                        None => warn!("a crawl task panicked: {error}"),
                    }
                }
            },
            () = tokio::time::sleep_until(wakeup.unwrap_or(now)), if wakeup.is_some() => {}
            _ = log_tick.tick() => progress.log(&summary, frontier.queued(), tasks.len()),
        }
    }

    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    progress.finish();
    // Changes not yet sent (a last disallowed page); if the writer has
    // stopped, finish() reports why.
    let _ = journal.send(&output, None).await;
    output.finish().await.context("writing the output failed")?;
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Applies one task's outcome; returns the edges to write, if any. State
/// changes go to the journal, to be committed with them.
fn handle(
    outcome: Outcome,
    config: &Config,
    scope: &mut Arc<ScopeFilter>,
    frontier: &mut Frontier,
    journal: &mut Journal,
    summary: &mut Summary,
) -> Option<PageRecord> {
    let (job, result) = match outcome {
        Outcome::Robots { host, rules, body } => {
            let disallow_all = matches!(rules, RobotsRules::DisallowAll);
            journal.record(|| Change::Robots {
                host: host.clone(),
                disallow_all,
                body,
            });
            frontier.set_robots(&host, rules);
            return None;
        }
        Outcome::Page { job, result } => (job, result),
    };
    frontier.finished(&job.url);
    match result {
        Ok(fetched) => {
            journal.record(|| Change::Done(job.url.clone()));
            let final_url = normalize(fetched.final_url);
            if final_url != job.url {
                frontier.mark_seen(&final_url);
                journal.record(|| Change::Seen(final_url.clone()));
                if job.depth == 0 {
                    Arc::make_mut(scope).add_seed(&final_url);
                    journal.record(|| Change::ScopeSeed(final_url.clone()));
                }
            }
            if let Some(broken) = &mut summary.broken {
                broken.succeeded(&job.url);
            }
            if let Some(target) = fetched.redirect_to {
                summary.redirects_not_followed += 1;
                summary.edges += 1;
                info!("not following {} to {target}: out of scope", job.url);
                return Some(PageRecord {
                    source: job.url,
                    final_url,
                    status: fetched.status,
                    depth: job.depth,
                    content_type: None,
                    links: vec![normalize(target)],
                });
            }
            summary.pages += 1;
            let Some(links) = fetched.links else {
                summary.not_html += 1;
                return None;
            };
            let referrer: Option<Arc<str>> =
                summary.broken.as_ref().map(|_| job.url.as_str().into());
            for link in &links {
                let queued = job.depth < config.depth
                    && !frontier.has_seen(link)
                    && scope.allows(link)
                    && frontier.enqueue(Job {
                        url: link.clone(),
                        depth: job.depth + 1,
                        attempt: 0,
                    });
                if queued {
                    journal.record(|| Change::Queued {
                        url: link.clone(),
                        depth: job.depth + 1,
                    });
                }
                if let (Some(broken), Some(referrer)) = (&mut summary.broken, &referrer) {
                    if queued {
                        broken.queued(link, Some(referrer));
                    } else {
                        broken.linked(link, referrer);
                    }
                }
            }
            if links.is_empty() {
                return None;
            }
            summary.edges += links.len() as u64;
            return Some(PageRecord {
                source: job.url,
                final_url,
                status: fetched.status,
                depth: job.depth,
                content_type: fetched.content_type,
                links,
            });
        }
        Err(error) => match error.retry_after() {
            Some(retry_after) if job.attempt < config.retries => {
                let backoff = config.retry_base.saturating_mul(1 << job.attempt.min(16));
                let wait = retry_after.map_or(backoff, |asked| asked.max(backoff));
                if wait > config.max_retry_wait {
                    warn!(
                        "fetching {} failed: {error}, and the server asks to wait {wait:?}",
                        job.url
                    );
                    fail(summary, journal, job.url, &error);
                } else {
                    summary.retries += 1;
                    info!("fetching {} failed: {error}, retrying in {wait:?}", job.url);
                    let retry = Job {
                        attempt: job.attempt + 1,
                        ..job
                    };
                    frontier.retry(retry, Instant::now() + wait);
                }
            }
            _ => {
                warn!("fetching {} failed: {error}", job.url);
                fail(summary, journal, job.url, &error);
            }
        },
    }
    None
}

/// Counts a failed URL, lists it in the broken-link report and records it
/// as done: a resumed crawl does not try it again.
fn fail(summary: &mut Summary, journal: &mut Journal, url: Url, error: &PageError) {
    summary.count_error(error.kind());
    if let Some(broken) = &mut summary.broken {
        broken.failed(&url, error.kind().to_string(), error.to_string());
    }
    journal.record(|| Change::Done(url));
}

/// robots.txt rules as a previous run stored them.
fn robots_rules(disallow_all: bool, body: Option<&[u8]>) -> RobotsRules {
    match body {
        Some(body) => RobotsRules::parse(body),
        None if disallow_all => RobotsRules::DisallowAll,
        None => RobotsRules::AllowAll,
    }
}
