//! One ssh master connection per destination, reused across restarts.
//!
//! Idle connections close themselves: the master runs with
//! `ControlPersist=<idle_timeout>`, so even a mandrill killed with `kill -9`
//! leaves no connection open for long. The pool forgets a connection it
//! knows has gone idle, checks the others before reuse, and closes the
//! least recently used idle ones to stay within `max_connections`.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openssh::{ControlPersist, KnownHosts, Session, SessionBuilder};
use tempfile::TempDir;

use super::SshSettings;
use super::output::excerpt;
use crate::restarter::{Cause, SettingError};

/// Where one connection goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Destination {
    pub(super) address: String,
    pub(super) port: u16,
    pub(super) user: String,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}:{}", self.user, self.address, self.port)
    }
}

/// Why no connection could be had.
#[derive(Debug)]
pub(super) enum ConnectError {
    /// The host key or the credentials were refused: retrying cannot help.
    Refused(Cause),
    /// The host could not be reached (refused, timed out, dropped).
    Unreachable(Cause),
}

#[derive(Debug)]
struct Connection {
    session: Arc<Session>,
    /// When a restart last finished with it (or it was opened).
    last_used: Mutex<Instant>,
}

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

#[derive(Debug)]
pub(super) struct Pool {
    builder: SessionBuilder,
    known_hosts_file: PathBuf,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
    /// A slot per destination; its async lock is held while connecting, so
    /// that concurrent restarts of one host share one connection.
    slots: Mutex<HashMap<Destination, Slot>>,
    /// ssh's configuration and control sockets; removed on drop, after the
    /// connections (fields drop in order).
    _private_dir: TempDir,
}

impl Pool {
    pub(super) fn new(settings: &SshSettings) -> Result<Self, SettingError> {
        let existing = |key: &str, path: &Path| {
            std::fs::canonicalize(path).map_err(|e| {
                SettingError::because(
                    format!("restarter.ssh.{key}"),
                    path.display().to_string(),
                    e,
                )
            })
        };
        // `validate` made it required.
        let known_hosts = settings
            .known_hosts_file
            .as_deref()
            .unwrap_or(Path::new(""));
        let known_hosts_file = existing("known_hosts_file", known_hosts)?;
        let private_dir = tempfile::Builder::new()
            .prefix("mandrill-ssh-")
            .tempdir()
            .map_err(|e| {
                SettingError::because("restarter.ssh", "cannot create a private directory", e)
            })?;
        let config_file = private_dir.path().join("ssh_config");
        std::fs::write(&config_file, ssh_config(&known_hosts_file, settings)).map_err(|e| {
            SettingError::because(
                "restarter.ssh",
                format!("cannot write {}", config_file.display()),
                e,
            )
        })?;

        let mut builder = SessionBuilder::default();
        builder
            .config_file(&config_file)
            .known_hosts_check(KnownHosts::Strict)
            .control_directory(private_dir.path())
            .control_persist(ControlPersist::IdleFor(whole_seconds(
                settings.idle_timeout,
            )))
            .connect_timeout(settings.connect_timeout)
            .server_alive_interval(settings.server_alive_interval);
        if let Some(key_file) = &settings.key_file {
            builder.keyfile(existing("key_file", key_file)?);
        }
        if let Some(agent) = &settings.agent_socket {
            builder.ssh_auth_sock(agent);
        }
        Ok(Self {
            builder,
            known_hosts_file,
            connect_timeout: settings.connect_timeout,
            idle_timeout: settings.idle_timeout,
            max_connections: settings.max_connections,
            slots: Mutex::new(HashMap::new()),
            _private_dir: private_dir,
        })
    }

    /// An open connection to `destination`: the pooled one if it is still
    /// up, else a new one.
    pub(super) async fn get(
        &self,
        destination: &Destination,
    ) -> Result<Arc<Session>, ConnectError> {
        let slot = Arc::clone(self.lock_slots().entry(destination.clone()).or_default());
        let mut open = slot.lock().await;
        if let Some(connection) = open.as_ref() {
            // A connection in use is not idle, however long ago it was opened.
            let in_use = Arc::strong_count(&connection.session) > 1;
            if (in_use || self.fresh(connection)) && connection.session.check().await.is_ok() {
                return Ok(Arc::clone(&connection.session));
            }
            tracing::debug!(%destination, "the pooled ssh connection is closed; reconnecting");
            *open = None;
        }
        self.make_room(destination);
        let session = self.connect(destination).await?;
        tracing::debug!(%destination, "ssh connection opened");
        let session = Arc::new(session);
        *open = Some(Connection {
            session: Arc::clone(&session),
            last_used: Mutex::new(Instant::now()),
        });
        Ok(session)
    }

    /// Marks `session`'s connection used now: its idle time starts again.
    pub(super) fn release(&self, destination: &Destination, session: Arc<Session>) {
        drop(session);
        let slot = self.lock_slots().get(destination).cloned();
        if let Some(slot) = slot
            && let Ok(open) = slot.try_lock()
            && let Some(connection) = open.as_ref()
        {
            *lock(&connection.last_used) = Instant::now();
        }
    }

    /// Closes `session`'s connection, which failed: the next restart opens
    /// another.
    pub(super) fn discard(&self, destination: &Destination, session: Arc<Session>) {
        let slot = self.lock_slots().get(destination).cloned();
        if let Some(slot) = slot
            && let Ok(mut open) = slot.try_lock()
            && open
                .as_ref()
                .is_some_and(|connection| Arc::ptr_eq(&connection.session, &session))
        {
            *open = None;
        }
    }

    /// Whether `session`'s connection is gone (rather than only the command
    /// killed): the master takes a moment to notice, so ask a few times.
    pub(super) async fn connection_lost(&self, session: &Session) -> bool {
        for _ in 0..10 {
            if session.check().await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    async fn connect(&self, destination: &Destination) -> Result<Session, ConnectError> {
        let mut builder = self.builder.clone();
        builder
            .user(destination.user.clone())
            .port(destination.port);
        // ssh's ConnectTimeout covers the TCP connection and the greeting;
        // this bounds authentication too.
        let limit = self.connect_timeout * 2;
        match tokio::time::timeout(limit, builder.connect_mux(&destination.address)).await {
            Ok(Ok(session)) => Ok(session),
            Ok(Err(error)) => Err(self.classify(destination, error)),
            Err(_elapsed) => Err(ConnectError::Unreachable(
                format!("connecting to {destination} took longer than {limit:?}").into(),
            )),
        }
    }

    /// Sorts a failed connection: the host key or credentials refused are
    /// permanent, anything else (refused, timed out, reset) is not.
    fn classify(&self, destination: &Destination, error: openssh::Error) -> ConnectError {
        let openssh::Error::Connect(io) = &error else {
            return ConnectError::Unreachable(Cause::new(
                format!("cannot connect to {destination}"),
                error,
            ));
        };
        let stderr = io.to_string();
        let said = ssh_message(&stderr);
        if stderr.contains("Host key verification failed") {
            ConnectError::Refused(
                format!(
                    "host key of {destination} not accepted (checked against {}): {said}",
                    self.known_hosts_file.display()
                )
                .into(),
            )
        } else if io.kind() == std::io::ErrorKind::PermissionDenied
            || stderr.contains("Permission denied (")
            || stderr.contains("Too many authentication failures")
        {
            ConnectError::Refused(format!("authentication refused by {destination}: {said}").into())
        } else {
            ConnectError::Unreachable(format!("cannot connect to {destination}: {said}").into())
        }
    }

    fn fresh(&self, connection: &Connection) -> bool {
        // The master's own idle clock starts a moment before ours.
        let margin = (self.idle_timeout / 4).min(Duration::from_secs(1));
        lock(&connection.last_used).elapsed() + margin < self.idle_timeout
    }

    /// Forgets closed connections and closes the least recently used idle
    /// ones until a new one fits within `max_connections`.
    fn make_room(&self, except: &Destination) {
        let mut slots = self.lock_slots();
        let mut open = 0;
        let mut idle = Vec::new();
        slots.retain(|destination, slot| {
            if destination == except {
                return true;
            }
            let Ok(guard) = slot.try_lock() else {
                open += 1; // being connected or checked
                return true;
            };
            match guard.as_ref() {
                None => false,
                Some(c) if Arc::strong_count(&c.session) > 1 => {
                    open += 1; // in use
                    true
                }
                Some(c) if !self.fresh(c) => false, // closed itself by now
                Some(c) => {
                    open += 1;
                    idle.push((*lock(&c.last_used), destination.clone()));
                    true
                }
            }
        });
        idle.sort_by_key(|(last_used, _)| *last_used);
        for (_, destination) in idle {
            if open < self.max_connections {
                break;
            }
            if let Some(slot) = slots.remove(&destination)
                && let Ok(mut guard) = slot.try_lock()
            {
                tracing::debug!(%destination, "closing an idle ssh connection to make room");
                *guard = None;
            }
            open -= 1;
        }
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashMap<Destination, Slot>> {
        lock(&self.slots)
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (every critical section is a single assignment or lookup).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn whole_seconds(duration: Duration) -> NonZeroUsize {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    NonZeroUsize::new(usize::try_from(seconds).unwrap_or(usize::MAX)).unwrap_or(NonZeroUsize::MIN)
}

/// ssh's conclusion (its last two lines, which name the host and the
/// reason), on one line, bounded.
fn ssh_message(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('@'))
        .collect();
    excerpt(&lines[lines.len().saturating_sub(2)..].join("; "))
}

/// The whole configuration ssh reads (`-F`): neither `~/.ssh/config` nor
/// `/etc/ssh/ssh_config` applies. Host keys come from `known_hosts` alone
/// and are never added or updated; only public keys authenticate.
fn ssh_config(known_hosts: &Path, settings: &SshSettings) -> String {
    let mut config = format!(
        "# Written by mandrill for [restarter.ssh]; ssh reads nothing else.\n\
         UserKnownHostsFile \"{}\"\n\
         GlobalKnownHostsFile /dev/null\n\
         StrictHostKeyChecking yes\n\
         UpdateHostKeys no\n\
         CheckHostIP no\n\
         BatchMode yes\n\
         PubkeyAuthentication yes\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         HostbasedAuthentication no\n\
         GSSAPIAuthentication no\n\
         ForwardAgent no\n\
         ForwardX11 no\n\
         ClearAllForwardings yes\n\
         PermitLocalCommand no\n\
         ServerAliveCountMax 3\n\
         LogLevel ERROR\n",
        known_hosts.display()
    );
    if settings.key_file.is_some() {
        config.push_str("IdentitiesOnly yes\n");
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_messages_lose_their_banner_and_stay_short() {
        let changed = "@@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n\
                       @@@@@@@@@@@@\nIT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n\
                       Host key verification failed.\n";
        assert_eq!(
            ssh_message(changed),
            "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!; Host key verification failed."
        );
        assert!(ssh_message(&"x".repeat(5000)).chars().count() <= 201);
    }

    #[test]
    fn idle_timeouts_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::from_millis(1500)).get(), 2);
        assert_eq!(whole_seconds(Duration::from_secs(60)).get(), 60);
    }
}
