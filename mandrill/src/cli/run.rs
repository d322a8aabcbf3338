//! `mandrill run`: the service on a multi-threaded runtime, until a signal
//! stops it; SIGHUP reloads the configuration.

use super::signals::{SignalName, Signals, Terminations};
use super::*;

pub(super) fn run(args: &RunArgs) -> ExitCode {
    // SIGHUP first: until it is caught, a SIGHUP (a `systemctl reload`
    // right after `start`) kills the process by default, and systemd counts
    // that a clean exit that is not restarted. One that comes while the
    // configuration is read is a reload once started.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("mandrill")
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mandrill: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let hangup = match runtime.block_on(async { Signals::hangup() }) {
        Ok(hangup) => hangup,
        Err(error) => {
            eprintln!("mandrill: cannot install signal handlers: {error}");
            return ExitCode::FAILURE;
        }
    };
    let (sources, config) = match load(args.sources()) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    // The others once the configuration is read: a start-up stuck reading
    // it still stops at SIGTERM or Ctrl-C.
    let signals = match runtime.block_on(async { Signals::install(hangup) }) {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("mandrill: cannot install signal handlers: {error}");
            return ExitCode::FAILURE;
        }
    };
    if args.until_idle
        && matches!(
            BrokerUrl::parse(&config.broker.url),
            Ok(BrokerUrl::PubSub { .. })
        )
    {
        // Refused rather than waiting forever: see `broker/pubsub.rs`.
        eprintln!(
            "mandrill: --until-idle is not supported on Pub/Sub: its API reports no backlog \
             (Cloud Monitoring's undelivered-messages count lags by minutes); stop the service \
             with SIGTERM instead"
        );
        return ExitCode::from(2);
    }
    let telemetry = match Telemetry::init(&config.log, config.redactor(), config.debug.enabled) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("mandrill: cannot set up logging: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(serve(
        config,
        &sources,
        &telemetry,
        signals,
        args.until_idle,
    ));
    let at_once = matches!(outcome, Ok(Stopped::AtOnce));
    let code = match outcome {
        Ok(Stopped::Cleanly) => ExitCode::SUCCESS,
        Ok(Stopped::AtOnce) => ExitCode::from(130),
        Err(error) => {
            error!("{}", crate::causes::WithCauses(&*error));
            failure_code(&error)
        }
    };
    if at_once {
        // Nothing may delay this exit: tasks still running are dropped.
        runtime.shutdown_background();
    } else {
        // A blocking restart stuck in its thread must not hold the exit
        // hostage: every result it could produce has been given up on.
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
    info!("mandrill stopped");
    drop(telemetry); // flushes the log
    code
}

/// How the service ended, when it was asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stopped {
    /// Shut down in order (or never started, if asked during start-up).
    Cleanly,
    /// A third signal: exit now.
    AtOnce,
}

pub(super) async fn serve(
    config: Config,
    sources: &Sources,
    telemetry: &Telemetry,
    mut signals: Signals,
    until_idle: bool,
) -> anyhow::Result<Stopped> {
    // `signals` were installed before anything else, so that a signal
    // during start-up is handled at once rather than waiting for a
    // connection to time out.
    let shutdown = Shutdown::new();
    let mut terminations = Terminations::default();
    info!(
        broker = %redact_url(&config.broker.url),
        store = %redact_url(&config.store.url),
        "starting: connecting to the broker and the store"
    );
    let build = Service::build(config.clone());
    tokio::pin!(build);
    let mut reload_pending = false;
    let mut service = loop {
        tokio::select! {
            built = &mut build => break built?,
            name = signals.next() => match name {
                SignalName::Hangup => {
                    info!("SIGHUP during start-up: reloading once started");
                    reload_pending = true;
                }
                SignalName::Terminate | SignalName::Interrupt | SignalName::Quit => {
                    terminations.count(name, &shutdown);
                    // Dropping the start-up closes what it had opened; no
                    // message was pulled yet.
                    info!(signal = name.as_str(), "shutdown requested during start-up: not starting");
                    return Ok(Stopped::Cleanly);
                }
            },
        }
    };
    if until_idle {
        service = service.stop_when_idle();
    }
    let controls = service.controls();
    controls.leashed_at_start_by(&sources.dry_run_set_by(&config));
    let running = service.run(shutdown.clone());
    tokio::pin!(running);
    // What the service was built with: a reload changes only the
    // reloadable settings, so the rest stays as started.
    let started = config.clone();
    // What the file said of the leash, for the reload to tell whether the
    // file's own value changed (read again: the file may have gone since).
    let file_dry_run = sources.file_dry_run().unwrap_or(config.safety.dry_run);
    let mut current = Running {
        config,
        file_dry_run,
    };
    if reload_pending {
        reload(sources, &started, &mut current, &controls, telemetry);
    }
    loop {
        tokio::select! {
            outcome = &mut running => return outcome.map(|_| Stopped::Cleanly),
            name = signals.next() => match name {
                SignalName::Hangup => reload(sources, &started, &mut current, &controls, telemetry),
                SignalName::Terminate | SignalName::Interrupt | SignalName::Quit => if terminations.count(name, &shutdown) {
                    return Ok(Stopped::AtOnce);
                },
            },
        }
    }
}

/// `safety.dry_run` as a file says it, for the log.
fn said(dry_run: Option<bool>) -> &'static str {
    match dry_run {
        None => "unset",
        Some(true) => "true",
        Some(false) => "false",
    }
}

/// The configuration in force, and what its file said of the leash.
pub(super) struct Running {
    config: Config,
    /// `safety.dry_run` as the file (and the environment) said it when
    /// `config` was read (`Reloaded::file_dry_run` in `config/load.rs`).
    file_dry_run: Option<bool>,
}

pub(super) fn reload(
    sources: &Sources,
    started: &Config,
    running: &mut Running,
    controls: &Controls,
    telemetry: &Telemetry,
) {
    info!("SIGHUP: reloading configuration");
    let (mut new, file_dry_run) = match sources.reload() {
        Ok(reloaded) => {
            for key in reloaded.tightened {
                warn!(
                    key,
                    "the reloaded configuration is stricter than a flag given at start-up \
                     (--set): the stricter wins"
                );
            }
            (reloaded.config, reloaded.file_dry_run)
        }
        Err(error) => {
            error!(error = %error.with_causes(), "reload failed; keeping the running configuration");
            // Keeping the old keys would keep trusting one the operator
            // may have edited the file to revoke: an entry it removes or
            // changes is revoked; when `[[requesters]]` itself is wrong,
            // every key, and unsigned requests are refused too.
            match &error {
                ConfigError::Invalid { key, .. } if key.starts_with("requesters") => {
                    controls.distrust_requesters(&error);
                }
                _ => match sources.requester_entries() {
                    Ok(entries) => controls.revoke_changed_requesters(&entries),
                    // Not even `[[requesters]]` can be read (a file that
                    // is not TOML): any entry may have changed.
                    Err(_) => controls.revoke_changed_requesters(&[]),
                },
            }
            return;
        }
    };
    // The leash: turned only when the file's own `safety.dry_run` changed
    // (then over a start-up flag too); a routine reload keeps it as it runs.
    let file_turned = file_dry_run != running.file_dry_run;
    new.safety.dry_run = crate::safety::leash::reloaded_dry_run(
        running.file_dry_run,
        file_dry_run,
        running.config.safety.dry_run,
    );
    telemetry.add_secrets(&new.redactor());
    let changed = running.config.changed_keys(&new);
    // With requesters configured, every SIGHUP rebuilds the policy: their
    // key files are read again, so a rotated or revoked key takes effect
    // though the configuration's text did not change; and after a reload
    // refused for its [[requesters]] left none trusted, so that a
    // configuration back to the running one puts them back.
    if changed.iter().any(|key| {
        key.starts_with("safety.")
            || key.starts_with("inventory.")
            || [
                "requesters",
                "recovery_objective",
                "broker.reply_to_allowed",
            ]
            .contains(&key.as_str())
    }) || !new.requesters.is_empty()
        || controls.requesters_distrusted()
    {
        // The reloadable settings the policy is made of over the rest as
        // started (the backend, which the policy's defaults depend on,
        // changes only with a restart).
        let mut effective = started.clone();
        effective.safety = new.safety.clone();
        effective.inventory = new.inventory.clone();
        effective.requesters = new.requesters.clone();
        effective.recovery_objective = new.recovery_objective.clone();
        effective
            .broker
            .reply_to_allowed
            .clone_from(&new.broker.reply_to_allowed);
        if !controls.apply_policy(&effective) {
            return;
        }
    }
    // After the policy, which may still refuse the reload: valid or nothing.
    if let Err(error) = telemetry.set_level(&new.log.level) {
        error!(%error, "cannot apply log.level");
    }
    controls.apply(&new);
    for key in &changed {
        if config::reloads(key) {
            info!(key, "setting reloaded");
        } else {
            warn!(
                key,
                "setting changed, but takes effect only after a restart"
            );
        }
    }
    let leash = controls.leash();
    if file_turned {
        warn!(
            key = "safety.dry_run",
            from = said(running.file_dry_run),
            to = said(file_dry_run),
            leashed = leash.leashed,
            "the configuration file's own safety.dry_run changed: this instance's own leash \
             follows it (over a start-up flag)"
        );
    } else {
        info!(
            leashed = leash.leashed,
            by = %leash.by,
            "the leash is unchanged by this reload: the configuration file's own \
             safety.dry_run did not change"
        );
    }
    info!(changed = changed.len(), "configuration reloaded");
    running.config = new;
    running.file_dry_run = file_dry_run;
}
