//! The pause file (`safety.pause_file`): while it exists, restarts are
//! paused, for every instance sharing the store. `touch` it to stop
//! everything, `rm` it to go on: a kill switch for people (or scripts) who
//! have a shell but not mandrill's configuration.
//!
//! The file's directory is watched with `notify`, whose events arrive on
//! its own thread, outside the runtime: the callback only `try_send`s a
//! wake-up into a tokio channel of one slot (a full slot is a wake-up
//! already pending), and the task on the runtime does the rest. The file is
//! also looked at once at start-up and every `recheck` (events can be lost:
//! an overflowing inotify queue, a directory replaced).
//!
//! The switch is shared by every instance, and people turn it too, so each
//! turn is conditional ([`Store::set_switch_if`]): the file pauses only a
//! running fleet, and resumes only while the pause is still its own. Its
//! own means made by this file on this host: the switch's `by` is
//! `pause-file@HOST:PATH`, so another host's file (or an operator's pause
//! made between a look and a write) is never undone, while instances on one
//! host watching one file share it, and a restarted instance still owns
//! the pause it made (and lifts it at start-up if the file went meanwhile).
//!
//! One file past 400 lines: half of it is the tests, which drive the
//! watch's private state.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::store::{Store, StoreError, SwitchExpected};

/// What the kill switch's `by` starts with when a pause file turned it.
pub(super) const BY: &str = "pause-file";

/// Why the pause file cannot be watched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(super) enum WatchError {
    /// The path cannot be made absolute (no working directory).
    #[error("cannot resolve {}", path.display())]
    Resolve {
        /// The path as configured.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The path is a root or ends in `..`.
    #[error("{} names no file in a directory", path.display())]
    NoFile {
        /// The path.
        path: PathBuf,
    },
    /// The directory does not exist or cannot be watched.
    #[error("cannot watch {}", directory.display())]
    Watch {
        /// The directory.
        directory: PathBuf,
        /// Why.
        #[source]
        source: notify::Error,
    },
}

/// A watch on the pause file's directory; [`PauseFile::run`] acts on it.
pub(super) struct PauseFile {
    path: PathBuf,
    /// Dropping it stops notify's thread.
    _watcher: notify::RecommendedWatcher,
    woken: mpsc::Receiver<()>,
    /// Whether the file existed when last acted on; `None` before that.
    seen: Option<bool>,
    /// Who the switch says paused when this file did: `pause-file@HOST:PATH`.
    identity: String,
}

impl PauseFile {
    /// Watches the directory `path` is in (the file need not exist yet).
    /// Fails when the directory does not exist or cannot be watched.
    pub(super) fn watch(path: &Path) -> Result<Self, WatchError> {
        let path = std::path::absolute(path).map_err(|source| WatchError::Resolve {
            path: path.to_owned(),
            source,
        })?;
        let (Some(directory), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(WatchError::NoFile { path });
        };
        let cannot_watch = |source| WatchError::Watch {
            directory: directory.to_owned(),
            source,
        };
        let name = name.to_owned();
        let (wake, woken) = mpsc::channel(1);
        // Runs on notify's thread: no runtime here, so no `.await`; a
        // `try_send` never blocks, and a full slot already holds a wake-up.
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let relevant = match &event {
                    Ok(event) => {
                        event.paths.is_empty()
                            || event.paths.iter().any(|p| p.file_name() == Some(&name))
                    }
                    // Lost events: look again.
                    Err(_) => true,
                };
                if relevant {
                    let _ = wake.try_send(());
                }
            })
            .map_err(cannot_watch)?;
        watcher
            .watch(directory, notify::RecursiveMode::NonRecursive)
            .map_err(cannot_watch)?;
        let identity = format!("{BY}@{}:{}", hostname(), path.display());
        Ok(Self {
            path,
            _watcher: watcher,
            woken,
            seen: None,
            identity,
        })
    }

    /// The name this file's pauses carry in the switch's `by`.
    #[cfg(test)]
    pub(super) fn identity(&self) -> &str {
        &self.identity
    }

    /// Acts on the file until `stop`: at once, on every change in its
    /// directory, and every `recheck`.
    pub(super) async fn run(
        mut self,
        store: Arc<dyn Store>,
        recheck: Duration,
        stop: CancellationToken,
    ) {
        let recheck = recheck.max(Duration::from_secs(1));
        info!(path = %self.path.display(), "watching the pause file: while it exists, restarts are paused");
        loop {
            if let Err(error) = self.apply(&*store).await {
                // Tried again at the next event or recheck.
                error!(error = %error.with_causes(), path = %self.path.display(), "could not apply the pause file");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                _ = self.woken.recv() => {}
                () = tokio::time::sleep(recheck) => {}
            }
        }
    }

    /// Pauses while the file exists (unless already paused, by anyone);
    /// when it has gone, resumes, but only a pause the file made: an
    /// operator's `mandrill pause` is theirs to undo. The service calls it
    /// once before the worker starts, so that a file present at start-up
    /// pauses before the first pull.
    pub(super) async fn apply(&mut self, store: &dyn Store) -> Result<(), StoreError> {
        let exists = self.path.try_exists().unwrap_or(true); // unreadable: fail closed
        let by = self.identity.as_str();
        if exists {
            // Paused already (by anyone): left as it is, and not taken over.
            let reason = format!("{} exists", self.path.display());
            if store
                .set_switch_if(SwitchExpected::Running, true, by, &reason)
                .await?
            {
                warn!(reason, by, "pause file: paused all restarts");
            }
        } else if self.seen != Some(false) {
            // Removed, or absent at start-up: a pause this file made is
            // lifted even when it was removed while no instance ran.
            let reason = match self.seen {
                Some(_) => format!("{} removed", self.path.display()),
                None => format!("{} absent at start-up", self.path.display()),
            };
            if store
                .set_switch_if(SwitchExpected::PausedBy(by), false, by, &reason)
                .await?
            {
                info!(reason, "pause file: restarts resumed");
            } else if self.seen.is_some() {
                let switch = store.switch().await?;
                if switch.paused {
                    info!(
                        paused = %switch.paused_reason(),
                        "pause file removed; the kill switch stays on (not turned by this file)"
                    );
                }
            }
        }
        self.seen = Some(exists);
        Ok(())
    }
}

/// This host's name, for the pause file's identity; `localhost` if it
/// cannot be read.
fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the pointer and length describe `buffer`, which outlives the
    // call; `gethostname` writes at most that many bytes.
    let status = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let length = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    match std::str::from_utf8(&buffer[..length]) {
        Ok(name) if status == 0 && !name.is_empty() => name.to_owned(),
        _ => "localhost".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    async fn paused_by(store: &dyn Store) -> Option<String> {
        let switch = store.switch().await.unwrap();
        switch.paused.then(|| switch.by.unwrap_or_default())
    }

    #[tokio::test]
    async fn the_file_pauses_and_its_removal_resumes_only_its_own_pause() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("PAUSE");
        let store = MemoryStore::new();
        let mut file = PauseFile::watch(&path).unwrap();
        let own = file.identity().to_owned();
        assert!(
            own.starts_with("pause-file@") && own.ends_with("PAUSE"),
            "{own}"
        );

        file.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await, None, "no file, no pause");
        std::fs::write(&path, "").unwrap();
        file.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await, Some(own.clone()));
        std::fs::remove_file(&path).unwrap();
        file.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await, None, "removed: resumed");

        // An operator's pause is left alone, file or no file.
        store.set_switch(true, "sre", "game day").await.unwrap();
        std::fs::write(&path, "").unwrap();
        file.apply(&store).await.unwrap();
        std::fs::remove_file(&path).unwrap();
        file.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await.as_deref(), Some("sre"));
    }

    /// A file removed while no instance ran: the instance that starts
    /// next lifts the pause the file made (a restarted instance still owns
    /// it), and leaves an operator's alone.
    #[tokio::test]
    async fn a_file_removed_while_no_instance_ran_is_resumed_at_start_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("PAUSE");
        let store = MemoryStore::new();
        let mut before = PauseFile::watch(&path).unwrap();
        std::fs::write(&path, "").unwrap();
        before.apply(&store).await.unwrap();
        let own = before.identity().to_owned();
        assert_eq!(paused_by(&store).await, Some(own));
        drop(before);
        std::fs::remove_file(&path).unwrap();
        let mut after = PauseFile::watch(&path).unwrap();
        after.apply(&store).await.unwrap();
        assert_eq!(
            paused_by(&store).await,
            None,
            "the file's pause outlived it"
        );

        store.set_switch(true, "sre", "game day").await.unwrap();
        let mut again = PauseFile::watch(&path).unwrap();
        again.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await.as_deref(), Some("sre"));
    }

    /// Another host's pause file, or another file, is not this one: its
    /// removal does not resume their pause.
    #[tokio::test]
    async fn removing_one_pause_file_keeps_the_pause_another_file_made() {
        let dir = tempfile::tempdir().unwrap();
        let (first_path, second_path) = (dir.path().join("PAUSE"), dir.path().join("PAUSE-2"));
        let store = MemoryStore::new();
        let mut first = PauseFile::watch(&first_path).unwrap();
        let mut second = PauseFile::watch(&second_path).unwrap();
        std::fs::write(&first_path, "").unwrap();
        first.apply(&store).await.unwrap();
        std::fs::write(&second_path, "").unwrap();
        second.apply(&store).await.unwrap();
        std::fs::remove_file(&second_path).unwrap();
        second.apply(&store).await.unwrap();
        assert_eq!(
            paused_by(&store).await.as_deref(),
            Some(first.identity()),
            "the first file still exists"
        );
    }

    /// The memory store, with an operator's `mandrill pause` landing right
    /// before the next write of the switch (between the file's look and
    /// its write, if it looks first).
    struct OperatorPausesFirst {
        inner: MemoryStore,
        armed: std::sync::atomic::AtomicBool,
    }

    impl OperatorPausesFirst {
        async fn operator_pauses_if_armed(&self) {
            if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                self.inner
                    .set_switch(true, "sre", "host lost")
                    .await
                    .unwrap();
            }
        }
    }

    #[async_trait::async_trait]
    impl Store for OperatorPausesFirst {
        async fn lookup(
            &self,
            id: uuid::Uuid,
        ) -> Result<Option<crate::domain::Status>, StoreError> {
            self.inner.lookup(id).await
        }
        async fn claim_restart(
            &self,
            r: &crate::domain::RestartRequest,
            terms: crate::store::ClaimTerms,
            token: crate::store::ClaimToken,
        ) -> Result<crate::store::Claim, StoreError> {
            self.inner.claim_restart(r, terms, token).await
        }
        async fn record_outcome(
            &self,
            r: &crate::domain::RestartRequest,
            attempt: u32,
            outcome: &crate::domain::Outcome,
        ) -> Result<crate::store::Recorded, StoreError> {
            self.inner.record_outcome(r, attempt, outcome).await
        }
        async fn release_claim(
            &self,
            r: &crate::domain::RestartRequest,
            attempt: u32,
            token: crate::store::ClaimToken,
        ) -> Result<(), StoreError> {
            self.inner.release_claim(r, attempt, token).await
        }
        async fn record_rejection(
            &self,
            asked: &crate::domain::Asked,
            reason: &str,
            payload: &[u8],
        ) -> Result<(), StoreError> {
            self.inner.record_rejection(asked, reason, payload).await
        }
        async fn history(
            &self,
            limit: usize,
        ) -> Result<Vec<crate::store::HistoryEntry>, StoreError> {
            self.inner.history(limit).await
        }
        async fn record_decision(
            &self,
            r: &crate::domain::RestartRequest,
            attempt: u32,
            decision: crate::store::Decision<'_>,
        ) -> Result<crate::store::Recorded, StoreError> {
            self.inner.record_decision(r, attempt, decision).await
        }
        async fn story(&self, id: uuid::Uuid) -> Result<Option<crate::store::Story>, StoreError> {
            self.inner.story(id).await
        }
        async fn first_received(
            &self,
            r: &crate::domain::RestartRequest,
        ) -> Result<crate::domain::Timestamp, StoreError> {
            self.inner.first_received(r).await
        }
        async fn group_usage(
            &self,
            starts: crate::store::UsageStarts,
        ) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, StoreError>
        {
            self.inner.group_usage(starts).await
        }
        async fn deferrals(&self, id: uuid::Uuid) -> Result<u32, StoreError> {
            self.inner.deferrals(id).await
        }
        async fn switch(&self) -> Result<crate::store::Switch, StoreError> {
            self.inner.switch().await
        }
        async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
            self.operator_pauses_if_armed().await;
            self.inner.set_switch(paused, by, reason).await
        }
        async fn set_switch_if(
            &self,
            expected: SwitchExpected<'_>,
            paused: bool,
            by: &str,
            reason: &str,
        ) -> Result<bool, StoreError> {
            self.operator_pauses_if_armed().await;
            self.inner.set_switch_if(expected, paused, by, reason).await
        }
        async fn prune(
            &self,
            before: crate::domain::Timestamp,
            max_rows: u32,
        ) -> Result<u64, StoreError> {
            self.inner.prune(before, max_rows).await
        }
    }

    /// The file paused; an operator pauses (say, for a host that did not
    /// come back) just as the file is removed: the operator's pause stays.
    #[tokio::test]
    async fn an_operators_pause_made_as_the_file_goes_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("PAUSE");
        let store = OperatorPausesFirst {
            inner: MemoryStore::new(),
            armed: false.into(),
        };
        let mut file = PauseFile::watch(&path).unwrap();
        std::fs::write(&path, "").unwrap();
        file.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await.as_deref(), Some(file.identity()));

        store.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        std::fs::remove_file(&path).unwrap();
        file.apply(&store).await.unwrap();
        assert_eq!(
            paused_by(&store).await.as_deref(),
            Some("sre"),
            "the operator's pause was undone"
        );
    }

    #[test]
    fn a_missing_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = PauseFile::watch(&dir.path().join("nope/PAUSE"))
            .err()
            .expect("no such directory");
        assert!(matches!(error, WatchError::Watch { .. }), "{error:?}");
        // The directory, then why it cannot be watched (notify's error,
        // kept as the source).
        let line = crate::causes::WithCauses(&error).to_string();
        let directory = dir.path().join("nope");
        let named = format!("cannot watch {}: ", directory.display());
        assert!(line.starts_with(&named), "{line}");
        assert!(std::error::Error::source(&error).is_some(), "{line}");
    }
}
