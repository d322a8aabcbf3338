//! A private moto server (EC2 and Auto Scaling on a loopback port) for the
//! `ec2` inventory and restarter, and `ec2_fleet.py`, which sets fleets up
//! and looks at them from outside with boto3. Started on a free port,
//! stopped by its PID when dropped. `.ci/run` installs `moto[server]` and
//! `boto3`; without them the test fails saying so, it is never skipped.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The region every test fleet lives in.
pub const REGION: &str = "us-east-1";

/// The credentials the tests use (moto takes any).
pub const ENV: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", REGION),
];

/// A moto server, stopped on drop.
pub struct Moto {
    pub port: u16,
    process: Child,
}

impl Moto {
    /// Starts moto on a free loopback port and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// As [`Moto::start`], with `env` (`INITIAL_NO_AUTH_ACTION_COUNT`:
    /// after that many calls, moto checks signatures and IAM policies).
    pub fn start_with(env: &[(&str, &str)]) -> Self {
        let available = Command::new("python3")
            .args(["-c", "import moto.server, boto3"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(
            available,
            "moto[server] and boto3 are missing: python3 -m pip install 'moto[server]' boto3 \
             (.ci/run does)"
        );
        for attempt in 1.. {
            let port = super::free_port();
            let process = Command::new("python3")
                .args([
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("python3 runs");
            let mut moto = Self { port, process };
            if moto.wait_until_up() {
                return moto;
            }
            assert!(attempt < 3, "moto did not start on three ports");
        }
        unreachable!()
    }

    /// Whether moto answers before it exits or a deadline passes (another
    /// process may have taken the port).
    fn wait_until_up(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.process.try_wait().unwrap().is_some() {
                return false;
            }
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.write_all(b"GET /moto-api/ HTTP/1.0\r\n\r\n");
                let mut answer = String::new();
                let _ = stream.read_to_string(&mut answer);
                if answer.starts_with("HTTP/1") {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// The endpoint, for `endpoint_url`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Runs `ec2_fleet.py ARGS` against this moto; its standard output
    /// (one JSON value), parsed.
    pub fn fleet(&self, args: &[&str]) -> serde_json::Value {
        let output = self.fleet_command(args).output().expect("python3 runs");
        parse(args, &output)
    }

    /// `ec2_fleet.py ARGS` as a command, for a test that runs it beside
    /// mandrill.
    pub fn fleet_command(&self, args: &[&str]) -> Command {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/services/ec2_fleet.py");
        let mut command = Command::new("python3");
        command
            .arg(script)
            .arg(self.endpoint())
            .args(args)
            .envs(ENV.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}

/// The JSON a finished `ec2_fleet.py` printed.
pub fn parse(args: &[&str], output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "ec2_fleet.py {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "ec2_fleet.py {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
