//! The running instances' admin addresses, one file each in
//! `admin.instances_dir` (by default beside the SQLite store): with a port
//! range (`admin.listen`'s default) an instance's port depends on who
//! started first, so each writes the one it took where `mandrill status`
//! and scripts find it. With them, what the instances say of their mode
//! (`RunningModes`): past 400 lines only with its tests.
//!
//! A file is named by the address (`127.0.0.1:9731`), so that an instance
//! taking an address overwrites whatever a killed one left there, and
//! holds one JSON line (`{"addr", "url", "pid"}`). It is removed at
//! shutdown; one left by `kill -9` stays until its address is taken again,
//! so readers check that something answers there
//! ([`running`]). The directory and the files are this user's alone
//! (0700, 0600), like the token file beside them.
//!
//! Each running instance is asked for its mode on its `/api/status`
//! ([`modes`]), for `mandrill status` and the dashboard alike.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tracing::warn;

/// One instance's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Instance {
    /// The admin server's address.
    pub(crate) addr: SocketAddr,
    /// Its base URL.
    pub(crate) url: String,
    /// The process, as a hint (another PID namespace may share the
    /// directory).
    pub(crate) pid: u32,
}

/// Longest entry read back.
const MAX_ENTRY_BYTES: u64 = 4096;

/// This instance's file, removed when dropped (at shutdown, after the
/// admin server stopped).
#[derive(Debug)]
pub(crate) struct Registration {
    path: PathBuf,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Only while it is still ours: an instance that took the address
        // after us (we were stopped, not killed, so rarely) keeps its own.
        let ours = read_entry(&self.path).is_ok_and(|entry| entry.pid == std::process::id());
        if ours && let Err(error) = std::fs::remove_file(&self.path) {
            warn!(%error, path = %self.path.display(), "could not remove this instance's admin address file");
        }
    }
}

/// Writes this instance's entry for `addr` into `dir` (made if missing).
/// Errors name the path.
pub(crate) fn register(dir: &Path, addr: SocketAddr) -> anyhow::Result<Registration> {
    make_private_dir(dir)?;
    let entry = Instance {
        addr,
        url: format!("http://{addr}/"),
        pid: std::process::id(),
    };
    let path = dir.join(addr.to_string());
    let mut temporary = tempfile::Builder::new()
        .prefix(".instance.")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .with_context(|| format!("cannot write the admin address file {}", path.display()))?;
    let mut line = serde_json::to_string(&entry).context("an instance entry is JSON")?;
    line.push('\n');
    std::io::Write::write_all(&mut temporary, line.as_bytes())
        .with_context(|| format!("cannot write the admin address file {}", path.display()))?;
    // A rename, so that a reader never sees half an entry.
    temporary
        .persist(&path)
        .with_context(|| format!("cannot write the admin address file {}", path.display()))?;
    Ok(Registration { path })
}

/// `dir`, made 0700 if missing; refused if it is not a directory of this
/// user's that only it can write (nobody else may plant an address there).
fn make_private_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(error).with_context(|| {
                format!(
                    "cannot make the instances directory {} (set admin.instances_dir)",
                    dir.display()
                )
            });
        }
    }
    let metadata = std::fs::symlink_metadata(dir)
        .with_context(|| format!("cannot read the instances directory {}", dir.display()))?;
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    if !metadata.is_dir() || metadata.uid() != user || metadata.mode() & 0o022 != 0 {
        bail!(
            "the instances directory {} must be a directory of this user (uid {user}) that \
             only it can write; it is uid {} mode {:o}: remove it and a new one is made",
            dir.display(),
            metadata.uid(),
            metadata.mode() & 0o7777
        );
    }
    Ok(())
}

fn read_entry(path: &Path) -> anyhow::Result<Instance> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_ENTRY_BYTES)
        .read_to_string(&mut text)?;
    Ok(serde_json::from_str(text.trim())?)
}

/// The entries in `dir` whose address accepts a connection within
/// `timeout`, by address; an unreadable entry or one nothing answers at
/// (left by a killed instance) is left out. Nothing when there is no
/// directory.
pub(crate) async fn running(dir: &Path, timeout: Duration) -> Vec<Instance> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<Instance> = entries
        .flatten()
        .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|entry| read_entry(&entry.path()).ok())
        .collect();
    found.sort_by_key(|instance| instance.addr);
    let mut answering = Vec::with_capacity(found.len());
    for instance in found {
        let connect = tokio::net::TcpStream::connect(instance.addr);
        if let Ok(Ok(_)) = tokio::time::timeout(timeout, connect).await {
            answering.push(instance);
        }
    }
    answering
}

/// The mode a running instance says it is in, on its `/api/status`: the
/// truth about what it does, which its configuration file may not tell
/// (a start-up flag or a reload may have changed it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunningMode {
    /// Restarts are recorded as dry runs, none issued.
    pub(crate) leashed: bool,
    /// Since when (RFC 3339); `None` from a version that does not say.
    pub(crate) since: Option<String>,
    /// What made it so (an operator's leash in the store, a start-up
    /// layer or a reload); `None` likewise.
    pub(crate) by: Option<String>,
    /// Why, as the operator said when turning the leash in the store.
    #[serde(default)]
    pub(crate) reason: Option<String>,
    /// `store` (the leash recorded there) or `instance` (its own).
    #[serde(default)]
    pub(crate) from: Option<String>,
}

/// This instance's own mode, as its `/api/status` serves it.
impl From<crate::safety::Leash> for RunningMode {
    fn from(leash: crate::safety::Leash) -> Self {
        Self {
            leashed: leash.leashed,
            since: Some(leash.since.to_string()),
            by: Some(leash.by),
            reason: leash.reason,
            from: Some(
                match leash.from {
                    crate::safety::leash::LeashFrom::Store => "store",
                    crate::safety::leash::LeashFrom::Instance => "instance",
                }
                .to_owned(),
            ),
        }
    }
}

impl RunningMode {
    /// The mode in words, as `mandrill status` and the dashboard show it:
    /// `unleashed since … by …`.
    pub(crate) fn describe(&self) -> String {
        let mut text = leashed_name(self.leashed).to_owned();
        if let Some(since) = &self.since {
            text.push_str(&format!(" since {since}"));
        }
        if let Some(by) = &self.by {
            text.push_str(&format!(" by {by}"));
        }
        if let Some(reason) = &self.reason {
            text.push_str(&format!(" ({reason})"));
        }
        if self.from.as_deref() == Some("store") {
            text.push_str(", the leash recorded in the store");
        }
        text
    }
}

/// A mode's name.
pub(crate) fn leashed_name(leashed: bool) -> &'static str {
    if leashed {
        "leashed (dry run)"
    } else {
        "unleashed"
    }
}

/// What the running instances say of their mode, against the
/// configuration read here.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RunningModes {
    /// No instance answered with its mode: what runs is unknown.
    Unknown,
    /// Every instance is in this mode (leashed or not).
    All(bool),
    /// Every instance that answered is in this mode, but some did not
    /// answer: theirs is unknown, so "leashed" cannot be said of all.
    Partly(bool),
    /// Some are leashed, some not.
    Mixed,
}

impl RunningModes {
    pub(crate) fn of<'a>(modes: impl IntoIterator<Item = &'a Result<RunningMode, String>>) -> Self {
        let mut silent = false;
        let mut known = modes.into_iter().filter_map(|mode| match mode {
            Ok(mode) => Some(mode.leashed),
            Err(_) => {
                silent = true;
                None
            }
        });
        let Some(first) = known.next() else {
            return Self::Unknown;
        };
        if !known.all(|leashed| leashed == first) {
            return Self::Mixed;
        }
        if silent {
            Self::Partly(first)
        } else {
            Self::All(first)
        }
    }

    /// The mode to print: `None` when unknown.
    pub(crate) fn mode(&self) -> Option<&'static str> {
        match self {
            Self::Unknown => None,
            Self::All(leashed) => Some(leashed_name(*leashed)),
            Self::Partly(true) => Some(
                "unknown: the instances that answered are leashed (dry run), but not every \
                 instance answered",
            ),
            Self::Partly(false) => {
                Some("unleashed (every instance that answered; not every instance answered)")
            }
            Self::Mixed => Some("mixed: some instances leashed, some unleashed"),
        }
    }

    /// Says when what runs is not what `said_by` (the store's leash, or
    /// the configuration) says.
    pub(crate) fn disagreement(&self, configured: &str, said_by: &str) -> Option<String> {
        let running = match self {
            Self::Partly(leashed) => leashed_name(*leashed),
            _ => self.mode()?,
        };
        (running != configured).then(|| {
            format!(
                "the running service is {running}, but {said_by} says {configured}: it was \
                 started or reloaded otherwise, or has not read the store's leash yet (see \
                 each instance's mode below)"
            )
        })
    }
}

/// How long a listed instance's admin port may take to accept a
/// connection before it is left out as gone.
const INSTANCE_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long an instance's `/api/status` (its mode) may take: it reads the
/// store within `admin` `STORE_TIMEOUT` (2 s).
const INSTANCE_STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// The instances running with their admin address in `dir`, each with the
/// mode it says it is in (or why it could not be read), asked together:
/// what `mandrill status` and the dashboard list.
pub(crate) async fn modes(dir: &Path) -> Vec<(Instance, Result<RunningMode, String>)> {
    let instances = running(dir, INSTANCE_CONNECT_TIMEOUT).await;
    let asked = instances.iter().map(|instance| async move {
        running_mode(instance, INSTANCE_STATUS_TIMEOUT)
            .await
            .map_err(|error| format!("{error:#}"))
    });
    let modes = futures::future::join_all(asked).await;
    instances.into_iter().zip(modes).collect()
}

/// Longest `/api/status` answer read back.
const MAX_STATUS_BYTES: usize = 1 << 20;

/// Asks `instance` for its mode (`GET /api/status`, which needs no
/// token), within `timeout`; the error says why it could not be read.
pub(crate) async fn running_mode(
    instance: &Instance,
    timeout: Duration,
) -> anyhow::Result<RunningMode> {
    #[derive(Deserialize)]
    struct Status {
        mode: String,
        leash: Option<RunningMode>,
    }
    let url = format!("{}api/status", instance.url);
    let body = crate::restarter::http::fetch::get_bounded(&url, timeout, MAX_STATUS_BYTES).await?;
    let status: Status = serde_json::from_slice(&body)
        .with_context(|| format!("GET {url} answered something other than a status"))?;
    Ok(status.leash.unwrap_or(RunningMode {
        leashed: status.mode != "unleashed",
        since: None,
        by: None,
        reason: None,
        from: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_entry_is_private_listed_while_it_answers_and_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let instances = dir.path().join("mandrill.db.instances");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let registration = register(&instances, addr).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&instances), 0o700);
        assert_eq!(mode(&instances.join(addr.to_string())), 0o600);

        // One left by a killed instance: nothing answers at its address.
        let gone = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        std::mem::forget(register(&instances, gone).unwrap());

        let found = running(&instances, Duration::from_secs(5)).await;
        assert_eq!(
            found,
            vec![Instance {
                addr,
                url: format!("http://{addr}/"),
                pid: std::process::id(),
            }]
        );
        drop(registration);
        assert!(!instances.join(addr.to_string()).exists());
        assert!(running(&instances, Duration::from_secs(5)).await.is_empty());
        assert!(
            running(&dir.path().join("none"), Duration::from_secs(1))
                .await
                .is_empty()
        );
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let instances = dir.path().join("instances");
        std::fs::create_dir(&instances).unwrap();
        std::fs::set_permissions(&instances, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = register(&instances, "127.0.0.1:9730".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(error.contains("777"), "{error}");
    }

    /// One instance says leashed and another does not answer: "leashed"
    /// cannot be said of what runs (the silent one may restart hosts), so
    /// the headline says unknown; unleashed ones stay unleashed.
    #[test]
    fn an_instance_that_does_not_answer_keeps_leashed_from_being_said_of_all() {
        let mode = |leashed| {
            Ok(RunningMode {
                leashed,
                since: None,
                by: None,
                reason: None,
                from: None,
            })
        };
        let silent: Result<RunningMode, String> = Err("timed out".into());
        let partly = RunningModes::of(&[mode(true), silent.clone()]);
        assert_eq!(partly, RunningModes::Partly(true));
        assert!(partly.mode().unwrap().starts_with("unknown:"), "{partly:?}");
        let leashed = leashed_name(true);
        assert_eq!(partly.disagreement(leashed, "the store"), None);
        assert!(
            partly
                .disagreement(leashed_name(false), "the store")
                .is_some()
        );
        assert_eq!(
            RunningModes::of(&[mode(true), mode(true)]),
            RunningModes::All(true)
        );
        let unleashed = RunningModes::of(&[mode(false), silent.clone()]);
        assert!(unleashed.mode().unwrap().starts_with("unleashed"));
        assert_eq!(RunningModes::of(&[silent]), RunningModes::Unknown);
        assert_eq!(
            RunningModes::of(&[mode(true), mode(false)]),
            RunningModes::Mixed
        );
    }
}
