//! The `areq` binary: parses the command line, sets up logging, the runtime
//! and Ctrl-C, runs the crawl and maps the outcome to an exit code.

use std::process::ExitCode;

use areq::{Config, Console};
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Exit code of a run cut short by Ctrl-C (128 + SIGINT), as shells do.
const EXIT_INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    let config = Config::parse();
    let console = Console::default();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,areq=info")),
        )
        .with_writer(console.clone())
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
        let on_ctrl_c = shutdown.clone();
        let ctrl_c = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                tracing::warn!("interrupted: stopping, flushing the output");
                on_ctrl_c.cancel();
            }
        });
        let result = areq::run(config, &console, shutdown).await;
        ctrl_c.abort();
        result
    });
    match result {
        Ok(summary) => {
            eprintln!("areq: {summary}");
            if summary.interrupted {
                ExitCode::from(EXIT_INTERRUPTED)
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
