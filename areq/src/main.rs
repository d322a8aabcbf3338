//! The `areq` binary: parses the command line, sets up logging, the runtime
//! and Ctrl-C, runs the crawl and maps the outcome to an exit code.

use std::io::IsTerminal;
use std::process::ExitCode;

use areq::{Config, Console};
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// mimalloc rather than glibc's malloc: every page allocates its body, its
/// links and their URLs on one worker thread and frees them on another;
/// measured in the crawl benchmark (README).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code of a run cut short by Ctrl-C (128 + SIGINT), as shells do.
const EXIT_INTERRUPTED: u8 = 130;

/// Exit code of a run that found broken links, with `--fail-on-broken`.
const EXIT_BROKEN: u8 = 3;

fn main() -> ExitCode {
    let config = Config::parse();
    let fail_on_broken = config.fail_on_broken;
    let console = Console::default();
    // The TLS verifier logs its own error next to ours for every bad
    // certificate; the per-URL warning already carries the reason.
    let default_filter = "warn,areq=info,rustls_platform_verifier=off";
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(console.clone())
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("areq: error: starting the async runtime failed: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let run = areq::run(config, &console, shutdown.clone());
        let mut run = std::pin::pin!(run);
        // Ctrl-C is polled first so that its handler is installed before the
        // crawl sends its first request.
        tokio::select! {
            biased;
            Ok(()) = tokio::signal::ctrl_c() => {
                tracing::warn!("interrupted: stopping and flushing the output");
                shutdown.cancel();
                run.await
            }
            result = &mut run => result,
        }
    });
    match result {
        Ok(summary) => {
            eprintln!("areq: {summary}");
            if summary.interrupted {
                ExitCode::from(EXIT_INTERRUPTED)
            } else if fail_on_broken && summary.broken_count() > 0 {
                ExitCode::from(EXIT_BROKEN)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("areq: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
