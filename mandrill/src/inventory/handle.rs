//! The copy of the inventory the worker decides with, and the task that
//! keeps it current. A lookup clones an `Arc` under a read lock held for
//! that instant and reads a hash map: no I/O, no store on the hot path. A
//! refresh parses a whole new copy and swaps it in (one that read what the
//! copy in force was parsed from keeps that copy, made young again: no
//! parse); a failed one keeps the last good copy (logged, counted), and a
//! copy older than
//! `inventory.max_age` is not decided with: requests are deferred.
//!
//! Past 400 lines only with its tests, which drive the refresh task's
//! private state.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::source::LoadError;
use super::{Inventory, InventorySettings, Loaded, Source, load_changed};

/// One good read of the inventory.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The hosts: shared by the snapshots of reads that found the source
    /// unchanged.
    pub inventory: Arc<Inventory>,
    /// Where it was read from (redacted).
    pub source: String,
    /// The source itself, compared whole: the redacted text leaves out a
    /// command's arguments and EC2's filters, which name another fleet.
    read_from: Source,
    /// When, on the runtime's clock (ages are measured on it).
    pub loaded_at: Instant,
}

impl Snapshot {
    /// How old it is now.
    pub(crate) fn age(&self) -> Duration {
        self.loaded_at.elapsed()
    }
}

/// The inventory in force, shared by the worker, the refresh task and the
/// admin pages. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct InventoryHandle(Arc<Inner>);

#[derive(Default)]
struct Inner {
    current: RwLock<Option<Arc<Snapshot>>>,
    /// `inventory.max_age` in milliseconds (a reload may change it).
    max_age_millis: AtomicU64,
    /// `inventory.refresh` in milliseconds: how soon a deferred request
    /// comes back.
    refresh_millis: AtomicU64,
    failures: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl fmt::Debug for InventoryHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts = self.current().map(|s| s.inventory.len());
        f.debug_struct("InventoryHandle")
            .field("hosts", &hosts)
            .field("failures", &self.failures())
            .finish_non_exhaustive()
    }
}

/// Why the inventory cannot decide a request now: it is deferred.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lookup {
    /// In plain words, naming the inventory.
    pub reason: String,
    /// How soon to look again.
    pub retry: Duration,
}

impl InventoryHandle {
    /// A handle holding `inventory`, read from `source` now, under
    /// `settings`' ages.
    pub(crate) fn new(inventory: Inventory, source: &Source, settings: &InventorySettings) -> Self {
        let handle = Self::default();
        handle.set_limits(settings);
        handle.install(Arc::new(inventory), source);
        handle
    }

    /// Applies `settings`' `max_age` and `refresh` (a reload).
    pub(crate) fn set_limits(&self, settings: &InventorySettings) {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.0
            .max_age_millis
            .store(millis(settings.max_age), Ordering::Relaxed);
        self.0
            .refresh_millis
            .store(millis(settings.refresh), Ordering::Relaxed);
    }

    /// The copy in force, however old.
    pub(crate) fn current(&self) -> Option<Arc<Snapshot>> {
        // A poisoned lock still holds a whole `Arc`: a writer only ever
        // replaces it in one store.
        self.0
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The copy in force if it is no older than `inventory.max_age`, else
    /// why not (a request is then deferred: fail closed).
    pub(crate) fn fresh(&self) -> Result<Arc<Snapshot>, Lookup> {
        let retry = Duration::from_millis(self.0.refresh_millis.load(Ordering::Relaxed))
            .clamp(Duration::from_secs(1), Duration::from_secs(300));
        let Some(snapshot) = self.current() else {
            return Err(Lookup {
                reason: "deferred by inventory: no inventory is loaded yet".into(),
                retry,
            });
        };
        let max_age = Duration::from_millis(self.0.max_age_millis.load(Ordering::Relaxed));
        let age = snapshot.age();
        if age > max_age {
            let last = self.last_error().map_or_else(String::new, |error| {
                format!("; the last read failed: {error}")
            });
            return Err(Lookup {
                reason: format!(
                    "deferred by inventory: the inventory from {} is {} old, over \
                     inventory.max_age ({}){last}",
                    snapshot.source,
                    humantime::format_duration(Duration::from_secs(age.as_secs())),
                    humantime::format_duration(max_age),
                ),
                retry,
            });
        }
        Ok(snapshot)
    }

    /// How many reads failed since start.
    pub(crate) fn failures(&self) -> u64 {
        self.0.failures.load(Ordering::Relaxed)
    }

    /// Why the last read failed, if it did (cleared by a good one).
    pub(crate) fn last_error(&self) -> Option<String> {
        self.0
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn install(&self, inventory: Arc<Inventory>, source: &Source) {
        let snapshot = Arc::new(Snapshot {
            inventory,
            source: source.to_string(),
            read_from: source.clone(),
            loaded_at: Instant::now(),
        });
        let replaced = self.swap(Some(snapshot));
        *self
            .0
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        retire(replaced);
    }

    /// Drops the copy in force, so that requests wait for the next good
    /// read (fail closed).
    fn clear(&self) {
        retire(self.swap(None));
    }

    /// Puts `snapshot` in force and hands back the one it replaces, dropped
    /// by the caller once the lock is released: freeing a large copy under
    /// the write lock would stop every lookup for as long.
    fn swap(&self, snapshot: Option<Arc<Snapshot>>) -> Option<Arc<Snapshot>> {
        let mut current = self
            .0
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::replace(&mut *current, snapshot)
    }

    /// `inventory` unless it drops more than `max_drop` percent of the
    /// hosts of the copy in force (read from the same source).
    fn not_shrunk(
        &self,
        inventory: Inventory,
        source: &Source,
        max_drop: u32,
    ) -> Result<Inventory, LoadError> {
        let Some(current) = self.current() else {
            return Ok(inventory);
        };
        let (before, now) = (current.inventory.len(), inventory.len());
        let dropped = before.saturating_sub(now);
        // dropped / before > max_drop / 100, in integers.
        if dropped * 100 > before * max_drop as usize {
            return Err(LoadError::Shrunk {
                from: source.to_string(),
                before,
                now,
                max_drop,
            });
        }
        Ok(inventory)
    }

    /// Reads the inventory again from `source`: a good copy replaces the
    /// one in force (the same copy, made young again, when the source read
    /// the same); a failure keeps it, says so, and is counted.
    pub(crate) async fn refresh(&self, source: &Source, settings: &InventorySettings) {
        let current = self
            .current()
            .filter(|current| current.read_from == *source);
        let last = current.as_ref().and_then(|c| c.inventory.digest);
        let read = load_changed(source, settings, last).await;
        let read = match (read, current) {
            (Ok(Loaded::Unchanged), Some(current)) => {
                debug!(source = %source, "inventory unchanged");
                self.install(Arc::clone(&current.inventory), source);
                return;
            }
            (Ok(Loaded::New(inventory)), _) => {
                self.not_shrunk(inventory, source, settings.max_drop)
            }
            (Ok(Loaded::Unchanged), None) => unreachable!("compared with a copy in force"),
            (Err(error), _) => Err(error),
        };
        match read {
            Ok(inventory) => {
                info!(
                    source = %source,
                    hosts = inventory.len(),
                    groups = inventory.groups().len(),
                    skipped = inventory.skipped.len(),
                    "inventory loaded"
                );
                self.install(Arc::new(inventory), source);
            }
            Err(error) => {
                let error = error.with_causes().to_string();
                self.0.failures.fetch_add(1, Ordering::Relaxed);
                let age = self.current().map(|s| {
                    humantime::format_duration(Duration::from_secs(s.age().as_secs())).to_string()
                });
                warn!(
                    %error,
                    age = age.as_deref().unwrap_or("none"),
                    "inventory refresh failed; keeping the last good copy"
                );
                *self
                    .0
                    .last_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
            }
        }
    }
}

/// Keeps `handle` current: reads the inventory every `inventory.refresh`,
/// and at once when a reload changes `[inventory]` (`settings`), until
/// `cancel`. A companion of the service, spawned into its tracker.
/// Drops a replaced copy, on a blocking thread when it may be the last
/// holder of many hosts (freeing 100,000 takes tens of milliseconds, which a
/// runtime worker would otherwise spend instead of deciding requests).
fn retire(replaced: Option<Arc<Snapshot>>) {
    let Some(replaced) = replaced else {
        return;
    };
    if Arc::strong_count(&replaced.inventory) > 1 {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(replaced))),
        Err(_) => drop(replaced),
    }
}

pub(crate) async fn refresh_task(
    handle: InventoryHandle,
    mut settings: watch::Receiver<InventorySettings>,
    cancel: CancellationToken,
) {
    // A reload arrived while a read was under way: read the new settings
    // now rather than after `refresh`.
    let mut read_now = false;
    loop {
        // Not marked seen here: a reload sent before this task first ran
        // (just after start-up) must still wake `changed` below.
        let current = settings.borrow().clone();
        handle.set_limits(&current);
        if !std::mem::take(&mut read_now) {
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = settings.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    info!("[inventory] changed by a reload; reading it again now");
                }
                () = tokio::time::sleep(current.refresh) => {}
            }
        }
        let current = settings.borrow_and_update().clone();
        handle.set_limits(&current);
        let Some(source) = Source::of(&current) else {
            continue;
        };
        if handle
            .current()
            .is_some_and(|copy| copy.read_from != source)
        {
            // A reload named another source: the old one's copy no longer
            // speaks for the fleet, even while the new one cannot be read.
            warn!(source = %source, "[inventory] names another source; requests wait for its first read");
            handle.clear();
        }
        // A read installs only once it is whole, and a command's process
        // group is killed when its read is dropped: a read abandoned for a
        // reload leaves nothing behind.
        tokio::select! {
            () = cancel.cancelled() => return,
            () = handle.refresh(&source, &current) => {}
            changed = settings.changed() => {
                if changed.is_err() {
                    return;
                }
                info!("[inventory] changed by a reload during a read; reading it again now");
                read_now = true;
            }
        }
    }
}

/// An inventory file of `n` hosts of group `web` (`web-1` …), written to
/// `file`, with the settings that read it: for tests of a refresh.
#[cfg(test)]
pub(crate) fn web_hosts_file(file: &std::path::Path, n: usize) -> InventorySettings {
    let hosts: String = (1..=n)
        .map(|i| format!("[[hosts]]\nname = \"web-{i}\"\ngroup = \"web\"\n"))
        .collect();
    std::fs::write(file, hosts).unwrap();
    InventorySettings {
        file: Some(file.to_owned()),
        ..InventorySettings::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::load;
    use super::*;

    /// A reload naming another source drops the old source's copy, so a
    /// new source that cannot be read defers every request instead of
    /// letting the old fleet decide for up to `max_age`.
    #[tokio::test]
    async fn a_reload_to_another_source_drops_the_old_copy_until_the_new_one_reads() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.toml");
        std::fs::write(&old, "[[hosts]]\nname = \"web-1\"\ngroup = \"web\"\n").unwrap();
        let at = |file: &std::path::Path| InventorySettings {
            file: Some(file.to_owned()),
            ..InventorySettings::default()
        };
        let first = at(&old);
        let source = Source::of(&first).unwrap();
        let inventory = load(&source, &first).await.unwrap();
        let handle = InventoryHandle::new(inventory, &source, &first);
        let (reload, settings) = watch::channel(first);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(refresh_task(handle.clone(), settings, cancel.clone()));
        // One thread: the task runs until it waits for a change or its
        // refresh, as it does long before any reload in the service.
        tokio::task::yield_now().await;
        assert!(handle.fresh().is_ok());
        reload.send(at(&dir.path().join("missing.toml"))).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while handle.failures() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "never read the new source"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            handle.current().is_none(),
            "the old source's copy still decides"
        );
        assert!(handle.fresh().is_err());
        cancel.cancel();
        task.await.unwrap();
    }

    /// Another command, or other arguments to the same program, is another
    /// source: its first read is not measured against the old fleet's
    /// `max_drop`, and while it fails the old copy no longer decides.
    #[tokio::test]
    async fn a_reload_to_other_arguments_of_the_same_command_is_another_source() {
        let dir = tempfile::tempdir().unwrap();
        let (prod, canary) = (dir.path().join("prod.toml"), dir.path().join("canary.toml"));
        web_hosts_file(&prod, 10);
        web_hosts_file(&canary, 3);
        let cat = |file: &std::path::Path| InventorySettings {
            command: vec!["cat".into(), file.display().to_string()],
            ..InventorySettings::default()
        };
        let first = cat(&prod);
        let source = Source::of(&first).unwrap();
        let handle = InventoryHandle::new(load(&source, &first).await.unwrap(), &source, &first);
        assert_eq!(handle.current().unwrap().inventory.len(), 10);
        let (reload, settings) = watch::channel(first);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(refresh_task(handle.clone(), settings, cancel.clone()));
        tokio::task::yield_now().await;
        reload.send(cat(&canary)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while handle.current().is_none_or(|c| c.inventory.len() == 10) {
            assert!(
                std::time::Instant::now() < deadline,
                "the new arguments' fleet was never installed: {:?}",
                handle.last_error()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(handle.current().unwrap().inventory.len(), 3);
        reload.send(cat(&dir.path().join("missing.toml"))).unwrap();
        while handle.failures() == 0 {
            assert!(std::time::Instant::now() < deadline, "never read");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            handle.current().is_none(),
            "the canary fleet still decides for another command's"
        );
        cancel.cancel();
        task.await.unwrap();
    }

    /// A reload that comes before the refresh task first runs (the service
    /// had just started) is read at once, not at the next `refresh`.
    #[tokio::test]
    async fn a_reload_before_the_refresh_task_first_runs_is_read_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = web_hosts_file(&dir.path().join("first.toml"), 1);
        let source = Source::of(&first).unwrap();
        let handle = InventoryHandle::new(load(&source, &first).await.unwrap(), &source, &first);
        let (reload, settings) = watch::channel(first);
        let second = web_hosts_file(&dir.path().join("second.toml"), 2);
        reload.send(second).unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(refresh_task(handle.clone(), settings, cancel.clone()));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while handle
            .current()
            .is_none_or(|c| !c.source.contains("second.toml"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the reload's source was never read"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(handle.current().unwrap().inventory.len(), 2);
        cancel.cancel();
        task.await.unwrap();
    }

    /// A reload that names another source while the old one hangs is read
    /// at once, not once the hanging read times out (meanwhile the old
    /// copy would be installed, or nothing read at all).
    #[tokio::test]
    async fn a_reload_during_a_hanging_read_reads_the_new_source_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = web_hosts_file(&dir.path().join("first.toml"), 1);
        let source = Source::of(&first).unwrap();
        let handle = InventoryHandle::new(load(&source, &first).await.unwrap(), &source, &first);
        let (reload, settings) = watch::channel(first);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(refresh_task(handle.clone(), settings, cancel.clone()));
        reload
            .send(InventorySettings {
                command: vec!["sleep".into(), "600".into()],
                timeout: Duration::from_secs(600),
                ..InventorySettings::default()
            })
            .unwrap();
        // The hanging source's read is under way once the old copy is gone.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while handle.current().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "never read the command"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        reload
            .send(web_hosts_file(&dir.path().join("second.toml"), 2))
            .unwrap();
        while handle
            .current()
            .is_none_or(|c| !c.source.contains("second.toml"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the new source waited for the hanging read"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(handle.current().unwrap().inventory.len(), 2);
        cancel.cancel();
        task.await.unwrap();
    }

    /// A refresh that drops more than `inventory.max_drop` of the hosts is
    /// refused and counted, keeping the copy in force; one within it, or
    /// any with `max_drop = 100`, is taken; a source that lists nothing is
    /// refused whatever `max_drop` says.
    #[tokio::test]
    async fn a_refresh_that_loses_most_of_the_fleet_keeps_the_last_good_copy() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hosts.toml");
        let settings = web_hosts_file(&file, 10);
        let source = Source::of(&settings).unwrap();
        let handle =
            InventoryHandle::new(load(&source, &settings).await.unwrap(), &source, &settings);
        let in_force = || handle.current().unwrap().inventory.len();
        web_hosts_file(&file, 4);
        handle.refresh(&source, &settings).await;
        assert_eq!(in_force(), 10, "60% dropped: refused");
        assert_eq!(handle.failures(), 1);
        let why = handle.last_error().unwrap();
        assert!(
            why.contains("lists 4 hosts where the copy in force has 10"),
            "{why}"
        );
        web_hosts_file(&file, 5);
        handle.refresh(&source, &settings).await;
        assert_eq!(in_force(), 5, "half dropped: within the default 50%");
        assert_eq!(handle.last_error(), None);
        std::fs::write(&file, "hosts = []\n").unwrap();
        let any = InventorySettings {
            max_drop: 100,
            ..settings.clone()
        };
        handle.refresh(&source, &any).await;
        assert_eq!(in_force(), 5, "no hosts at all: refused");
        let why = handle.last_error().unwrap();
        assert!(why.contains("lists no hosts"), "{why}");
        web_hosts_file(&file, 1);
        handle.refresh(&source, &any).await;
        assert_eq!(in_force(), 1, "max_drop = 100 takes any drop");
    }

    /// A refresh that reads what the copy in force was parsed from (the
    /// same bytes, read with the same keys) parses nothing: the copy is
    /// kept and its age starts again. Other keys or other bytes are parsed.
    #[tokio::test(start_paused = true)]
    async fn a_refresh_of_an_unchanged_source_keeps_the_copy_and_makes_it_young() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hosts.toml");
        let settings = web_hosts_file(&file, 3);
        let source = Source::of(&settings).unwrap();
        let handle =
            InventoryHandle::new(load(&source, &settings).await.unwrap(), &source, &settings);
        let first = handle.current().unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        handle.refresh(&source, &settings).await;
        let again = handle.current().unwrap();
        assert!(
            Arc::ptr_eq(&first.inventory, &again.inventory),
            "parsed again"
        );
        assert!(again.age() < Duration::from_secs(1), "{:?}", again.age());
        let other_keys = InventorySettings {
            zone_var: "az".into(),
            ..settings.clone()
        };
        handle.refresh(&source, &other_keys).await;
        let rekeyed = handle.current().unwrap();
        assert!(!Arc::ptr_eq(&again.inventory, &rekeyed.inventory));
        web_hosts_file(&file, 4);
        handle.refresh(&source, &other_keys).await;
        assert_eq!(handle.current().unwrap().inventory.len(), 4);
    }
}
