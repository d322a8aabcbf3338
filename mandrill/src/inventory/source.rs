//! Reading the inventory from its one source: the I/O at the edge. A file
//! is read whole (bounded); a command runs through `restarter/process.rs`
//! (no shell, a timeout, bounded output); a URL is fetched through
//! `restarter/http/fetch.rs` (reqwest, bounded, no redirects).

use std::fmt;
use std::path::PathBuf;

use super::{Inventory, InventorySettings, MAX_INVENTORY_BYTES};
use crate::restarter::process::ProcessRunner;
use crate::settings::redact_url;

/// The environment a command inherits, besides nothing: enough for
/// `ansible-inventory` and scripts like it.
const COMMAND_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "ANSIBLE_CONFIG",
    "ANSIBLE_HOME",
];

/// Where an inventory is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `inventory.file`.
    File(PathBuf),
    /// `inventory.command`.
    Command(Vec<String>),
    /// `inventory.url` (shown redacted).
    Url(String),
}

impl Source {
    /// The configured source, if any (the settings are validated: one).
    pub fn of(settings: &InventorySettings) -> Option<Self> {
        if let Some(path) = &settings.file {
            Some(Self::File(path.clone()))
        } else if !settings.command.is_empty() {
            Some(Self::Command(settings.command.clone()))
        } else {
            settings.url.clone().map(Self::Url)
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "file {}", path.display()),
            // The program only: its arguments may hold a token, and this
            // text reaches logs and the denial reasons kept in history.
            Self::Command(argv) => write!(
                f,
                "command {}",
                argv.first().map_or("", String::as_str).escape_debug()
            ),
            Self::Url(url) => write!(f, "url {}", redact_url(url)),
        }
    }
}

/// Reads and parses the inventory from `source`; the error names the
/// source and what failed.
pub async fn load(source: &Source, settings: &InventorySettings) -> Result<Inventory, String> {
    let (bytes, toml_hint) = match source {
        Source::File(path) => {
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|e| format!("cannot read {source}: {e}"))?;
            if bytes.len() > MAX_INVENTORY_BYTES {
                return Err(format!(
                    "{source} is {} bytes, over {MAX_INVENTORY_BYTES}",
                    bytes.len()
                ));
            }
            let toml = path.extension().is_some_and(|ext| ext == "toml");
            (bytes, toml)
        }
        Source::Command(argv) => {
            let allowed: Vec<String> = COMMAND_ENV.iter().map(|s| (*s).to_owned()).collect();
            let runner =
                ProcessRunner::new(None, &allowed, &[], settings.timeout, MAX_INVENTORY_BYTES);
            let finished = runner
                .run(argv)
                .await
                .map_err(|e| format!("{source}: {e}"))?;
            if !finished.status.success() {
                let stderr = finished.output.stderr.text();
                return Err(format!(
                    "{source} exited with {}: {}",
                    finished.status,
                    crate::restarter::process::for_log(stderr.trim(), 500)
                ));
            }
            let stdout = finished.output.stdout;
            if stdout.total > stdout.kept.len() as u64 {
                return Err(format!(
                    "{source} printed {} bytes, over {MAX_INVENTORY_BYTES}",
                    stdout.total
                ));
            }
            (stdout.kept, false)
        }
        Source::Url(url) => (
            crate::restarter::http::fetch::get_bounded(url, settings.timeout, MAX_INVENTORY_BYTES)
                .await?,
            false,
        ),
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("{source} is not UTF-8: {e}"))?;
    Inventory::parse(text, toml_hint, &settings.keys()).map_err(|why| format!("{source}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_source_shows_its_program_never_its_arguments() {
        let source = Source::Command(vec![
            "ansible-inventory".into(),
            "-i".into(),
            "https://ops:S3cr3t@cmdb.example/hosts".into(),
            "--vault-password-file=/run/secrets/vault".into(),
            "--list".into(),
        ]);
        assert_eq!(source.to_string(), "command ansible-inventory");
    }
}
