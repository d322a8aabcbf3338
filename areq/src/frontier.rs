//! The crawl frontier: what to fetch next, and when.
//!
//! One [`Frontier`] is owned by the crawl loop; nothing here does I/O or
//! reads the clock, every decision takes `now` as an argument. It keeps
//!
//! - the seen-set: a URL is enqueued at most once, after normalisation;
//! - one FIFO queue per host (origin), served round-robin so that one large
//!   site does not starve the others;
//! - per host: requests in flight (capped), the earliest instant the next
//!   request may start (minimum delay, Crawl-delay, Retry-After), and its
//!   robots.txt state (unknown, being fetched, known).

use std::collections::VecDeque;

// foldhash rather than SipHash: the keys are our own normalised URLs, and
// hashing them was a measurable share of the crawl (README, benchmark).
use foldhash::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use url::Url;

use crate::robots::{RobotsRules, robots_url};
use crate::scope::host_key;

/// One URL to fetch.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The normalised URL.
    pub url: Url,
    /// Hops from the seed (seeds are 0).
    pub depth: u32,
    /// How many times it has been tried before (retries of 429/503).
    pub attempt: u32,
}

/// What the crawl loop should do next.
#[derive(Debug, PartialEq)]
pub enum Dispatch {
    /// Fetch this page; report back with [`Frontier::finished`].
    Fetch(Job),
    /// Fetch robots.txt for `host`; report back with [`Frontier::set_robots`].
    FetchRobots {
        /// The host key, as given back to [`Frontier::set_robots`].
        host: String,
        /// The robots.txt URL.
        url: Url,
    },
    /// robots.txt forbids this page; it is not fetched.
    Disallowed(Job),
}

/// The frontier's fixed parameters.
#[derive(Debug, Clone)]
pub struct FrontierSettings {
    /// Maximum requests in flight to one host (robots.txt included).
    pub per_host: usize,
    /// Minimum time between the starts of two requests to one host.
    pub min_delay: Duration,
    /// Whether robots.txt is fetched and honoured (with its Crawl-delay).
    pub check_robots: bool,
}

#[derive(Debug)]
enum RobotsState {
    Unknown,
    Fetching,
    Known(Arc<RobotsRules>),
}

#[derive(Debug)]
struct HostState {
    queue: VecDeque<Job>,
    in_flight: usize,
    /// The next request to this host may not start before this instant.
    not_before: Option<Instant>,
    robots: RobotsState,
    /// The delay between request starts: the larger of `min_delay` and Crawl-delay.
    delay: Duration,
}

/// Per-host queues, the seen-set and the scheduling rules.
#[derive(Debug)]
pub struct Frontier {
    settings: FrontierSettings,
    hosts: HashMap<String, HostState>,
    /// Hosts with a non-empty queue, each exactly once, in round-robin order.
    active: VecDeque<String>,
    seen: HashSet<String>,
    queued: usize,
}

impl Frontier {
    /// An empty frontier.
    pub fn new(settings: FrontierSettings) -> Self {
        Self {
            settings,
            hosts: HashMap::default(),
            active: VecDeque::new(),
            seen: HashSet::default(),
            queued: 0,
        }
    }

    /// Queues a URL unless it was seen before; returns whether it was queued.
    pub fn enqueue(&mut self, job: Job) -> bool {
        if self.has_seen(&job.url) {
            return false;
        }
        self.seen.insert(job.url.as_str().to_owned());
        self.push(job, false);
        true
    }

    /// Whether a URL was already enqueued or marked seen.
    pub fn has_seen(&self, url: &Url) -> bool {
        self.seen.contains(url.as_str())
    }

    /// Records a URL as seen without queueing it (the target of a redirect).
    pub fn mark_seen(&mut self, url: &Url) {
        self.seen.insert(url.as_str().to_owned());
    }

    /// Queues a job again, first in its host's queue, and holds the whole
    /// host until `not_before` (the server asked us to back off).
    pub fn retry(&mut self, job: Job, not_before: Instant) {
        let key = self.push(job, true);
        let host = self
            .hosts
            .get_mut(&key)
            .expect("push just created the host state");
        host.not_before = Some(host.not_before.map_or(not_before, |t| t.max(not_before)));
    }

    fn host_state<'a>(
        hosts: &'a mut HashMap<String, HostState>,
        settings: &FrontierSettings,
        key: &str,
    ) -> &'a mut HostState {
        let check_robots = settings.check_robots;
        let min_delay = settings.min_delay;
        hosts.entry(key.to_owned()).or_insert_with(|| HostState {
            queue: VecDeque::new(),
            in_flight: 0,
            not_before: None,
            robots: if check_robots {
                RobotsState::Unknown
            } else {
                RobotsState::Known(Arc::new(RobotsRules::AllowAll))
            },
            delay: min_delay,
        })
    }

    fn push(&mut self, job: Job, at_front: bool) -> String {
        let key = host_key(&job.url);
        let host = Self::host_state(&mut self.hosts, &self.settings, &key);
        if host.queue.is_empty() {
            self.active.push_back(key.clone());
        }
        if at_front {
            host.queue.push_front(job);
        } else {
            host.queue.push_back(job);
        }
        self.queued += 1;
        key
    }

    /// The next thing to do at `now`, if any host is ready.
    pub fn next_ready(&mut self, now: Instant) -> Option<Dispatch> {
        for _ in 0..self.active.len() {
            let key = self.active.pop_front()?;
            let host = self
                .hosts
                .get_mut(&key)
                .expect("every active host has a state");
            match &host.robots {
                RobotsState::Unknown => {
                    host.robots = RobotsState::Fetching;
                    host.in_flight += 1;
                    let url = robots_url(&host.queue[0].url);
                    self.active.push_back(key.clone());
                    return Some(Dispatch::FetchRobots { host: key, url });
                }
                RobotsState::Fetching => {
                    self.active.push_back(key);
                    continue;
                }
                RobotsState::Known(_) => {}
            }
            let waiting = host.not_before.is_some_and(|t| t > now);
            if host.in_flight >= self.settings.per_host || waiting {
                self.active.push_back(key);
                continue;
            }
            let job = host
                .queue
                .pop_front()
                .expect("an active host has a non-empty queue");
            self.queued -= 1;
            if !host.queue.is_empty() {
                self.active.push_back(key);
            }
            if let RobotsState::Known(rules) = &host.robots
                && !rules.allows(&job.url)
            {
                return Some(Dispatch::Disallowed(job));
            }
            host.in_flight += 1;
            if !host.delay.is_zero() {
                host.not_before = Some(now + host.delay);
            }
            return Some(Dispatch::Fetch(job));
        }
        None
    }

    /// The earliest instant after `now` at which a host held back only by
    /// its delay becomes ready.
    pub fn next_wakeup(&self, now: Instant) -> Option<Instant> {
        self.active
            .iter()
            .filter_map(|key| self.hosts.get(key))
            .filter(|host| {
                matches!(host.robots, RobotsState::Known(_))
                    && host.in_flight < self.settings.per_host
            })
            .filter_map(|host| host.not_before.filter(|t| *t > now))
            .min()
    }

    /// A page fetch for `url`'s host has finished, successfully or not.
    pub fn finished(&mut self, url: &Url) {
        if let Some(host) = self.hosts.get_mut(&host_key(url)) {
            host.in_flight = host.in_flight.saturating_sub(1);
        }
    }

    /// Installs robots.txt rules known from a previous run, so that they
    /// are not fetched again.
    pub fn preset_robots(&mut self, host: &str, rules: RobotsRules) {
        let state = Self::host_state(&mut self.hosts, &self.settings, host);
        if let Some(crawl_delay) = rules.crawl_delay() {
            state.delay = state.delay.max(crawl_delay);
        }
        state.robots = RobotsState::Known(Arc::new(rules));
    }

    /// The robots.txt fetch of `host` has finished with these rules.
    pub fn set_robots(&mut self, host: &str, rules: RobotsRules) {
        if let Some(state) = self.hosts.get_mut(host) {
            state.in_flight = state.in_flight.saturating_sub(1);
            if let Some(crawl_delay) = rules.crawl_delay() {
                state.delay = state.delay.max(crawl_delay);
            }
            state.robots = RobotsState::Known(Arc::new(rules));
        }
    }

    /// Jobs waiting in a queue.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Distinct URLs ever enqueued or marked seen.
    pub fn seen(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests;
