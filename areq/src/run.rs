//! The command line's run: reads the URL list, opens the output, the
//! report and the state file, crawls, and writes the report.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, Format};
use crate::crawl::crawl_with;
use crate::report::{Console, Summary};
use crate::seeds::parse_seeds;
use crate::state::{Resumed, State};

/// Standard input read whole on a thread of its own, or `None` once
/// `shutdown` is cancelled first: a read waiting on a terminal or an open
/// pipe is restarted after a signal, so Ctrl-C would otherwise do nothing
/// until it ends. The thread is left to the process's exit.
async fn read_stdin(shutdown: &CancellationToken) -> Option<std::io::Result<String>> {
    let (sender, read) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = sender.send(std::io::stdin().read_to_string(&mut text).map(|_| text));
    });
    tokio::select! {
        () = shutdown.cancelled() => None,
        read = read => Some(read.unwrap_or_else(|_| {
            Err(std::io::Error::other("the reading thread ended without an answer"))
        })),
    }
}

/// Runs the command line: reads the URL list, opens the output, crawls.
///
/// Invalid input lines are logged with their line number and skipped; an
/// unreadable list, a list without any valid URL or an unwritable output
/// are errors.
pub async fn run(
    config: Config,
    console: &Console,
    shutdown: CancellationToken,
) -> anyhow::Result<Summary> {
    let list_name = config.urls_file.display().to_string();
    let text = if list_name == "-" {
        match read_stdin(&shutdown).await {
            Some(read) => read.context("reading the url list from standard input failed")?,
            // Ctrl-C before the list was whole: nothing was crawled.
            None => {
                return Ok(Summary {
                    interrupted: true,
                    ..Summary::default()
                });
            }
        }
    } else {
        std::fs::read_to_string(&config.urls_file)
            .with_context(|| format!("reading the url list {list_name} failed"))?
    };
    let seeds = parse_seeds(&text);
    for rejected in &seeds.rejected {
        warn!(
            "{list_name}:{}: skipping invalid url {:?}: {}",
            rejected.line, rejected.text, rejected.reason
        );
    }
    anyhow::ensure!(!seeds.urls.is_empty(), "no valid url in {list_name}");

    let mut resume = None;
    let sink: Box<dyn Write + Send> = if let Some(state_path) = &config.state {
        let (file, state, resumed) = open_resumable(&config.output, state_path, config.format)?;
        resume = Some((state, resumed));
        Box::new(file)
    } else if config.output.as_os_str() == "-" {
        Box::new(std::io::stdout())
    } else {
        let file = File::create(&config.output).with_context(|| {
            format!(
                "creating the output file {} failed",
                config.output.display()
            )
        })?;
        Box::new(file)
    };
    // Opened before the crawl, so that an unwritable path fails at once.
    let report: Option<Box<dyn Write + Send>> = match &config.report {
        None => None,
        Some(path) if path.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
        Some(path) => Some(Box::new(File::create(path).with_context(|| {
            format!("creating the report file {} failed", path.display())
        })?)),
    };
    let mut summary = crawl_with(&config, seeds.urls, sink, resume, console, shutdown).await?;
    summary.invalid_seeds = seeds.rejected.len() as u64;
    if let (Some(mut report), Some(broken)) = (report, &summary.broken) {
        broken
            .write(&mut report)
            .and_then(|()| report.flush())
            .context("writing the broken-link report failed")?;
    }
    Ok(summary)
}

/// Opens the state file and the output it goes with, cutting the output
/// back to what the state committed (edges of pages that are not done were
/// written after the last commit, and their pages will be fetched again).
fn open_resumable(
    output: &Path,
    state_path: &Path,
    format: Format,
) -> anyhow::Result<(File, State, Resumed)> {
    use std::io::{Seek as _, SeekFrom};
    anyhow::ensure!(
        output.as_os_str() != "-",
        "--state needs an output file (-o FILE), not standard output"
    );
    let (mut state, resumed) = State::open(state_path)?;
    let format = clap::ValueEnum::to_possible_value(&format)
        .map(|value| value.get_name().to_owned())
        .unwrap_or_default();
    state.settle("format", &format)?;
    let name = output.display();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(output)
        .with_context(|| format!("opening the output file {name} failed"))?;
    let length = file
        .metadata()
        .with_context(|| format!("reading the size of the output file {name} failed"))?
        .len();
    anyhow::ensure!(
        length >= resumed.output_len,
        "the output file {name} has {length} bytes but the state {} says {} were written: \
         resume with the output the crawl started, or start afresh without the state file",
        state_path.display(),
        resumed.output_len
    );
    file.set_len(resumed.output_len)
        .and_then(|()| file.seek(SeekFrom::End(0)))
        .with_context(|| format!("cutting the output file {name} back failed"))?;
    if resumed.output_len > 0 {
        info!(
            "resuming from {}: {} urls done, {} queued",
            state_path.display(),
            resumed.done.len(),
            resumed.queued.len()
        );
    }
    Ok((file, state, resumed))
}
