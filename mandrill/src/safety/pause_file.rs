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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::store::{Store, StoreError};

/// Who the kill switch says paused, when the pause file did.
pub const BY: &str = "pause-file";

/// A watch on the pause file's directory; [`PauseFile::run`] acts on it.
pub struct PauseFile {
    path: PathBuf,
    /// Dropping it stops notify's thread.
    _watcher: notify::RecommendedWatcher,
    woken: mpsc::Receiver<()>,
    /// Whether the file existed when last acted on; `None` before that.
    seen: Option<bool>,
}

impl PauseFile {
    /// Watches the directory `path` is in (the file need not exist yet).
    /// Fails when the directory does not exist or cannot be watched.
    pub fn watch(path: &Path) -> Result<Self, String> {
        let path = std::path::absolute(path).map_err(|error| error.to_string())?;
        let (Some(directory), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(format!("{} names no file in a directory", path.display()));
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
            .map_err(|error| format!("cannot watch {}: {error}", directory.display()))?;
        watcher
            .watch(directory, notify::RecursiveMode::NonRecursive)
            .map_err(|error| format!("cannot watch {}: {error}", directory.display()))?;
        Ok(Self {
            path,
            _watcher: watcher,
            woken,
            seen: None,
        })
    }

    /// Acts on the file until `stop`: at once, on every change in its
    /// directory, and every `recheck`.
    pub async fn run(mut self, store: Arc<dyn Store>, recheck: Duration, stop: CancellationToken) {
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
    pub async fn apply(&mut self, store: &dyn Store) -> Result<(), StoreError> {
        let exists = self.path.try_exists().unwrap_or(true); // unreadable: fail closed
        if exists {
            let switch = store.switch().await?;
            if !switch.paused {
                let reason = format!("{} exists", self.path.display());
                store.set_switch(true, BY, &reason).await?;
                warn!(reason, "pause file: paused all restarts");
            }
        } else if self.seen == Some(true) {
            let switch = store.switch().await?;
            if switch.paused && switch.by.as_deref() == Some(BY) {
                let reason = format!("{} removed", self.path.display());
                store.set_switch(false, BY, &reason).await?;
                info!(reason, "pause file: restarts resumed");
            } else if switch.paused {
                info!(
                    paused = %switch.paused_reason(),
                    "pause file removed; the kill switch stays on (not turned by the file)"
                );
            }
        }
        self.seen = Some(exists);
        Ok(())
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

        file.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await, None, "no file, no pause");
        std::fs::write(&path, "").unwrap();
        file.apply(&store).await.unwrap();
        assert_eq!(paused_by(&store).await.as_deref(), Some(BY));
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

    #[test]
    fn a_missing_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = PauseFile::watch(&dir.path().join("nope/PAUSE"))
            .err()
            .expect("no such directory");
        assert!(error.contains("nope"), "{error}");
    }
}
