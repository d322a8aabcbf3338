//! Reading the inventory from its one source: the I/O at the edge. A file
//! is read whole (bounded); a command runs through `restarter/process.rs`
//! (no shell, a timeout, bounded output); a URL is fetched through
//! `restarter/http/fetch.rs` (reqwest, bounded, no redirects); EC2's
//! instances are described through `restarter/http/aws.rs`, page by page.
//! Every source's I/O side by side, so one file past 400 lines.

use std::fmt;
use std::path::PathBuf;

use super::ec2::{Ec2Keys, next_token};
use super::{Ec2InventorySettings, Inventory, InventorySettings, Keys, MAX_INVENTORY_BYTES};
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::restarter::http::aws::{AwsClient, AwsError, Element, Service};
use crate::restarter::http::fetch::{FetchError, get_bounded};
use crate::restarter::process::{ProcessRunner, RunError};
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
pub(crate) enum Source {
    /// `inventory.file`.
    File(PathBuf),
    /// `inventory.command`.
    Command(Vec<String>),
    /// `inventory.url` (shown redacted).
    Url(String),
    /// `[inventory.ec2]`.
    Ec2(Ec2InventorySettings),
}

impl Source {
    /// The configured source, if any (the settings are validated: one).
    pub(crate) fn of(settings: &InventorySettings) -> Option<Self> {
        if let Some(path) = &settings.file {
            Some(Self::File(path.clone()))
        } else if !settings.command.is_empty() {
            Some(Self::Command(settings.command.clone()))
        } else if let Some(ec2) = &settings.ec2 {
            Some(Self::Ec2(ec2.clone()))
        } else {
            settings.url.clone().map(Self::Url)
        }
    }
}

impl Source {
    /// The setting that names this source, for an error at start-up.
    pub(crate) fn key(&self) -> &'static str {
        match self {
            Self::File(_) => "inventory.file",
            Self::Command(_) => "inventory.command",
            Self::Url(_) => "inventory.url",
            Self::Ec2(_) => "inventory.ec2",
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
            Self::Ec2(ec2) => match &ec2.endpoint_url {
                Some(endpoint) => write!(f, "ec2 at {}", redact_url(endpoint)),
                None => write!(
                    f,
                    "ec2 in {}",
                    crate::restarter::http::aws::region(ec2.region.as_deref()).unwrap_or_default()
                ),
            },
        }
    }
}

/// Why the inventory could not be loaded; each names the source (redacted,
/// as [`Source`] shows it) and keeps what failed beneath as its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum LoadError {
    /// The file could not be read.
    #[error("cannot read {from}")]
    Read {
        /// The source, as shown.
        from: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command could not be run to its end (the error names it).
    #[error(transparent)]
    Run(RunError),
    /// The command ran and failed.
    #[error("{from} exited with {status}: {stderr}")]
    Exited {
        /// The source, as shown.
        from: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// What it printed on stderr, cut.
        stderr: String,
    },
    /// The URL could not be fetched.
    #[error("cannot fetch the inventory")]
    Fetch(#[from] FetchError),
    /// EC2 did not describe the instances.
    #[error("{from}: cannot describe the instances")]
    Aws {
        /// The source, as shown.
        from: String,
        /// What AWS or the connection said.
        #[source]
        source: AwsError,
    },
    /// The file or the command's output is larger than allowed.
    #[error("{from}: {size} bytes, over the limit of {MAX_INVENTORY_BYTES}")]
    TooBig {
        /// The source, as shown.
        from: String,
        /// Its size.
        size: u64,
    },
    /// What was read is not UTF-8.
    #[error("{from} is not utf-8")]
    NotUtf8 {
        /// The source, as shown.
        from: String,
        /// Where.
        #[source]
        source: std::str::Utf8Error,
    },
    /// What was read lists no host: a source answering nothing is broken
    /// (`ansible-inventory` on a missing file exits 0 with a warning),
    /// not an empty fleet. What the command said on stderr, if anything.
    #[error("{from} lists no hosts{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Empty {
        /// The source, as shown.
        from: String,
        /// What the command printed on stderr, cut.
        stderr: String,
    },
    /// A refresh that would drop more than `inventory.max_drop` of the
    /// hosts of the copy in force.
    #[error(
        "{from} lists {now} hosts where the copy in force has {before}: a drop of more than \
         inventory.max_drop ({max_drop}%) is refused (raise it and reload, or restart, to take it)"
    )]
    Shrunk {
        /// The source, as shown.
        from: String,
        /// Hosts in the copy in force.
        before: usize,
        /// Hosts in this read.
        now: usize,
        /// `inventory.max_drop`.
        max_drop: u32,
    },
    /// What was read is not an inventory: a message for the operator,
    /// naming the entry at fault.
    #[error("{from}: {why}")]
    Invalid {
        /// The source, as shown.
        from: String,
        /// What is wrong.
        why: String,
    },
}

impl LoadError {
    /// The error followed by its causes, for a log line or the operator.
    pub(crate) fn with_causes(&self) -> impl fmt::Display + '_ {
        crate::causes::WithCauses(self)
    }
}

/// Reads and parses the inventory from `source`; the error names the
/// source and what failed.
pub(crate) async fn load(
    source: &Source,
    settings: &InventorySettings,
) -> Result<Inventory, LoadError> {
    match load_changed(source, settings, None).await? {
        Loaded::New(inventory) => Ok(inventory),
        Loaded::Unchanged => unreachable!("nothing to compare with"),
    }
}

/// What a refresh read.
#[derive(Debug)]
pub(crate) enum Loaded {
    /// A new copy.
    New(Inventory),
    /// The same bytes, read with the same keys, as the copy whose
    /// [`Inventory::digest`] was given: its parse would be that copy.
    Unchanged,
}

/// [`load`], unless what is read has the digest `last`: then nothing is
/// parsed (a refresh of 100,000 hosts that did not change costs a read and
/// a digest, not a parse).
pub(crate) async fn load_changed(
    source: &Source,
    settings: &InventorySettings,
    last: Option<[u8; 32]>,
) -> Result<Loaded, LoadError> {
    let from = || source.to_string();
    if let Source::Ec2(ec2) = source {
        let pages = describe_instances(ec2, settings.timeout)
            .await
            .map_err(|source| LoadError::Aws {
                from: from(),
                source,
            })?;
        let keys = Ec2Keys {
            group_tag: &ec2.group_tag,
            label_tags: &ec2.label_tags,
        };
        let inventory = super::ec2::parse(&pages, &keys)
            .map_err(|why| LoadError::Invalid { from: from(), why })?;
        return not_empty(inventory, from, String::new()).map(Loaded::New);
    }
    let mut stderr = String::new();
    let (bytes, toml_hint) = match source {
        Source::File(path) => {
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|source| LoadError::Read {
                    from: from(),
                    source,
                })?;
            if bytes.len() > MAX_INVENTORY_BYTES {
                return Err(LoadError::TooBig {
                    from: from(),
                    size: bytes.len() as u64,
                });
            }
            let toml = path.extension().is_some_and(|ext| ext == "toml");
            (bytes, toml)
        }
        Source::Command(argv) => {
            let allowed: Vec<String> = COMMAND_ENV.iter().map(|s| (*s).to_owned()).collect();
            let runner =
                ProcessRunner::new(None, &allowed, &[], settings.timeout, MAX_INVENTORY_BYTES);
            let finished = runner.run(argv).await.map_err(LoadError::Run)?;
            if !finished.status.success() {
                let stderr = finished.output.stderr.text();
                return Err(LoadError::Exited {
                    from: from(),
                    status: finished.status,
                    stderr: crate::restarter::process::for_log(stderr.trim(), 500).into_owned(),
                });
            }
            stderr = crate::restarter::process::for_log(finished.output.stderr.text().trim(), 500)
                .into_owned();
            if !stderr.is_empty() {
                // `ansible-inventory` warns there (a missing file, a bad
                // group) and exits 0.
                warn!(source = %source, %stderr, "the inventory command wrote to stderr");
            }
            let stdout = finished.output.stdout;
            if stdout.total > stdout.kept.len() as u64 {
                return Err(LoadError::TooBig {
                    from: from(),
                    size: stdout.total,
                });
            }
            (stdout.kept, false)
        }
        Source::Url(url) => (
            get_bounded(url, settings.timeout, MAX_INVENTORY_BYTES).await?,
            false,
        ),
        Source::Ec2(_) => unreachable!("read above"),
    };
    let keys = settings.keys();
    let shown = from();
    // Hashing and parsing a large inventory takes a runtime worker's
    // hundred milliseconds: a blocking thread's instead.
    let decoded =
        tokio::task::spawn_blocking(move || decode(&bytes, toml_hint, &keys, last, shown))
            .await
            .map_err(|joined| match joined.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Only when the runtime is shutting down.
                Err(cancelled) => LoadError::Read {
                    from: from(),
                    source: std::io::Error::other(cancelled),
                },
            })??;
    match decoded {
        Loaded::New(inventory) => not_empty(inventory, from, stderr).map(Loaded::New),
        unchanged => Ok(unchanged),
    }
}

/// What `bytes` hold, unless their digest (with the keys that read them) is
/// `last`.
fn decode(
    bytes: &[u8],
    toml_hint: bool,
    keys: &Keys,
    last: Option<[u8; 32]>,
    from: String,
) -> Result<Loaded, LoadError> {
    let digest: [u8; 32] = Sha256::new()
        .chain_update(format!("{keys:?}\0{toml_hint}\0"))
        .chain_update(bytes)
        .finalize()
        .into();
    if last == Some(digest) {
        return Ok(Loaded::Unchanged);
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(source) => return Err(LoadError::NotUtf8 { from, source }),
    };
    let mut inventory =
        Inventory::parse(text, toml_hint, keys).map_err(|why| LoadError::Invalid { from, why })?;
    inventory.digest = Some(digest);
    Ok(Loaded::New(inventory))
}

/// `inventory`, unless it lists no host.
fn not_empty(
    inventory: Inventory,
    from: impl Fn() -> String,
    stderr: String,
) -> Result<Inventory, LoadError> {
    if inventory.len() == 0 {
        return Err(LoadError::Empty {
            from: from(),
            stderr,
        });
    }
    Ok(inventory)
}

/// Most pages of `DescribeInstances` read (of 500 instances each).
const MAX_EC2_PAGES: usize = 200;

/// Every page of `DescribeInstances` with the configured filters, each
/// call bounded by `timeout`.
async fn describe_instances(
    ec2: &Ec2InventorySettings,
    timeout: std::time::Duration,
) -> Result<Vec<Element>, AwsError> {
    // The settings were validated: a region is there.
    let region = crate::restarter::http::aws::region(ec2.region.as_deref()).unwrap_or_default();
    let client = AwsClient::new(Service::Ec2, &region, ec2.endpoint_url.as_deref(), timeout)
        .map_err(|why| AwsError::Setup(format!("cannot make the aws client: {why}")))?;
    let mut params = Vec::new();
    let mut filters: Vec<(&str, Vec<String>)> = ec2
        .filters
        .iter()
        .map(|(name, values)| (name.as_str(), values.clone()))
        .collect();
    if !ec2.filters.contains_key("instance-state-name") {
        let states = ["pending", "running", "stopping", "stopped"];
        filters.push((
            "instance-state-name",
            states.iter().map(|s| (*s).to_owned()).collect(),
        ));
    }
    for (n, (name, values)) in filters.iter().enumerate() {
        params.push((format!("Filter.{}.Name", n + 1), (*name).to_owned()));
        for (m, value) in values.iter().enumerate() {
            params.push((format!("Filter.{}.Value.{}", n + 1, m + 1), value.clone()));
        }
    }
    params.push(("MaxResults".to_owned(), "500".to_owned()));
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut call = params.clone();
        if let Some(token) = &token {
            call.push(("NextToken".to_owned(), token.clone()));
        }
        let page = client.call("DescribeInstances", &call).await?;
        token = next_token(&page);
        pages.push(page);
        if token.is_none() {
            return Ok(pages);
        }
        if pages.len() >= MAX_EC2_PAGES {
            // Never a part of the fleet taken for the whole.
            return Err(AwsError::Setup(format!(
                "more than {MAX_EC2_PAGES} pages of instances match inventory.ec2.filters"
            )));
        }
    }
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

    /// Each failure names its source once and keeps what failed beneath
    /// it as a source: the refused connection, not only reqwest's
    /// "error sending request".
    #[tokio::test]
    async fn a_failed_load_names_its_source_and_keeps_the_cause() {
        let settings = InventorySettings::default();
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("hosts.toml");
        let error = load(&Source::File(missing.clone()), &settings)
            .await
            .unwrap_err();
        let line = error.with_causes().to_string();
        let shown = missing.display().to_string();
        assert_eq!(line.matches(&shown).count(), 1, "{line}");
        assert!(line.ends_with("(os error 2)"), "{line}");

        let error = load(
            &Source::Command(vec!["/nonexistent/inventory".into()]),
            &settings,
        )
        .await
        .unwrap_err();
        assert!(matches!(error, LoadError::Run { .. }), "{error:?}");
        let line = error.with_causes().to_string();
        assert_eq!(line.matches("/nonexistent/inventory").count(), 1, "{line}");
        assert!(line.ends_with("(os error 2)"), "{line}");

        // A port that was free a moment ago: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://ops:S3cr3t@127.0.0.1:{port}/hosts");
        let error = load(&Source::Url(url), &settings).await.unwrap_err();
        let line = error.with_causes().to_string();
        assert!(line.to_lowercase().contains("refused"), "{line}");
        assert!(!line.contains("S3cr3t"), "{line}");
    }
}
