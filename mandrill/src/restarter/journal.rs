//! A restarter wrapper that appends one line per restart issued to a file
//! (`restarter.journal`), before issuing it: an audit trail of every restart
//! ever sent to a host, which the crash-safety test counts duplicates with.
//! A line is the hostname, a space, and the time in milliseconds since the
//! Unix epoch (`cattle-ab12.example.net 1795000000000`).
//!
//! Each line is written with one `write(2)` on a file opened for appending,
//! so it reaches the kernel before the restart is issued and survives the
//! process being killed at any later instant (not power loss: no fsync, as
//! an audit line is not worth a disk flush per restart).
//!
//! The write runs on the blocking pool: a handler shares its task with the
//! rest of its pulled batch (and their lease extensions), so a write that
//! blocks (a full pipe, a hung network file system) must not hold the task.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{Cause, Reservation, Reserving, RestartError, Restarter};
use crate::domain::{RestartRequest, Restarted};

/// See the module docs.
pub(crate) struct Journaled {
    inner: Arc<dyn Restarter>,
    /// A `std::sync::Mutex`: held only for one small write, on the blocking
    /// pool, never across an await.
    file: Arc<Mutex<File>>,
    /// Named when a line cannot be written.
    path: PathBuf,
}

impl Journaled {
    /// Wraps `inner`, appending to the journal at `path` (created if missing).
    pub(crate) fn open(inner: Arc<dyn Restarter>, path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            inner,
            file: Arc::new(Mutex::new(file)),
            path: path.to_owned(),
        })
    }
}

#[async_trait]
impl Restarter for Journaled {
    fn describe(&self, request: &RestartRequest) -> String {
        self.inner.describe(request)
    }

    fn reserve<'a>(&'a self, request: &'a RestartRequest) -> Reserving<'a> {
        // Refusals pass through: nothing is journaled or probed for them.
        self.inner.reserve(request)
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let line = format!(
            "{} {}\n",
            request.hostname,
            crate::domain::Timestamp::now().as_millis()
        );
        let file = Arc::clone(&self.file);
        let written = tokio::task::spawn_blocking(move || {
            let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
            file.write_all(line.as_bytes())
        })
        .await
        .unwrap_or_else(|panicked| Err(std::io::Error::other(panicked.to_string())));
        if let Err(error) = written {
            return Err(RestartError::failed(
                &request.hostname,
                Cause::new(
                    format!("cannot write the restart journal {}", self.path.display()),
                    error,
                ),
            ));
        }
        self.inner.restart(request, reservation).await
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Duration;

    use super::*;
    use crate::domain::testing::request;
    use crate::restarter::{SimulatedRestarter, Simulation};

    /// A journal write that blocks (here a pipe nobody reads, full) holds
    /// a thread of the blocking pool, not the runtime's: another task on
    /// the runtime's only thread still runs, and the restart follows once
    /// the write goes through.
    #[test]
    fn a_blocked_journal_write_does_not_hold_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.fifo");
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let inner = Arc::new(SimulatedRestarter(Simulation {
            min_latency: Duration::ZERO,
            max_latency: Duration::ZERO,
            failure_rate: 0.0,
        }));
        let journaled = Arc::new(Journaled::open(inner, &path).unwrap());
        // Fill the pipe, so that the journal's next write blocks.
        let mut filler = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        while filler.write(&[b'x'; 4096]).is_ok() {}

        let (ran, other_task_ran) = std::sync::mpsc::channel();
        let (restarted, restart_done) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let worker = std::thread::spawn(move || {
            runtime.block_on(async move {
                let restarting = tokio::spawn(async move {
                    let outcome = journaled
                        .restart(&request("cattle-0001"), Reservation::unlimited())
                        .await;
                    restarted.send(outcome.is_ok()).unwrap();
                });
                // Let the restart start (and block in its write).
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                ran.send(()).unwrap();
                restarting.await.unwrap();
            })
        });
        let ran_alongside = other_task_ran.recv_timeout(Duration::from_secs(10));
        // Unblock the write whatever happened, so the thread can end.
        let mut drained = vec![0; 1 << 20];
        while restart_done.try_recv().is_err() && !worker.is_finished() {
            let _ = reader.read(&mut drained);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            ran_alongside.is_ok(),
            "the blocked journal write held the runtime's only thread"
        );
        worker.join().unwrap();
    }
}
