//! The signals `mandrill run` acts on, and what each termination means.

use std::fmt;

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::*;

/// A signal mandrill acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SignalName {
    /// SIGTERM: shut down.
    Terminate,
    /// SIGINT: shut down.
    Interrupt,
    /// SIGQUIT: shut down.
    Quit,
    /// SIGHUP: reload the configuration.
    Hangup,
}

impl SignalName {
    /// As the operator knows it, e.g. `SIGTERM`.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
            Self::Quit => "SIGQUIT",
            Self::Hangup => "SIGHUP",
        }
    }
}

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The signals mandrill acts on, installed.
pub(super) struct Signals {
    terminate: Signal,
    interrupt: Signal,
    quit: Signal,
    hangup: Signal,
}

impl Signals {
    /// SIGHUP alone, caught from the very start (before the configuration
    /// is read): its default action kills the process. The others keep
    /// theirs until [`Signals::install`], so that they stop a start-up
    /// stuck reading its configuration.
    pub(super) fn hangup() -> std::io::Result<Signal> {
        signal(SignalKind::hangup())
    }

    /// The rest, beside `hangup` (from [`Signals::hangup`]).
    pub(super) fn install(hangup: Signal) -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hangup,
        })
    }

    pub(super) async fn next(&mut self) -> SignalName {
        tokio::select! {
            _ = self.terminate.recv() => SignalName::Terminate,
            _ = self.interrupt.recv() => SignalName::Interrupt,
            _ = self.quit.recv() => SignalName::Quit,
            _ = self.hangup.recv() => SignalName::Hangup,
        }
    }
}

/// Counts SIGTERM, SIGINT and SIGQUIT and says what each one means.
#[derive(Debug, Default)]
pub(super) struct Terminations(u32);

impl Terminations {
    /// Counts one more; logs and applies it. Returns whether to exit now.
    pub(super) fn count(&mut self, signal: SignalName, shutdown: &Shutdown) -> bool {
        let signal = signal.as_str();
        self.0 += 1;
        match self.0 {
            1 => {
                info!(
                    signal,
                    "shutting down: stop pulling, let in-flight work finish"
                );
                shutdown.request();
                false
            }
            2 => {
                warn!(
                    signal,
                    "second signal: skipping the rest of the grace period"
                );
                shutdown.hurry();
                false
            }
            _ => {
                warn!(
                    signal,
                    "third signal: exiting at once; unsettled deliveries will be redelivered"
                );
                true
            }
        }
    }
}
