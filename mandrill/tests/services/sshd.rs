//! A private `sshd` for the ssh backend's tests: a free loopback port, a
//! throwaway host key and user key in a temp dir, its own `sshd_config`;
//! never the system's sshd. Stopped, with every session it serves, when
//! dropped. `.ci/run` installs Debian's openssh-server when `/usr/sbin/sshd`
//! is missing.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub const SSHD: &str = "/usr/sbin/sshd";

/// A private sshd, stopped (with every session it serves) on drop.
pub struct PrivateSshd {
    dir: TempDir,
    /// The loopback port it listens on.
    pub port: u16,
    /// Lines added to the sshd_config.
    extra_config: String,
    process: Option<Child>,
}

impl PrivateSshd {
    /// Generates the keys and the configuration and starts sshd.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// As [`PrivateSshd::start`], with `extra_config` added to the
    /// sshd_config (e.g. `MaxSessions 1\n`).
    pub fn start_with(extra_config: &str) -> Self {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: apt-get install openssh-server (.ci/run does)"
        );
        let dir = tempfile::Builder::new()
            .prefix("mandrill-sshd-")
            .tempdir()
            .unwrap();
        for key in ["host_key", "other_host_key", "user_key", "stranger_key"] {
            keygen(&dir.path().join(key));
        }
        fs::copy(
            dir.path().join("user_key.pub"),
            dir.path().join("authorized_keys"),
        )
        .unwrap();
        let mut sshd = Self {
            dir,
            port: 0,
            extra_config: extra_config.to_owned(),
            process: None,
        };
        // A port another process takes between our probe and sshd's bind
        // makes sshd exit: try another.
        for attempt in 1.. {
            sshd.port = free_port();
            sshd.write_config();
            match sshd.try_launch() {
                Ok(()) => break,
                Err(why) if attempt < 3 => eprintln!("sshd: {why}; trying another port"),
                Err(why) => panic!("{why}"),
            }
        }
        sshd
    }

    /// The sshd_config the tests use. `HOME` is the test's directory, so
    /// that the login shell reads no profile of the machine's user (root's
    /// here runs pyenv, whose rehash warns on stderr when logins overlap,
    /// and that would be recorded as the command's output).
    fn write_config(&self) {
        let d = self.dir.path().display();
        fs::write(
            self.path("sshd_config"),
            format!(
                "Port {port}\n\
                 ListenAddress 127.0.0.1\n\
                 HostKey {d}/host_key\n\
                 PidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\n\
                 StrictModes no\n\
                 UsePAM no\n\
                 PermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UseDNS no\n\
                 SetEnv HOME={d}\n\
                 LogLevel VERBOSE\n{extra}",
                port = self.port,
                extra = self.extra_config,
            ),
        )
        .unwrap();
    }

    /// Starts sshd again on the same port (after [`PrivateSshd::stop`]).
    pub fn launch(&mut self) {
        if let Err(why) = self.try_launch() {
            panic!("{why}");
        }
    }

    /// Starts sshd, logging to `sshd.log`, and waits until it listens: it
    /// writes its PID file once bound.
    fn try_launch(&mut self) -> Result<(), String> {
        // sshd running as root insists on its privilege separation directory.
        if is_root() {
            fs::create_dir_all("/run/sshd").unwrap();
        }
        let pid_file = self.path("sshd.pid");
        let _ = fs::remove_file(&pid_file);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("sshd.log"))
            .unwrap();
        let process = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(self.path("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let pid = process.id().to_string();
        self.process = Some(process);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fs::read_to_string(&pid_file).is_ok_and(|text| text.trim() == pid) {
            let exited = self.process.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || Instant::now() > deadline {
                self.stop();
                return Err(format!(
                    "sshd did not start on port {} ({exited:?}): {}",
                    self.port,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops sshd and every connection it serves, as a host going down does.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            for pid in descendants(process.id()) {
                let _ = Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.as_ref().unwrap().id()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.path("sshd.log")).unwrap_or_default()
    }

    /// How many logins sshd accepted: one per connection.
    pub fn logins(&self) -> usize {
        self.log().matches("Accepted publickey").count()
    }

    /// A known_hosts file naming `key` as this sshd's host key.
    pub fn known_hosts(&self, key: &str) -> PathBuf {
        let public = fs::read_to_string(self.path(&format!("{key}.pub"))).unwrap();
        let path = self.path(&format!("known_hosts.{key}"));
        fs::write(&path, format!("[127.0.0.1]:{} {public}", self.port)).unwrap();
        path
    }

    /// `[restarter.ssh]` settings that reach this sshd with the authorised
    /// key, running `argv`, checking the host key against `host_key`'s
    /// public half (`"host_key"` is this sshd's own).
    pub fn settings_toml(&self, argv: &[&str], host_key: &str) -> String {
        let user = current_user();
        format!(
            "argv = {argv:?}\nallow_root = {root}\nuser = {user:?}\n\
             key_file = {key:?}\nknown_hosts_file = {known:?}\nport = {port}\n\
             connect_timeout = \"5s\"\ntimeout = \"30s\"\n",
            root = user == "root",
            key = self.path("user_key"),
            known = self.known_hosts(host_key),
            port = self.port,
        )
    }

    /// Writes an executable script into the temp dir.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.path(name);
        let mut file = File::create(&path).unwrap();
        file.write_all(body.as_bytes()).unwrap();
        drop(file);
        Command::new("chmod").arg("+x").arg(&path).status().unwrap();
        path
    }
}

impl Drop for PrivateSshd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free loopback port: the kernel picks one for a listener we close again.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port()
}

pub fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "mandrill-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "ssh-keygen failed for {}", path.display());
}

pub fn current_user() -> String {
    let output = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

pub fn is_root() -> bool {
    current_user() == "root"
}

/// The parent PID of `pid`, from `/proc` (`None` once it is gone).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split(' ').nth(1)?.parse().ok()
}

/// Whether `pid` is running (a zombie is not).
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(false)
}

pub fn descendants(root: u32) -> Vec<u32> {
    let all: Vec<u32> = fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut found = vec![root];
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        found.extend(all.iter().filter(|&&pid| parent_of(pid) == Some(parent)));
        index += 1;
    }
    found.split_off(1)
}

/// Kills the "app" whose PID file is given, when the test ends.
pub struct KillOnDrop(pub PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = fs::read_to_string(&self.0) {
            let _ = Command::new("kill")
                .args(["-9", pid.trim()])
                .stderr(Stdio::null())
                .status();
        }
    }
}
