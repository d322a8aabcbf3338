//! A small filesystem to fill: a tmpfs of the test's own (tests run as
//! root in CI; elsewhere mounting is refused and the caller is told).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a fresh directory, unmounted when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (and a note on stderr) when mounting is not permitted here.
    pub fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Self { dir }),
            Ok(output) => {
                eprintln!(
                    "skipped: cannot mount a tmpfs (run as root to test a full disk): {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                None
            }
            Err(error) => {
                eprintln!("skipped: cannot run mount ({error}); run as root to test a full disk");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "remounting the tmpfs with size {size} failed"
        );
    }

    /// Fills every free byte with a file; returns its path.
    pub fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(28) => break, // ENOSPC
                Err(error) => panic!("filling the tmpfs failed: {error}"),
            }
        }
        // What is left is smaller than a chunk; take it byte by byte.
        while let Ok(1) = file.write(&[0]) {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process a failed test left behind must not keep it mounted.
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}
