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

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{Reservation, Reserving, RestartError, Restarter};
use crate::domain::{RestartRequest, Restarted};

/// See the module docs.
pub struct Journaled {
    inner: Arc<dyn Restarter>,
    /// A `std::sync::Mutex`: held only for one small write, never across an
    /// await.
    file: Mutex<File>,
}

impl Journaled {
    /// Wraps `inner`, appending to the journal at `path` (created if missing).
    pub fn open(inner: Arc<dyn Restarter>, path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            inner,
            file: Mutex::new(file),
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
            crate::store::Timestamp::now().as_millis()
        );
        let written = {
            let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
            file.write_all(line.as_bytes())
        };
        if let Err(error) = written {
            return Err(RestartError::failed(
                &request.hostname,
                format!("cannot write the restart journal: {error}"),
            ));
        }
        self.inner.restart(request, reservation).await
    }
}
