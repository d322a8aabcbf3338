//! The nemesis: many requests through the real binary while faults are
//! injected at random (a schedule drawn from one seed), then the invariants
//! checked from what the hosts saw and what the store kept.
//!
//! Two configurations: two instances sharing one SQLite file (on a small
//! tmpfs that the nemesis fills), and two instances on a private NATS
//! server (stopped with SIGSTOP and resumed, or stopped and started again)
//! and a private PostgreSQL server (stopped with SIGSTOP and resumed, or
//! its connections cut); the machine's shared servers are never touched.
//! In both the nemesis also kills instances with SIGKILL (and starts them
//! again, sometimes only after their leases expired), stops them with
//! SIGTERM, and pauses them with SIGSTOP, some past every lease and hold.
//!
//! Restarts go through the `command` backend to a script (`RESTART_SCRIPT`)
//! that appends a line when it starts and one when it ends, and sleeps a
//! time drawn from the seed: mostly short, sometimes past the lease,
//! sometimes past the command's timeout (it is then killed, and a watcher
//! thread notes when its process is gone). Those intervals are what the
//! hosts saw; the checks (`check`) compare them with the store's requests
//! and restart journal:
//!
//! - no request lost: every published request ends with a final status;
//! - none restarted more than `worker.max_attempts` times, and each run
//!   of the script had its own claim in the journal, made before it;
//! - no request, and no host, restarted twice at once;
//! - the counting limits held at every instant: the rate limit (and the
//!   host cooldown, if set) over the journal's claims, the disruption budget over
//!   the scripts' intervals (hosts of a group running at once);
//! - every dead letter has a reason; every failed request was
//!   dead-lettered with one;
//! - `restarted` only when a run of the script succeeded.
//!
//! A short run is part of the suite. A long one:
//! `MANDRILL_TEST_NEMESIS_SECS=1800 cargo test --release -p mandrill --test
//! nemesis -- --nocapture`, with `MANDRILL_TEST_NEMESIS_SEED=N` to replay a
//! seed. Every run prints its seed and a summary (shown with
//! `--nocapture`, and always on failure, with the command that replays
//! it). The schedule of faults and the workload are the seed's; the timing
//! of real processes is not, so a replay is the same storm, not the same
//! interleaving.

mod services;
mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use services::PrivateNats;
use services::nats_names::StreamNames;
use services::private_postgres::PrivatePostgres;
use sqlx::Connection as _;
use support::tmpfs::Tmpfs;
use support::{DEADLINE, Mandrill};

/// The settings the checks depend on, written into the configuration.
///
/// A run of the script lasts at most the command's timeout plus 300 ms
/// (longer only if its instance is killed mid-run: nothing then kills it).
/// The claim's hold (`restart_timeout` 4 s + 2 ack deadlines = 6 s) and
/// the budget's `forget_after` (8 s) each leave room above that for a slow
/// machine, so that an orphaned run ends before the request, or its host,
/// can be claimed again: what is tested is mandrill, not an orphan
/// outliving the bounds the operator set. No host cooldown: the claim's
/// hold alone keeps two requests' restarts of one host apart (the `host
/// busy` guard), and the check that no host runs twice at once tests it.
const MAX_ATTEMPTS: usize = 3;
const GROUP_MAX: usize = 6;
const RATE_WINDOW_MS: i64 = 3_000;
const HOST_COOLDOWN_MS: i64 = 0;
const MAX_DISRUPTED: usize = 3;
const ACK_DEADLINE_MS: u64 = 1_000;
const COMMAND_TIMEOUT_MS: u64 = 2_000;
const GROUPS: usize = 3;
/// Hosts per group at least; more in long runs, so that about ten requests
/// fall to each host.
const MIN_HOSTS_PER_GROUP: usize = 12;

/// The restart each host gets: a line when it starts and one when it ends
/// (one `write(2)` each, appended), a sleep and an exit code drawn from the
/// seed, the request and how many runs of it began before. 80% of runs are
/// short; 15% outlast the lease (the worker must extend it); 5% outlast
/// the command's timeout and are killed. 3% fail (worth retrying), 1% fail
/// for good (exit 3, `permanent_exit_codes`).
const RESTART_SCRIPT: &str = r#"#!/bin/bash
id=$1 host=$2 group=$3
log=$NEMESIS_LOG
before=$(grep -c "^start [0-9]* [0-9]* $id " "$log")
now=${EPOCHREALTIME/[.,]/}
echo "start $now $$ $id $host $group" >> "$log"
draw=$(printf '%s %s %s' "$NEMESIS_SEED" "$id" "$before" | cksum)
draw=${draw%% *}
kind=$(( draw % 100 ))
if (( kind < 80 )); then ms=$(( 5 + draw / 100 % 50 ))
elif (( kind < 95 )); then ms=$(( NEMESIS_PAST_LEASE_MS + draw / 100 % 500 ))
else ms=$NEMESIS_PAST_TIMEOUT_MS
fi
sleep "$(( ms / 1000 )).$(printf '%03d' $(( ms % 1000 )))"
outcome=$(( draw / 100000 % 100 ))
if (( outcome < 3 )); then code=1
elif (( outcome < 4 )); then code=3
else code=0
fi
now=${EPOCHREALTIME/[.,]/}
echo "end $now $$ $id $host $group $code" >> "$log"
exit $code
"#;

/// A calendar open at all times (the real backends' default is office hours).
const ALWAYS_OPEN: &str = "[safety.calendar]\n\
    weekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
    hours = [\"00:00-24:00\"]\n";

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_micros() as i64
}

/// The run's length and seed: `MANDRILL_TEST_NEMESIS_SECS` (default 40)
/// and `MANDRILL_TEST_NEMESIS_SEED` (default: drawn now). Test-only
/// variables, so not configuration (`MANDRILL_TEST_*`).
fn length_and_seed() -> (Duration, u64) {
    let secs = std::env::var("MANDRILL_TEST_NEMESIS_SECS")
        .ok()
        .map(|s| s.parse().expect("MANDRILL_TEST_NEMESIS_SECS is a number"))
        .unwrap_or(40);
    let seed = std::env::var("MANDRILL_TEST_NEMESIS_SEED")
        .ok()
        .map(|s| s.parse().expect("MANDRILL_TEST_NEMESIS_SEED is a number"))
        .unwrap_or_else(|| rand::rng().random());
    (Duration::from_secs(secs), seed)
}

/// Prints how to replay the seed if the test fails, whatever fails.
struct ReplayOnFailure {
    test: &'static str,
    seed: u64,
    secs: u64,
}

impl ReplayOnFailure {
    fn command(&self) -> String {
        format!(
            "MANDRILL_TEST_NEMESIS_SEED={} MANDRILL_TEST_NEMESIS_SECS={} cargo test --release \
             -p mandrill --test nemesis {} -- --nocapture",
            self.seed, self.secs, self.test
        )
    }
}

impl Drop for ReplayOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "nemesis FAILED with seed {}; replay: {}",
                self.seed,
                self.command()
            );
        }
    }
}

// ---------------------------------------------------------------------
// What the hosts saw: the script's log, and a watcher for killed runs.

/// One run of the restart script.
#[derive(Debug, Clone)]
struct Run {
    message_id: String,
    host: String,
    group: String,
    pid: u32,
    /// Microseconds since the epoch.
    start: i64,
    /// When it ended: its own line, else when the watcher saw it gone.
    end: Option<i64>,
    /// Its exit code, when it ended by itself.
    code: Option<i32>,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} (pid {}) {}..{}",
            self.host,
            self.message_id,
            self.pid,
            self.start,
            self.end.map_or("?".to_owned(), |end| end.to_string())
        )?;
        match self.code {
            Some(code) => write!(f, " exit {code}"),
            None => write!(f, " killed"),
        }
    }
}

/// Follows the script's log and notes when a run whose process is gone
/// wrote no end line (killed at its timeout).
struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Run>>>,
}

/// Whether the process `pid` has ended (gone, or a zombie).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

impl Watcher {
    fn start(log: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut file = std::fs::File::open(&log).expect("the script's log exists");
                let mut pending = String::new();
                let mut runs: Vec<Run> = Vec::new();
                // Runs with neither an end line nor a death seen, by pid.
                let mut open: HashMap<u32, usize> = HashMap::new();
                // The latest run of each pid, for an end line read after
                // the watcher saw the process gone.
                let mut latest: HashMap<u32, usize> = HashMap::new();
                let mut stopping: Option<Instant> = None;
                loop {
                    // Read the stop flag first: a run is closed by a read
                    // after it was set.
                    if stop.load(Ordering::SeqCst) {
                        stopping.get_or_insert_with(Instant::now);
                    }
                    let mut chunk = String::new();
                    file.read_to_string(&mut chunk).expect("the log reads");
                    pending.push_str(&chunk);
                    while let Some(newline) = pending.find('\n') {
                        let line: String = pending.drain(..=newline).collect();
                        let fields: Vec<&str> = line.split_whitespace().collect();
                        match fields.as_slice() {
                            ["start", at, pid, id, host, group] => {
                                let pid: u32 = pid.parse().expect("pid");
                                runs.push(Run {
                                    message_id: (*id).to_owned(),
                                    host: (*host).to_owned(),
                                    group: (*group).to_owned(),
                                    pid,
                                    start: at.parse().expect("start time"),
                                    end: None,
                                    code: None,
                                });
                                open.insert(pid, runs.len() - 1);
                                latest.insert(pid, runs.len() - 1);
                            }
                            ["end", at, pid, id, _, _, code] => {
                                let pid: u32 = pid.parse().expect("pid");
                                let index = latest[&pid];
                                let run = &mut runs[index];
                                assert_eq!(run.message_id, *id, "an end line matches its start");
                                run.end = Some(at.parse().expect("end time"));
                                run.code = Some(code.parse().expect("exit code"));
                                open.remove(&pid);
                            }
                            _ => panic!("unexpected line in the script's log: {line:?}"),
                        }
                    }
                    let now = now_micros();
                    open.retain(|pid, index| {
                        if process_gone(*pid) {
                            runs[*index].end.get_or_insert(now);
                            false
                        } else {
                            true
                        }
                    });
                    // A run still going a minute after the service
                    // stopped is left without an end, which the checks
                    // report.
                    if stopping.is_some_and(|since| open.is_empty() || since.elapsed() > DEADLINE) {
                        return runs;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Every run, once each has ended (or a minute after the service
    /// stopped: a run still going then is left without an end).
    fn finish(mut self) -> Vec<Run> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("finished once")
            .join()
            .expect("the watcher does not panic")
    }
}

// ---------------------------------------------------------------------
// The workload.

/// One request the test publishes.
#[derive(Debug, Clone)]
struct Request {
    message_id: String,
    instance: String,
}

/// `total` requests for the seed: hosts of groups `g0`…, with repeats, and
/// one in twenty for a `pet-` host that `safety.allow` denies.
fn workload(rng: &mut StdRng, total: usize) -> Vec<Request> {
    let hosts_per_group = (total / (GROUPS * 10)).max(MIN_HOSTS_PER_GROUP);
    (0..total)
        .map(|_| {
            let message_id = uuid::Builder::from_random_bytes(rng.random()).into_uuid();
            let instance = if rng.random_bool(0.05) {
                format!("pet-{:02}", rng.random_range(0..10))
            } else {
                format!(
                    "g{}-h{:03}",
                    rng.random_range(0..GROUPS),
                    rng.random_range(0..hosts_per_group)
                )
            };
            Request {
                message_id: message_id.to_string(),
                instance,
            }
        })
        .collect()
}

/// Publishes `batch` with `mandrill publish`, again until it is confirmed
/// (a retry may publish some twice: duplicates are part of the test).
/// Returns how many tries it took.
fn publish(dir: &Path, config: &Path, batch: &[Request], name: &str) -> usize {
    let file = dir.join(name);
    let lines: String = batch
        .iter()
        .map(|r| {
            format!(
                "{{\"message_id\":\"{}\",\"instance_name\":\"{}\"}}\n",
                r.message_id, r.instance
            )
        })
        .collect();
    std::fs::write(&file, lines).unwrap();
    for tries in 1.. {
        let mut child = Command::new(support::binary())
            .arg("publish")
            .arg("--config")
            .arg(config)
            .arg("--file")
            .arg(&file)
            .env("MANDRILL_ADMIN__LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mandrill publish starts");
        // Bounded: a publish waiting on a stopped server is given up and
        // tried again.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.is_some_and(|s| s.success()) {
            return tries;
        }
        assert!(tries < 200, "publishing {name} kept failing");
        std::thread::sleep(Duration::from_millis(200));
    }
    unreachable!()
}

// ---------------------------------------------------------------------
// The instances.

struct Fleet {
    dir: PathBuf,
    args: Vec<String>,
    instances: Vec<Option<Mandrill>>,
    /// When each instance was sent SIGTERM, until it is started again.
    stopping: Vec<Option<Instant>>,
    /// When each instance was last started.
    started: Vec<Instant>,
    /// Instances that exited without being told to, and were started again.
    unexpected_exits: usize,
    /// SIGTERMs that did not end an instance within `SHUTDOWN_BOUND`, so
    /// it was killed.
    slow_shutdowns: usize,
}

/// How long an instance may take to exit after SIGTERM before it is
/// killed (and counted).
const SHUTDOWN_BOUND: Duration = Duration::from_secs(60);

impl Fleet {
    fn new(dir: &Path, args: Vec<String>, count: usize) -> Self {
        let mut fleet = Self {
            dir: dir.to_owned(),
            args,
            instances: (0..count).map(|_| None).collect(),
            stopping: vec![None; count],
            started: vec![Instant::now(); count],
            unexpected_exits: 0,
            slow_shutdowns: 0,
        };
        for i in 0..count {
            fleet.start(i);
            // One at a time the first time: each migrates the store.
            fleet.instances[i]
                .as_ref()
                .unwrap()
                .wait_for("mandrill started", 1);
        }
        fleet
    }

    fn start(&mut self, i: usize) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.instances[i] = Some(Mandrill::run(&self.dir, &args));
        self.stopping[i] = None;
        self.started[i] = Instant::now();
    }

    fn signal(&self, i: usize, name: &str) {
        if let Some(instance) = &self.instances[i] {
            instance.signal(name);
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(instance) = self.instances[i].take() {
            instance.signal("KILL");
            let _ = instance.wait_exit();
        }
    }

    fn sigterm(&mut self, i: usize) {
        self.signal(i, "CONT");
        self.signal(i, "TERM");
        self.stopping[i] = Some(Instant::now());
    }

    /// Whether instance `i`, sent SIGTERM, has exited (killed once past
    /// `SHUTDOWN_BOUND`); reaps it if so.
    fn stopped(&mut self, i: usize) -> bool {
        let Some(instance) = &mut self.instances[i] else {
            return true;
        };
        if instance.try_exit().is_none() {
            let since = self.stopping[i].expect("sent SIGTERM");
            if since.elapsed() < SHUTDOWN_BOUND {
                return false;
            }
            eprintln!(
                "nemesis: instance {i} still running {SHUTDOWN_BOUND:?} after SIGTERM; killed"
            );
            self.slow_shutdowns += 1;
            instance.signal("KILL");
        }
        let _ = self.instances[i].take().unwrap().wait_exit();
        true
    }

    /// SIGTERM to every instance; waits for them all.
    fn stop_all(&mut self) {
        for i in 0..self.instances.len() {
            self.sigterm(i);
        }
        for i in 0..self.instances.len() {
            while !self.stopped(i) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Starts again any instance that exited by itself, at most once a
    /// second (a supervisor's job: an instance started while its broker
    /// is down exits at once).
    fn supervise(&mut self) {
        for i in 0..self.instances.len() {
            if self.stopping[i].is_some() || self.started[i].elapsed() < Duration::from_secs(1) {
                continue;
            }
            let exited = match &mut self.instances[i] {
                Some(instance) => instance.try_exit(),
                None => None,
            };
            if let Some(status) = exited {
                let instance = self.instances[i].take().unwrap();
                let log = instance.raw();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                eprintln!("nemesis: instance {i} exited by itself ({status}): {tail:?}");
                self.unexpected_exits += 1;
                self.start(i);
            }
        }
    }
}

// ---------------------------------------------------------------------
// The nemesis.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum FaultKind {
    /// SIGKILL an instance; start it again after a while.
    Kill,
    /// SIGTERM an instance; start it again once it exited and a while passed.
    Terminate,
    /// SIGSTOP an instance, SIGCONT it later (sometimes past every lease).
    PauseInstance,
    /// Fill the SQLite file's disk, then free it.
    FillDisk,
    /// SIGSTOP the PostgreSQL server, SIGCONT it later.
    PauseDatabase,
    /// Cut every connection to the PostgreSQL database (as a restart of
    /// the server or a network cut does): a transaction's COMMIT may
    /// succeed with its reply lost.
    CutDatabaseConnections,
    /// SIGSTOP the NATS server, SIGCONT it later.
    PauseBroker,
    /// Stop the NATS server, start it again later.
    RestartBroker,
}

#[derive(Debug, Clone, Copy)]
struct Fault {
    kind: FaultKind,
    /// The instance, for faults of an instance.
    instance: usize,
    /// Its lane: the next fault of the lane begins once this one ended.
    lane: usize,
    /// When it begins, from the start of the run.
    at: Duration,
    /// How long it lasts (down, paused, full).
    lasts: Duration,
}

/// A lane of faults: one target (an instance, the disk, the database, the
/// broker) and what may befall it. Each lane has at most one fault at a
/// time; lanes overlap, so a database may stop while an instance is down.
struct Lane {
    instance: usize,
    kinds: &'static [FaultKind],
}

const INSTANCE_FAULTS: &[FaultKind] = &[
    FaultKind::Kill,
    FaultKind::Terminate,
    FaultKind::PauseInstance,
];

/// The seed's faults for `length`, lane after lane, sorted by start.
fn schedule(rng: &mut StdRng, length: Duration, lanes: &[Lane]) -> Vec<Fault> {
    let mut faults = Vec::new();
    for (number, lane) in lanes.iter().enumerate() {
        let mut at = Duration::ZERO;
        loop {
            at += Duration::from_millis(rng.random_range(500..5_000));
            let kind = lane.kinds[rng.random_range(0..lane.kinds.len())];
            let lasts = Duration::from_millis(match kind {
                // Paused past the lease (1s) and sometimes past the
                // claim's hold (restart_timeout + 2 ack deadlines: 6s).
                FaultKind::PauseInstance => rng.random_range(300..7_000),
                // Down past the lease, so the other takes the work over.
                FaultKind::Kill | FaultKind::Terminate => rng.random_range(0..3_000),
                // Stopped or full past the lease and the claim's hold.
                _ => rng.random_range(300..8_000),
            });
            if at + lasts > length {
                break;
            }
            faults.push(Fault {
                kind,
                instance: lane.instance,
                lane: number,
                at,
                lasts,
            });
            at += lasts;
        }
    }
    faults.sort_by_key(|fault| fault.at);
    faults
}

/// What the nemesis acts on besides the instances.
struct Targets<'a> {
    disk: Option<&'a Tmpfs>,
    postgres: Option<&'a PrivatePostgres>,
    nats: Option<&'a mut PrivateNats>,
}

/// The filler of a full disk, while it is full.
struct Inflicted {
    filler: Option<PathBuf>,
}

fn begin(fault: &Fault, fleet: &mut Fleet, targets: &mut Targets<'_>, state: &mut Inflicted) {
    let i = fault.instance;
    match fault.kind {
        FaultKind::Kill => fleet.kill(i),
        FaultKind::Terminate => fleet.sigterm(i),
        FaultKind::PauseInstance => fleet.signal(i, "STOP"),
        FaultKind::FillDisk => state.filler = Some(targets.disk.expect("a disk").fill()),
        FaultKind::PauseDatabase => targets.postgres.expect("a database").pause(),
        FaultKind::CutDatabaseConnections => {
            targets.postgres.expect("a database").cut_connections()
        }
        FaultKind::PauseBroker => targets.nats.as_ref().expect("a broker").pause(),
        FaultKind::RestartBroker => targets.nats.as_mut().expect("a broker").stop(),
    }
}

/// Ends `fault`; false when it cannot end yet (an instance still shutting
/// down), to be tried again shortly.
fn end(fault: &Fault, fleet: &mut Fleet, targets: &mut Targets<'_>, state: &mut Inflicted) -> bool {
    let i = fault.instance;
    match fault.kind {
        FaultKind::Kill => fleet.start(i),
        FaultKind::Terminate => {
            if !fleet.stopped(i) {
                return false;
            }
            fleet.start(i);
        }
        FaultKind::PauseInstance => fleet.signal(i, "CONT"),
        FaultKind::FillDisk => {
            std::fs::remove_file(state.filler.take().expect("filled")).unwrap();
        }
        FaultKind::PauseDatabase => targets.postgres.expect("a database").resume(),
        FaultKind::CutDatabaseConnections => {}
        FaultKind::PauseBroker => targets.nats.as_ref().expect("a broker").unpause(),
        FaultKind::RestartBroker => targets.nats.as_mut().expect("a broker").resume(),
    }
    true
}

/// Runs `faults` on their timeline; returns once every one has ended.
fn unleash(faults: &[Fault], fleet: &mut Fleet, targets: &mut Targets<'_>) {
    // (when, begins, index): ends sort before begins at the same instant.
    // A fault's end is put on the timeline when it begins.
    let mut timeline: Vec<(Duration, bool, usize)> = faults
        .iter()
        .enumerate()
        .map(|(n, f)| (f.at, true, n))
        .collect();
    let mut state = Inflicted { filler: None };
    // Lanes whose current fault has begun and not ended yet.
    let mut busy: HashSet<usize> = HashSet::new();
    let started = Instant::now();
    let later = || started.elapsed() + Duration::from_millis(50);
    while !timeline.is_empty() {
        timeline.sort();
        let (when, begins, n) = timeline.remove(0);
        if let Some(wait) = when.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        fleet.supervise();
        let fault = &faults[n];
        if begins {
            if busy.contains(&fault.lane) {
                timeline.push((later(), true, n));
                continue;
            }
            begin(fault, fleet, targets, &mut state);
            busy.insert(fault.lane);
            timeline.push((started.elapsed() + fault.lasts, false, n));
        } else if end(fault, fleet, targets, &mut state) {
            busy.remove(&fault.lane);
        } else {
            timeline.push((later(), false, n));
        }
    }
}

// ---------------------------------------------------------------------
// What the store kept.

/// A request's row.
#[derive(Debug, Clone)]
struct Row {
    status: String,
    attempts: i64,
    last_error: Option<String>,
}

/// A restart journal row (a claim).
#[derive(Debug, Clone)]
struct Claim {
    message_id: String,
    instance: String,
    group: String,
    /// Milliseconds since the epoch.
    claimed_at: i64,
    outcome: Option<String>,
}

#[derive(Debug, Default)]
struct Store {
    requests: HashMap<String, Row>,
    claims: Vec<Claim>,
    /// (payload, reason) of every dead letter.
    dead_letters: Vec<(String, String)>,
}

const REQUESTS_SQL: &str = "SELECT message_id, status, CAST(attempts AS BIGINT), last_error \
    FROM requests WHERE message_id IS NOT NULL";
const CLAIMS_SQL: &str = "SELECT message_id, instance_name, grp, CAST(claimed_at AS BIGINT), \
    outcome FROM restarts";

type RequestRow = (String, String, i64, Option<String>);
type ClaimRow = (String, String, String, i64, Option<String>);

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// Where the test reads the store and the dead letters.
enum Reader<'a> {
    Sqlite { url: String },
    Postgres { url: String, nats: &'a StreamNames },
}

impl Reader<'_> {
    fn requests(&self) -> HashMap<String, Row> {
        let rows: Vec<RequestRow> = block_on(async {
            match self {
                Reader::Sqlite { url } => {
                    let mut connection = sqlx::SqliteConnection::connect(url).await.unwrap();
                    sqlx::query_as(REQUESTS_SQL)
                        .fetch_all(&mut connection)
                        .await
                        .unwrap_or_default()
                }
                Reader::Postgres { url, .. } => {
                    let mut connection = sqlx::PgConnection::connect(url).await.unwrap();
                    sqlx::query_as(REQUESTS_SQL)
                        .fetch_all(&mut connection)
                        .await
                        .unwrap_or_default()
                }
            }
        });
        rows.into_iter()
            .map(|(id, status, attempts, last_error)| {
                (
                    id,
                    Row {
                        status,
                        attempts,
                        last_error,
                    },
                )
            })
            .collect()
    }

    /// Messages still in the queue.
    fn queued(&self) -> u64 {
        match self {
            Reader::Sqlite { url } => support::queue_rows(url).len() as u64,
            Reader::Postgres { nats, .. } => block_on(async {
                let client = async_nats::connect(nats.url.as_str()).await.unwrap();
                let js = async_nats::jetstream::new(client);
                let mut stream = js.get_stream(&nats.stream).await.unwrap();
                stream.info().await.unwrap().state.messages
            }),
        }
    }

    fn read(&self) -> Store {
        let requests = self.requests();
        let (claims, dead_letters): (Vec<ClaimRow>, Vec<(String, String)>) = block_on(async {
            match self {
                Reader::Sqlite { url } => {
                    let mut connection = sqlx::SqliteConnection::connect(url).await.unwrap();
                    let claims = sqlx::query_as(CLAIMS_SQL)
                        .fetch_all(&mut connection)
                        .await
                        .unwrap();
                    let dead: Vec<(Vec<u8>, String)> =
                        sqlx::query_as("SELECT payload, reason FROM dead_letters")
                            .fetch_all(&mut connection)
                            .await
                            .unwrap();
                    let dead = dead
                        .into_iter()
                        .map(|(p, r)| (String::from_utf8_lossy(&p).into_owned(), r))
                        .collect();
                    (claims, dead)
                }
                Reader::Postgres { url, nats } => {
                    let mut connection = sqlx::PgConnection::connect(url).await.unwrap();
                    let claims = sqlx::query_as(CLAIMS_SQL)
                        .fetch_all(&mut connection)
                        .await
                        .unwrap();
                    (claims, nats_dead_letters(nats).await)
                }
            }
        });
        Store {
            requests,
            claims: claims
                .into_iter()
                .map(|(message_id, instance, group, claimed_at, outcome)| Claim {
                    message_id,
                    instance,
                    group,
                    claimed_at,
                    outcome,
                })
                .collect(),
            dead_letters,
        }
    }
}

/// The copies on `{stream}_DEAD`, with their reason header.
async fn nats_dead_letters(names: &StreamNames) -> Vec<(String, String)> {
    let client = async_nats::connect(names.url.as_str()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let Ok(mut stream) = js.get_stream(format!("{}_DEAD", names.stream)).await else {
        return Vec::new();
    };
    let state = stream.info().await.unwrap().state.clone();
    let mut dead = Vec::new();
    if state.messages == 0 {
        return dead;
    }
    for sequence in state.first_sequence..=state.last_sequence {
        let Ok(message) = stream.get_raw_message(sequence).await else {
            continue;
        };
        let reason = message
            .headers
            .get(mandrill::DEAD_LETTER_REASON_HEADER)
            .map(|value| value.as_str().to_owned())
            .unwrap_or_default();
        dead.push((
            String::from_utf8_lossy(&message.payload).into_owned(),
            reason,
        ));
    }
    dead
}

// ---------------------------------------------------------------------
// The checks.

/// Statuses a request may end with.
const FINAL: [&str; 7] = [
    "restarted",
    "failed",
    "rejected",
    "unrecovered",
    "denied",
    "dry-run",
    "expired",
];

/// Every invariant broken, in words; empty when all held.
fn check(published: &[Request], runs: &[Run], store: &Store) -> Vec<String> {
    let mut violations = Vec::new();
    let mut fail = |what: String| {
        if violations.len() < 50 {
            violations.push(what);
        }
    };

    // No request lost, and none given up without a reason.
    // The ids the dead letters carry (their payloads are the requests).
    let dead_ids: HashSet<String> = store
        .dead_letters
        .iter()
        .filter_map(|(payload, _)| {
            let value: serde_json::Value = serde_json::from_str(payload).ok()?;
            Some(value["message_id"].as_str()?.to_owned())
        })
        .collect();
    let succeeded: HashSet<&str> = runs
        .iter()
        .filter(|run| run.code == Some(0))
        .map(|run| run.message_id.as_str())
        .collect();
    for (payload, reason) in &store.dead_letters {
        if reason.trim().is_empty() {
            fail(format!("dead letter without a reason: {payload}"));
        }
    }
    for request in published {
        let Some(row) = store.requests.get(&request.message_id) else {
            fail(format!(
                "lost: {} ({}) has no row",
                request.message_id, request.instance
            ));
            continue;
        };
        if !FINAL.contains(&row.status.as_str()) {
            fail(format!(
                "lost: {} ({}) is still {} after the drain",
                request.message_id, request.instance, row.status
            ));
        }
        if row.status == "failed" {
            if row
                .last_error
                .as_deref()
                .is_none_or(|e| e.trim().is_empty())
            {
                fail(format!("{} failed without a reason", request.message_id));
            }
            if !dead_ids.contains(&request.message_id) {
                fail(format!(
                    "{} failed ({:?}) but was never dead-lettered",
                    request.message_id, row.last_error
                ));
            }
        }
        if row.attempts > MAX_ATTEMPTS as i64 {
            fail(format!(
                "{} has {} attempts (max {MAX_ATTEMPTS})",
                request.message_id, row.attempts
            ));
        }
        if row.status == "restarted" && !succeeded.contains(request.message_id.as_str()) {
            fail(format!(
                "{} recorded restarted but no run of it succeeded",
                request.message_id
            ));
        }
    }

    // Claims that count (the limits leave out what was never issued).
    let counting: Vec<&Claim> = store
        .claims
        .iter()
        .filter(|c| !matches!(c.outcome.as_deref(), Some("dry-run" | "expired" | "denied")))
        .collect();

    // Per request: at most max_attempts runs, each after a claim of its own.
    let mut runs_by_request: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in runs {
        runs_by_request
            .entry(&run.message_id)
            .or_default()
            .push(run);
    }
    let mut claims_by_request: HashMap<&str, Vec<i64>> = HashMap::new();
    for claim in &counting {
        claims_by_request
            .entry(&claim.message_id)
            .or_default()
            .push(claim.claimed_at);
    }
    for (id, runs) in &mut runs_by_request {
        runs.sort_by_key(|run| run.start);
        if runs.len() > MAX_ATTEMPTS {
            fail(format!(
                "{id} restarted {} times (max {MAX_ATTEMPTS}): {runs:?}",
                runs.len()
            ));
        }
        let mut claims = claims_by_request.get(id).cloned().unwrap_or_default();
        claims.sort_unstable();
        for (k, run) in runs.iter().enumerate() {
            match claims.get(k) {
                Some(&claimed) if claimed <= run.start / 1000 => {}
                claimed => fail(format!(
                    "{id}: run {} at {} has no claim of its own before it (claims {claims:?}, \
                     the {k}th: {claimed:?})",
                    k + 1,
                    run.start
                )),
            }
        }
        overlaps(runs, &format!("request {id}"), &mut fail);
    }

    // Per host: never two runs at once; claims a cooldown apart.
    let mut runs_by_host: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in runs {
        runs_by_host.entry(&run.host).or_default().push(run);
    }
    for (host, runs) in &mut runs_by_host {
        runs.sort_by_key(|run| run.start);
        overlaps(runs, &format!("host {host}"), &mut fail);
    }
    let mut claims_by_host: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut claims_by_group: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for claim in &counting {
        claims_by_host
            .entry(&claim.instance)
            .or_default()
            .push(claim.claimed_at);
        claims_by_group
            .entry(&claim.group)
            .or_default()
            .push(claim.claimed_at);
    }
    for (host, claims) in &mut claims_by_host {
        claims.sort_unstable();
        for pair in claims.windows(2) {
            if pair[1] - pair[0] < HOST_COOLDOWN_MS {
                fail(format!(
                    "host cooldown broken: {host} claimed at {} and {} ({} ms apart, cooldown \
                     {HOST_COOLDOWN_MS} ms)",
                    pair[0],
                    pair[1],
                    pair[1] - pair[0]
                ));
            }
        }
    }
    // The rate limit: no GROUP_MAX + 1 claims of a group within a window.
    for (group, claims) in &mut claims_by_group {
        claims.sort_unstable();
        for span in claims.windows(GROUP_MAX + 1) {
            if span[GROUP_MAX] - span[0] < RATE_WINDOW_MS {
                fail(format!(
                    "rate limit broken: group {group} had {} claims within {} ms: {span:?}",
                    GROUP_MAX + 1,
                    span[GROUP_MAX] - span[0]
                ));
            }
        }
    }

    // The disruption budget, as the hosts saw it: hosts of a group running
    // a restart at once. At an instant where one run ends and another
    // starts, the end comes first (the next claim follows its outcome).
    let mut events: BTreeMap<&str, Vec<(i64, i32, &str)>> = BTreeMap::new();
    for run in runs {
        let end = run.end.unwrap_or(i64::MAX);
        let group = events.entry(&run.group).or_default();
        group.push((run.start, 1, &run.host));
        group.push((end, -1, &run.host));
    }
    for (group, events) in &mut events {
        events.sort_by_key(|(at, delta, _)| (*at, *delta));
        let mut running: HashMap<&str, i32> = HashMap::new();
        for (at, delta, host) in events.iter() {
            *running.entry(host).or_default() += delta;
            let down = running.values().filter(|n| **n > 0).count();
            if down > MAX_DISRUPTED {
                let hosts: Vec<&&str> = running
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(h, _)| h)
                    .collect();
                fail(format!(
                    "disruption budget broken: {down} hosts of {group} restarting at {at}: {hosts:?}"
                ));
            }
        }
    }
    for run in runs {
        if run.end.is_none() {
            fail(format!("a restart never ended: {run}"));
        }
    }
    violations
}

/// Reports any two of `runs` (sorted by start) that overlap.
fn overlaps(runs: &[&Run], what: &str, fail: &mut impl FnMut(String)) {
    let mut latest_end = i64::MIN;
    let mut latest: Option<&Run> = None;
    for run in runs {
        if run.start < latest_end {
            fail(format!(
                "{what} restarted twice at once: {} and {run}",
                latest.unwrap()
            ));
        }
        let end = run.end.unwrap_or(i64::MAX);
        if end > latest_end {
            latest_end = end;
            latest = Some(run);
        }
    }
}

// ---------------------------------------------------------------------
// A run.

/// Everything one configuration needs from its test.
struct Setup<'a> {
    test: &'static str,
    dir: &'a Path,
    /// `[broker]` and `[store]`, and anything else of the configuration's.
    sections: String,
    reader: Reader<'a>,
    /// The instances' lanes are added to these.
    lanes: Vec<Lane>,
    targets: Targets<'a>,
}

fn configuration(dir: &Path, seed: u64, sections: &str) -> PathBuf {
    let script = dir.join("restart.sh");
    std::fs::write(&script, RESTART_SCRIPT).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let log = dir.join("restarts.log");
    std::fs::write(&log, "").unwrap();
    let config = dir.join("mandrill.toml");
    std::fs::write(
        &config,
        format!(
            "{sections}\n\
             [worker]\nmax_in_flight = 16\nmax_attempts = {MAX_ATTEMPTS}\n\
             retry_initial = \"200ms\"\nretry_max = \"2s\"\nrestart_timeout = \"4s\"\n\
             shutdown_grace = \"2s\"\nmax_pull_failures = 1000000\npull_backoff = \"100ms\"\n\
             record_backoff = \"50ms\"\n\n\
             [restarter]\nkind = \"command\"\n\n\
             [restarter.command]\n\
             argv = [{script:?}, \"{{message_id}}\", \"{{instance_name}}\", \"{{group}}\"]\n\
             timeout = \"{COMMAND_TIMEOUT_MS}ms\"\npermanent_exit_codes = [3]\n\
             env = {{ NEMESIS_LOG = {log:?}, NEMESIS_SEED = \"{seed}\", \
             NEMESIS_PAST_LEASE_MS = \"{past_lease}\", NEMESIS_PAST_TIMEOUT_MS = \"{past_timeout}\" }}\n\n\
             [safety]\nallow = [\"g*\"]\nrequire_signed = false\n\n\
             {ALWAYS_OPEN}\n\
             [safety.rate]\ngroup_max = {GROUP_MAX}\nwindow = \"{RATE_WINDOW_MS}ms\"\n\
             host_cooldown = \"{HOST_COOLDOWN_MS}ms\"\n\n\
             [safety.budget]\nmax_disrupted = {MAX_DISRUPTED}\nforget_after = \"8s\"\n\
             settle = \"0s\"\nretry = \"200ms\"\n\n\
             [debug]\nstatus_interval = \"0s\"\n",
            script = script.display().to_string(),
            log = log.display().to_string(),
            past_lease = ACK_DEADLINE_MS + 100,
            past_timeout = COMMAND_TIMEOUT_MS + 300,
        ),
    )
    .unwrap();
    config
}

fn nemesis(setup: Setup<'_>) {
    let (length, seed) = length_and_seed();
    let replay = ReplayOnFailure {
        test: setup.test,
        seed,
        secs: length.as_secs(),
    };
    eprintln!(
        "nemesis seed {seed}, {}s; replay: {}",
        length.as_secs(),
        replay.command()
    );
    let Setup {
        dir,
        sections,
        reader,
        mut lanes,
        mut targets,
        ..
    } = setup;
    let config = configuration(dir, seed, &sections);
    let mut rng = StdRng::seed_from_u64(seed);
    // About three requests a second: the limits let six through.
    let total = (length.as_secs() as usize * 3).max(60);
    let requests = workload(&mut rng, total);
    lanes.extend((0..2).map(|instance| Lane {
        instance,
        kinds: INSTANCE_FAULTS,
    }));
    let faults = schedule(&mut rng, length, &lanes);

    let watcher = Watcher::start(dir.join("restarts.log"));
    // The first batch creates the queue before any instance starts.
    let batch = 10;
    let mut batches = requests.chunks(batch);
    publish(dir, &config, batches.next().unwrap(), "batch-0");
    let args = vec![
        "--config".to_owned(),
        config.display().to_string(),
        "--unleash".into(),
        "--log-level".into(),
        "warn,mandrill::service=info".into(),
    ];
    let mut fleet = Fleet::new(dir, args, 2);

    // The publisher: the rest, spread over 80% of the run.
    let publisher = std::thread::spawn({
        let dir = dir.to_owned();
        let config = config.clone();
        let rest: Vec<Vec<Request>> = batches.map(<[Request]>::to_vec).collect();
        let every = length.mul_f64(0.8) / (rest.len().max(1) as u32);
        move || {
            let mut retries = 0;
            let started = Instant::now();
            for (n, batch) in rest.iter().enumerate() {
                let due = started + every * n as u32;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                retries += publish(&dir, &config, batch, &format!("batch-{}", n + 1)) - 1;
            }
            retries
        }
    });

    let mut inflicted: BTreeMap<FaultKind, usize> = BTreeMap::new();
    for fault in &faults {
        *inflicted.entry(fault.kind).or_default() += 1;
    }
    let began = Instant::now();
    unleash(&faults, &mut fleet, &mut targets);
    let publish_retries = publisher.join().expect("the publisher finishes");
    fleet.supervise();
    eprintln!(
        "nemesis: {} faults in {:?} ({inflicted:?}); publishes tried again: {publish_retries}",
        faults.len(),
        began.elapsed()
    );

    // The drain: no more faults; every request must reach a final status.
    // Requests for one host are restarted one after another, a cooldown
    // apart if one is set, or a claim's hold (6 s) apart when an instance
    // died holding the host: the busiest host's queue bounds how long the
    // drain may take.
    let mut per_host: HashMap<&str, u32> = HashMap::new();
    for request in &requests {
        *per_host.entry(&request.instance).or_default() += 1;
    }
    let busiest = per_host.values().copied().max().unwrap_or(0);
    let drain = Duration::from_secs(120)
        + length / 4
        + Duration::from_millis(HOST_COOLDOWN_MS.max(6_000) as u64) * busiest;
    let deadline = Instant::now() + drain;
    loop {
        fleet.supervise();
        let rows = reader.requests();
        let open = requests
            .iter()
            .filter(|r| {
                rows.get(&r.message_id)
                    .is_none_or(|row| !FINAL.contains(&row.status.as_str()))
            })
            .count();
        if open == 0 && reader.queued() == 0 {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!("nemesis: {open} requests not final after a {drain:?} drain");
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let drained_in = began.elapsed();
    fleet.stop_all();
    let runs = watcher.finish();
    let store = reader.read();

    let violations = check(&requests, &runs, &store);
    let mut statuses: BTreeMap<&str, usize> = BTreeMap::new();
    for request in &requests {
        let status = store
            .requests
            .get(&request.message_id)
            .map_or("missing", |row| row.status.as_str());
        *statuses.entry(status).or_default() += 1;
    }
    let killed = runs.iter().filter(|r| r.code.is_none()).count();
    // Claims no run followed: an instance killed or paused between its
    // claim and the restart, or a claim whose reply was lost (its retry
    // then finds it in flight, and it later counts as an unknown outcome).
    let mut unrun: HashMap<&str, i64> = HashMap::new();
    for claim in &store.claims {
        *unrun.entry(&claim.message_id).or_default() += 1;
    }
    for run in &runs {
        *unrun.entry(&run.message_id).or_default() -= 1;
    }
    let claims_without_a_run: i64 = unrun.values().filter(|n| **n > 0).sum();
    eprintln!(
        "nemesis seed {seed}: {} requests ({statuses:?}); {} runs of the script ({killed} \
         killed at their timeout); {} claims ({claims_without_a_run} never run); {} dead \
         letters; instances exited by themselves: {}; slow shutdowns: {}; done in \
         {drained_in:?}",
        requests.len(),
        runs.len(),
        store.claims.len(),
        store.dead_letters.len(),
        fleet.unexpected_exits,
        fleet.slow_shutdowns,
    );
    assert!(
        violations.is_empty(),
        "nemesis seed {seed}: {} invariants broken:\n{}\nreplay: {}",
        violations.len(),
        violations.join("\n"),
        replay.command()
    );
}

#[test]
fn nemesis_two_instances_on_one_sqlite_file() {
    let (_guard, dir) = support::temp_dir();
    let disk = Tmpfs::mount("128m");
    let lanes = match &disk {
        Some(_) => vec![Lane {
            instance: 0,
            kinds: &[FaultKind::FillDisk],
        }],
        None => {
            eprintln!("so the nemesis never fills the disk");
            Vec::new()
        }
    };
    let db_dir = disk
        .as_ref()
        .map_or(dir.clone(), |disk| disk.path().to_owned());
    let url = format!("sqlite:{}", db_dir.join("mandrill.db").display());
    nemesis(Setup {
        test: "nemesis_two_instances_on_one_sqlite_file",
        dir: &dir,
        sections: format!(
            "[broker]\nurl = {url:?}\nack_deadline = \"{ACK_DEADLINE_MS}ms\"\n\
             max_deliveries = 30\n\n[broker.sqlite]\npoll_interval = \"20ms\"\n\n\
             [store]\nurl = {url:?}\n"
        ),
        reader: Reader::Sqlite { url: url.clone() },
        lanes,
        targets: Targets {
            disk: disk.as_ref(),
            postgres: None,
            nats: None,
        },
    });
}

#[test]
fn nemesis_two_instances_on_nats_and_postgres() {
    let (_guard, dir) = support::temp_dir();
    let postgres = PrivatePostgres::start();
    let database = postgres.create_database("nemesis");
    let mut nats = PrivateNats::start();
    let names = StreamNames::new(&nats.url(), "test");
    let sections = format!(
        "[broker]\nurl = {url:?}\nack_deadline = \"{ACK_DEADLINE_MS}ms\"\nmax_deliveries = 30\n\n\
         [broker.nats]\nstream = {stream:?}\nsubject = {subject:?}\nconsumer = {consumer:?}\n\
         dead_letter_subject = {dead:?}\n\n[store]\nurl = {database:?}\n",
        url = names.url,
        stream = names.stream,
        subject = names.subject,
        consumer = names.consumer,
        dead = names.dead_letter_subject,
    );
    nemesis(Setup {
        test: "nemesis_two_instances_on_nats_and_postgres",
        dir: &dir,
        sections,
        reader: Reader::Postgres {
            url: database.clone(),
            nats: &names,
        },
        lanes: vec![
            Lane {
                instance: 0,
                kinds: &[FaultKind::PauseDatabase, FaultKind::CutDatabaseConnections],
            },
            Lane {
                instance: 0,
                kinds: &[FaultKind::PauseBroker, FaultKind::RestartBroker],
            },
        ],
        targets: Targets {
            disk: None,
            postgres: Some(&postgres),
            nats: Some(&mut nats),
        },
    });
}

/// The checks themselves, on made-up histories: a clean one passes, and
/// each kind of violation is caught (a check that cannot fail proves
/// nothing).
#[test]
fn the_nemesis_checks_catch_each_kind_of_violation() {
    let request = |id: &str, host: &str| Request {
        message_id: id.to_owned(),
        instance: host.to_owned(),
    };
    let run = |id: &str, host: &str, start_ms: i64, end_ms: i64, code: i32| Run {
        message_id: id.to_owned(),
        host: host.to_owned(),
        group: host.split('-').next().unwrap().to_owned(),
        pid: 1,
        start: start_ms * 1000,
        end: Some(end_ms * 1000),
        code: Some(code),
    };
    let claim = |id: &str, host: &str, at: i64| Claim {
        message_id: id.to_owned(),
        instance: host.to_owned(),
        group: host.split('-').next().unwrap().to_owned(),
        claimed_at: at,
        outcome: Some("restarted".into()),
    };
    let row = |status: &str, attempts: i64| Row {
        status: status.to_owned(),
        attempts,
        last_error: (status == "failed").then(|| "all 3 restart attempts are used".to_owned()),
    };
    // a: restarted on its second attempt; b: failed for good,
    // dead-lettered; c on a third host of g0 while b runs.
    let published = vec![
        request("a", "g0-h01"),
        request("b", "g0-h02"),
        request("c", "g0-h03"),
    ];
    let clean_runs = vec![
        run("a", "g0-h01", 1_000, 1_100, 1),
        run("a", "g0-h01", 10_000, 10_050, 0),
        run("b", "g0-h02", 1_000, 3_500, 3),
        run("c", "g0-h03", 1_150, 1_180, 0),
    ];
    let clean_store = || Store {
        requests: HashMap::from([
            ("a".to_owned(), row("restarted", 2)),
            ("b".to_owned(), row("failed", 1)),
            ("c".to_owned(), row("restarted", 1)),
        ]),
        claims: vec![
            claim("a", "g0-h01", 999),
            claim("a", "g0-h01", 9_999),
            claim("b", "g0-h02", 999),
            claim("c", "g0-h03", 1_149),
        ],
        dead_letters: vec![(
            "{\"message_id\":\"b\",\"instance_name\":\"g0-h02\"}".to_owned(),
            "restart failed for good".to_owned(),
        )],
    };
    assert_eq!(
        check(&published, &clean_runs, &clean_store()),
        Vec::<String>::new()
    );

    let caught = |runs: &[Run], store: &Store, expected: &str| {
        let violations = check(&published, runs, store);
        assert!(
            violations.iter().any(|v| v.contains(expected)),
            "expected {expected:?} among {violations:?}"
        );
    };
    // Lost, and not final.
    let mut store = clean_store();
    store.requests.remove("c");
    caught(&clean_runs, &store, "lost: c");
    let mut store = clean_store();
    store.requests.insert("c".into(), row("retrying", 1));
    caught(&clean_runs, &store, "still retrying");
    // A dead letter without a reason; a failure never dead-lettered.
    let mut store = clean_store();
    store.dead_letters[0].1 = " ".into();
    caught(&clean_runs, &store, "dead letter without a reason");
    let mut store = clean_store();
    store.dead_letters.clear();
    caught(&clean_runs, &store, "never dead-lettered");
    // More runs than attempts; a run without a claim before it.
    let mut runs = clean_runs.clone();
    let mut store = clean_store();
    for at in [20_000, 30_000] {
        runs.push(run("a", "g0-h01", at, at + 10, 1));
        store.claims.push(claim("a", "g0-h01", at - 1));
    }
    caught(&runs, &store, "restarted 4 times");
    let mut store = clean_store();
    store.claims[1].claimed_at = 10_001;
    caught(&clean_runs, &store, "has no claim of its own");
    // Twice at once: one request, and one host by two requests.
    let mut runs = clean_runs.clone();
    runs[1] = run("a", "g0-h01", 1_050, 1_200, 0);
    caught(&runs, &clean_store(), "request a restarted twice at once");
    let mut runs = clean_runs.clone();
    runs[3] = run("c", "g0-h02", 1_150, 1_180, 0);
    caught(&runs, &clean_store(), "host g0-h02 restarted twice at once");
    // The host cooldown (when the runs set one) and the rate limit, on the
    // journal.
    if HOST_COOLDOWN_MS > 0 {
        let mut store = clean_store();
        store
            .claims
            .push(claim("d", "g0-h03", 1_149 + HOST_COOLDOWN_MS - 1));
        caught(&clean_runs, &store, "host cooldown broken");
    }
    let mut store = clean_store();
    for n in 0..GROUP_MAX as i64 {
        store
            .claims
            .push(claim("e", &format!("g0-h{}", 10 + n), 2_000 + n));
    }
    caught(&clean_runs, &store, "rate limit broken");
    // The budget, on the hosts: one host of g0 too many down at once.
    let mut runs = clean_runs.clone();
    for n in 0..MAX_DISRUPTED - 1 {
        runs.push(run("d", &format!("g0-h{}", 20 + n), 1_160, 1_170, 0));
    }
    caught(&runs, &clean_store(), "disruption budget broken");
    // Restarted with no successful run; more attempts than allowed.
    let mut runs = clean_runs.clone();
    runs[1].code = Some(1);
    caught(&runs, &clean_store(), "no run of it succeeded");
    let mut store = clean_store();
    store.requests.insert("c".into(), row("restarted", 4));
    caught(&clean_runs, &store, "has 4 attempts");
}
