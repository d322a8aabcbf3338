//! Stop conditions (`[[safety.stop_conditions]]`): checks run right before
//! each restart (and before a dry run's action), AWS FIS style. An HTTP
//! probe is healthy when it answers the expected status (and, with
//! `expect_empty_json_array`, an empty JSON array: an alert API's "nothing
//! firing"); a command when it exits 0. Anything else (another status, a non-zero exit, a timeout, an
//! error) defers the restart: fail closed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::causes::WithCauses;
use crate::restarter::process::{ProcessRunner, for_log};
use crate::settings::redact_url;

/// Variables a check command inherits from mandrill's environment; nothing
/// else is passed (no secrets of the service leak into it).
const INHERITED: &[&str] = &["PATH", "HOME", "LANG", "TZ"];

/// Output of a check command kept for the reason, per stream.
const KEPT_OUTPUT: usize = 4096;

/// The most of an HTTP check's body read for `expect_empty_json_array`:
/// an empty array is a few bytes, so a longer body is not one.
const MAX_CHECKED_BODY: usize = 64 * 1024;

/// One `[[safety.stop_conditions]]` entry, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StopConditionSettings {
    /// What reasons call it: `deferred by stop condition "alerts": …`.
    pub name: String,
    /// Probe this URL with GET; healthy when it answers `expect_status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// The healthy status of the `http` probe (default 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<u16>,
    /// The `http` probe is healthy only if its body is also an empty JSON
    /// array (`[]`); any element, or a body that is not a JSON array, fails.
    /// For alert APIs that answer 200 while alerts fire: Alertmanager's
    /// `/api/v2/alerts?active=true&silenced=false&inhibited=false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expect_empty_json_array: bool,
    /// Run this program (no shell); healthy when it exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// A check that takes longer fails (default 5 s).
    #[serde(
        default = "default_timeout",
        with = "crate::settings::duration",
        skip_serializing_if = "is_default_timeout"
    )]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

fn is_default_timeout(timeout: &Duration) -> bool {
    *timeout == default_timeout()
}

/// What one check does.
#[derive(Debug, Clone)]
enum Probe {
    Http {
        url: reqwest::Url,
        /// The URL as it may be printed: credentials masked.
        shown: String,
        expect: reqwest::StatusCode,
        /// Healthy only with an empty JSON array as the body, too.
        expect_empty_json_array: bool,
    },
    Command {
        argv: Vec<String>,
        runner: ProcessRunner,
    },
}

/// One stop condition, ready to run.
#[derive(Debug, Clone)]
pub(crate) struct StopCondition {
    name: String,
    probe: Probe,
    timeout: Duration,
}

/// Every stop condition of the policy, with the HTTP client they share.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopConditions {
    checks: Vec<StopCondition>,
    client: Option<reqwest::Client>,
}

impl StopConditions {
    /// Checks the settings; the error names the key at fault
    /// (`safety.stop_conditions[1].http`) and why.
    pub(crate) fn new(settings: &[StopConditionSettings]) -> Result<Self, (String, String)> {
        let mut checks = Vec::with_capacity(settings.len());
        for (index, entry) in settings.iter().enumerate() {
            let key = |field: &str| format!("safety.stop_conditions[{index}].{field}");
            if entry.name.trim().is_empty() || entry.name.chars().any(char::is_control) {
                return Err((key("name"), "must be a non-empty line of text".into()));
            }
            if entry.timeout.is_zero() || entry.timeout > crate::settings::duration::MAX {
                return Err((
                    key("timeout"),
                    "must be longer than 0s and at most 365 days".into(),
                ));
            }
            let probe = match (&entry.http, &entry.command) {
                (Some(url), None) => {
                    let parsed = reqwest::Url::parse(url)
                        .ok()
                        .filter(|url| matches!(url.scheme(), "http" | "https"))
                        .ok_or_else(|| {
                            (
                                key("http"),
                                format!("{:?} is not an http(s) URL", redact_url(url)),
                            )
                        })?;
                    let status = entry.expect_status.unwrap_or(200);
                    let expect = reqwest::StatusCode::from_u16(status)
                        .ok()
                        .filter(|_| (100..600).contains(&status))
                        .ok_or_else(|| {
                            (
                                key("expect_status"),
                                format!("{status} is not an HTTP status"),
                            )
                        })?;
                    Probe::Http {
                        shown: redact_url(url),
                        url: parsed,
                        expect,
                        expect_empty_json_array: entry.expect_empty_json_array,
                    }
                }
                (None, Some(argv)) => {
                    if argv.first().is_none_or(|program| program.is_empty()) {
                        return Err((key("command"), "must name a program first".into()));
                    }
                    if entry.expect_status.is_some() {
                        return Err((key("expect_status"), "applies to http checks only".into()));
                    }
                    if entry.expect_empty_json_array {
                        return Err((
                            key("expect_empty_json_array"),
                            "applies to http checks only".into(),
                        ));
                    }
                    let inherited: Vec<String> =
                        INHERITED.iter().map(|name| (*name).to_owned()).collect();
                    Probe::Command {
                        argv: argv.clone(),
                        runner: ProcessRunner::new(
                            None,
                            &inherited,
                            &[],
                            entry.timeout,
                            KEPT_OUTPUT,
                        ),
                    }
                }
                _ => {
                    return Err((
                        format!("safety.stop_conditions[{index}]"),
                        "set exactly one of http and command".into(),
                    ));
                }
            };
            checks.push(StopCondition {
                name: entry.name.clone(),
                probe,
                timeout: entry.timeout,
            });
        }
        let client = if checks
            .iter()
            .any(|check| matches!(check.probe, Probe::Http { .. }))
        {
            crate::restarter::http::install_crypto_provider();
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("mandrill/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|error| {
                    (
                        "safety.stop_conditions".to_owned(),
                        format!("cannot build the http client: {}", error.without_url()),
                    )
                })?;
            Some(client)
        } else {
            None
        };
        Ok(Self { checks, client })
    }

    /// Whether there is nothing to check.
    pub(crate) fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }

    /// The longest the checks can take: they run one after another, each
    /// bounded by its timeout (a command's, plus the wait for its killed
    /// process to be reaped). A claim's hold covers it, since they run
    /// between the claim and the restart.
    pub(crate) fn longest_run(&self) -> Duration {
        self.checks.iter().fold(Duration::ZERO, |total, check| {
            let reap = match check.probe {
                Probe::Command { .. } => crate::restarter::process::REAP_AFTER_KILL,
                Probe::Http { .. } => Duration::ZERO,
            };
            total.saturating_add(check.timeout.saturating_add(reap))
        })
    }

    /// Runs every check, one after another. `Ok` with each one's result
    /// in words, in the order they ran (what the request's story records):
    /// `"alerts" healthy (GET http://… answered 200)`. `Err` with the
    /// reason of the first that is not healthy, naming it, and the results
    /// of those that ran before it: `deferred by stop condition "alerts":
    /// GET http://… answered 503, expected 200; checked before it:
    /// "deploys" healthy ("check-deploys" exited with exit status: 0)`.
    pub(crate) async fn check(&self) -> Result<Vec<String>, String> {
        let mut healthy = Vec::with_capacity(self.checks.len());
        for check in &self.checks {
            match self.run(check).await {
                Ok(result) => healthy.push(format!("\"{}\" healthy ({result})", check.name)),
                Err(why) => {
                    let mut reason =
                        format!("deferred by stop condition \"{}\": {why}", check.name);
                    if !healthy.is_empty() {
                        reason.push_str(&format!("; checked before it: {}", healthy.join(", ")));
                    }
                    return Err(reason);
                }
            }
        }
        Ok(healthy)
    }

    /// One check: `Ok` with what made it healthy, else why it is not.
    async fn run(&self, check: &StopCondition) -> Result<String, String> {
        match &check.probe {
            Probe::Http {
                url,
                shown,
                expect,
                expect_empty_json_array,
            } => {
                let Some(client) = &self.client else {
                    return Err("no http client (should not happen)".into());
                };
                // The timeout covers the body too, when it is read.
                let probe = async {
                    let response = client.get(url.clone()).send().await.map_err(|error| {
                        format!("GET {shown} failed: {}", WithCauses(&error.without_url()))
                    })?;
                    if response.status() != *expect {
                        return Err(format!(
                            "GET {shown} answered {}, expected {}",
                            response.status().as_u16(),
                            expect.as_u16()
                        ));
                    }
                    let answered = format!("GET {shown} answered {}", expect.as_u16());
                    if *expect_empty_json_array {
                        empty_json_array(response)
                            .await
                            .map_err(|why| format!("GET {shown} {why}"))?;
                        return Ok(format!("{answered} and an empty JSON array"));
                    }
                    Ok(answered)
                };
                match tokio::time::timeout(check.timeout, probe).await {
                    Err(_elapsed) => Err(format!(
                        "GET {shown} did not answer within {}",
                        humantime::format_duration(check.timeout)
                    )),
                    Ok(answered) => answered,
                }
            }
            Probe::Command { argv, runner } => match runner.run(argv).await {
                Ok(finished) if finished.status.success() => {
                    Ok(format!("{:?} exited with {}", argv[0], finished.status))
                }
                Ok(finished) => {
                    // One line: the reason goes into a nack and a log field.
                    let stderr = finished.output.stderr.text();
                    let stderr = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
                    let mut why = format!("{:?} exited with {}", argv[0], finished.status);
                    if !stderr.is_empty() {
                        why.push_str(&format!(": {}", for_log(&stderr, 200)));
                    }
                    Err(why)
                }
                Err(error) => Err(WithCauses(&error).to_string()),
            },
        }
    }
}

/// Whether `response`'s body is an empty JSON array; else what it was.
async fn empty_json_array(mut response: reqwest::Response) -> Result<(), String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|error| {
        format!(
            "failed while sending its body: {}",
            WithCauses(&error.without_url())
        )
    })? {
        if body.len() + chunk.len() > MAX_CHECKED_BODY {
            return Err(format!(
                "answered more than {} KiB, expected an empty JSON array",
                MAX_CHECKED_BODY / 1024
            ));
        }
        body.extend_from_slice(&chunk);
    }
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Array(items)) if items.is_empty() => Ok(()),
        Ok(serde_json::Value::Array(items)) => Err(format!(
            "answered a JSON array of {} item{}, expected an empty one",
            items.len(),
            if items.len() == 1 { "" } else { "s" }
        )),
        Ok(_) | Err(_) => Err("answered no JSON array, expected an empty one".into()),
    }
}

#[cfg(test)]
mod tests;
