//! Helpers for the tests of the backends that run processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::{Domain, ParseRules, RestartRequest};
use crate::restarter::hosts::{HostEntry, HostMap};

/// A request for `instance` in `example.net`.
pub(crate) fn request(instance: &str) -> RestartRequest {
    let payload = format!(
        r#"{{"message_id":"1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b","instance_name":"{instance}"}}"#
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    RestartRequest::parse(payload.as_bytes(), &rules).unwrap()
}

/// A host map sending every instance to `address`.
pub(crate) fn every_host_at(address: &str) -> HostMap {
    HostMap::new(&[HostEntry {
        pattern: "*".into(),
        address: Some(address.into()),
        port: None,
        user: None,
    }])
    .unwrap()
}

/// Writes a shell script. Tests run it as `sh SCRIPT`, never execute it
/// directly: exec of a file just written can fail with ETXTBSY while
/// another test thread forks.
pub(crate) fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// Whether `pid` is a live process (a zombie is not: it runs nothing,
/// and is only waiting for a parent, perhaps a PID 1 that never reaps).
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Waits until `pid` is gone, failing after a generous deadline.
pub(crate) async fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} survived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a PID a script wrote to `path`.
pub(crate) fn read_pid(path: &Path) -> u32 {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no PID in {}: {e}", path.display()));
    text.trim().parse().unwrap()
}

/// Kills a process a test started, on drop, by its PID.
pub(crate) struct KillOnDrop(pub(crate) Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if alive(pid) {
                // SAFETY: two integers; no memory involved.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
    }
}
