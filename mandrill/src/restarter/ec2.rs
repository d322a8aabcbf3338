//! The `ec2` restarter: a restart of an instance (named by its id) is an
//! EC2 action: `reboot` (`RebootInstances`), `stop-start` of a running
//! instance (`StopInstances`, wait for `stopped`, stay stopped for
//! `stopped_for`, `StartInstances`) or `terminate` (`TerminateInstanceInAutoScalingGroup`
//! keeping the desired capacity, only for an Auto Scaling group's member).
//! Calls go through `http/aws.rs`, which retries throttling. A call that
//! acts on the instance is never sent twice when AWS may have done it: its
//! failure is then [`RestartError::OutcomeUnknown`], so that the claim
//! keeps holding the host rather than a retry restarting it again.
//!
//! A stop-start is durable: before the stop is sent, the instance is tagged
//! `mandrill:start-after` with the time by which it must be running again,
//! so the record lives with the instance, where every mandrill that
//! restarts this fleet sees it whatever its store. [`Ec2Restarter::start_left_stopped`]
//! (a companion of the service, at start-up and then periodically) starts
//! any instance still stopped past that time, and removes the tag: a
//! mandrill killed between the stop and the start leaves no instance
//! stopped for longer than `stopped_for` + `stop_timeout`.
//!
//! `verify.probe = "ec2"` asks [`Ec2Restarter::recovered`]: a rebooted or
//! started instance is recovered when it runs and `DescribeInstanceStatus`
//! says its instance and system status are `ok`; a terminated one when its
//! group is back at its desired capacity of healthy `InService` instances.
//!
//! One piece past 400 lines: the three actions, the companion that
//! finishes a stop-start a crash cut short, and the probe share the
//! clients and the record of terminations.

mod answer;
mod settings;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::http::aws::{AwsClient, AwsError, Service};
use super::{Cause, Reservation, RestartError, Restarter, SettingError};
use crate::causes::WithCauses;
use crate::domain::{Hostname, RestartRequest, Restarted};

use answer::{Instance, group_back_to_capacity, instance_status_ok, instances, is_instance_id};
pub(crate) use settings::{Ec2Action, Ec2Settings};

const SECTION: &str = "restarter.ec2";

/// The tag a stop-start puts on an instance before stopping it: the Unix
/// time (seconds) after which any mandrill starts it if it is still
/// stopped.
pub(crate) const START_AFTER_TAG: &str = "mandrill:start-after";

/// How often the companion looks for instances a stop-start left stopped,
/// at the longest.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// How soon the companion looks again at an instance it started: a start
/// AWS accepted may still fall back to stopped (no capacity, a key its
/// volumes cannot be decrypted with), and the tag stays until the
/// instance is seen running.
const AFTER_START: Duration = Duration::from_secs(10);

/// Restarts EC2 instances. Build it with [`Ec2Restarter::new`].
#[derive(Debug)]
pub(crate) struct Ec2Restarter {
    ec2: AwsClient,
    autoscaling: AwsClient,
    settings: Ec2Settings,
    /// The Auto Scaling group of each instance terminated and not yet
    /// judged recovered, for the probe: the instance is gone from the
    /// group once terminated.
    terminated: Mutex<HashMap<String, String>>,
}

impl Ec2Restarter {
    /// Validates `settings` and builds the clients. Errors name the key.
    pub(crate) fn new(settings: &Ec2Settings) -> Result<Self, SettingError> {
        settings
            .validate()
            .map_err(|(key, why)| SettingError::new(format!("{SECTION}.{key}"), why))?;
        super::http::aws::check_credentials_source()
            .map_err(|why| SettingError::new(SECTION, why))?;
        // Validated: a region is there.
        let region = settings.region().unwrap_or_default();
        let client = |service, key: &str, endpoint: Option<&String>| {
            AwsClient::new(
                service,
                &region,
                endpoint.map(String::as_str),
                settings.call_timeout,
            )
            .map_err(|why| SettingError::new(format!("{SECTION}.{key}"), why))
        };
        Ok(Self {
            ec2: client(Service::Ec2, "endpoint_url", settings.endpoint_url.as_ref())?,
            autoscaling: client(
                Service::AutoScaling,
                "autoscaling_endpoint_url",
                settings
                    .autoscaling_endpoint_url
                    .as_ref()
                    .or(settings.endpoint_url.as_ref()),
            )?,
            settings: settings.clone(),
            terminated: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the credentials chain gives credentials now (fetching
    /// temporary ones from STS or the instance metadata service): for
    /// start-up, which [`Ec2Restarter::new`] cannot do without a network call.
    pub(crate) async fn check_credentials(&self) -> Result<(), String> {
        super::http::aws::check_credentials(&self.settings.region().unwrap_or_default()).await
    }

    /// Whether stop-starts may leave instances to start after a crash (the
    /// companion is needed).
    pub(crate) fn stops_instances(&self) -> bool {
        self.settings.action == Ec2Action::StopStart
    }

    async fn reboot(&self, id: &str) -> Result<String, AwsError> {
        self.ec2.act("RebootInstances", &instance_ids(id)).await?;
        Ok(format!("RebootInstances {id} accepted"))
    }

    /// Tag, stop, wait for `stopped`, wait `stopped_for`, start, wait for
    /// `running`, untag. A failure once the stop may have been done leaves
    /// the tag, so the companion starts it; once AWS accepted the stop, a
    /// failure is never retried: the instance is unrecovered (or the
    /// outcome unknown, where AWS may have started it).
    async fn stop_start(&self, host: &Hostname, id: &str) -> Result<String, RestartError> {
        self.check_stop_start(host, id).await?;
        let due = (unix_now()
            + self.settings.stopped_for.as_secs()
            + self.settings.stop_timeout.as_secs())
        .to_string();
        self.ec2
            .call("CreateTags", &start_after_tag(id, &due))
            .await
            .map_err(|e| failure(host, "CreateTags before the stop", e))?;
        if let Err(error) = self.ec2.act("StopInstances", &instance_ids(id)).await {
            // Only a refusal says nothing stopped. Any other failure (no
            // answer, a 5xx) may hide a stop AWS did: the tag stays, so
            // that the companion starts the instance, or removes the tag
            // from a running one, once its time passes.
            if error.is_refusal() {
                let _ = self
                    .ec2
                    .call("DeleteTags", &start_after_tag(id, &due))
                    .await;
            }
            return Err(act_failure(host, "StopInstances", error));
        }
        let stopped = tokio::time::Instant::now();
        info!(instance = id, "stopped; waiting for it to be stopped");
        self.wait_until_stopped(host, id, stopped).await?;
        tokio::time::sleep(self.settings.stopped_for).await;
        if let Err(error) = self.ec2.act("StartInstances", &instance_ids(id)).await {
            return Err(if error.may_have_been_done() {
                act_failure(host, "StartInstances (the companion will start it)", error)
            } else {
                left_stopped(host, stopped, format!("StartInstances {id}"), error)
            });
        }
        let output = format!(
            "StopInstances {id}, stopped for {}, StartInstances accepted",
            humantime::format_duration(self.settings.stopped_for)
        );
        // An accepted start is not a running instance: it may fall back
        // to stopped, and the tag is what gets it started then.
        self.wait_until_running(host, id, &output).await?;
        if let Err(error) = self
            .ec2
            .call("DeleteTags", &start_after_tag(id, &due))
            .await
        {
            warn!(instance = id, error = %WithCauses(&error), "the start-after tag stays on a started instance; the companion removes it");
        }
        Ok(format!("{output}, running"))
    }

    /// Refuses, for good, an instance a stop-start must leave alone: one
    /// stopped by someone else, which `StopInstances` would leave as it is
    /// and `StartInstances` would power on, or one on its way up or down.
    /// A stopped or stopping instance with the start-after tag is one whose
    /// stop-start was cut short (a crash, a redelivery): this one ends it.
    async fn check_stop_start(&self, host: &Hostname, id: &str) -> Result<(), RestartError> {
        let states = self
            .states(&[("InstanceId.1".to_owned(), id.to_owned())])
            .await
            .map_err(|e| failure(host, "DescribeInstances before the stop", e))?;
        let Some(instance) = states.get(id) else {
            return Err(RestartError::permanent(
                host,
                format!("{id} is not in DescribeInstances' answer"),
            ));
        };
        let ours = instance.tags.contains_key(START_AFTER_TAG);
        let state = &instance.state;
        match state.as_str() {
            "running" => Ok(()),
            "stopped" | "stopping" if ours => Ok(()),
            "stopped" | "stopping" => Err(RestartError::permanent(
                host,
                format!(
                    "{id} is {state} without the {START_AFTER_TAG} tag: stopped by someone \
                     else, and a stop-start would start it"
                ),
            )),
            _ => Err(RestartError::permanent(
                host,
                format!("{id} is {state}: a stop-start stops only a running instance"),
            )),
        }
    }

    async fn wait_until_stopped(
        &self,
        host: &Hostname,
        id: &str,
        stopped: tokio::time::Instant,
    ) -> Result<(), RestartError> {
        let deadline = tokio::time::Instant::now() + self.settings.stop_timeout;
        loop {
            let states = self
                .states(&[("InstanceId.1".to_owned(), id.to_owned())])
                .await
                .map_err(|e| left_stopped(host, stopped, "DescribeInstances while stopping", e))?;
            let state = states.get(id).map(|instance| instance.state.as_str());
            if state == Some("stopped") {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RestartError::Unrecovered {
                    host: host.clone(),
                    after: stopped.elapsed(),
                    cause: Cause::from(format!(
                        "{id} was not stopped within {} of StopInstances being accepted \
                         (state {}); its start-after tag stays, so the companion starts it",
                        humantime::format_duration(self.settings.stop_timeout),
                        state.unwrap_or("unknown")
                    )),
                    output: None,
                });
            }
            tokio::time::sleep(self.settings.poll_interval).await;
        }
    }

    /// Waits for `id`, whose start was accepted, to run. One seen
    /// `pending` then `stopped` fell back; one not running within
    /// `start_timeout` did not start. Either is a host that did not come
    /// back: [`RestartError::Unrecovered`], the tag left on it for the
    /// companion. `stopped` before `pending` is EC2's reads not showing
    /// the start yet.
    async fn wait_until_running(
        &self,
        host: &Hostname,
        id: &str,
        output: &str,
    ) -> Result<(), RestartError> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.settings.start_timeout;
        let mut seen_pending = false;
        loop {
            // The start was sent: were the worker to retry, it would
            // stop the instance again.
            let mut states = self
                .states(&[("InstanceId.1".to_owned(), id.to_owned())])
                .await
                .map_err(|error| RestartError::OutcomeUnknown {
                    host: host.clone(),
                    cause: Cause::new(
                        "DescribeInstances once StartInstances was accepted (the companion \
                         starts it if it is still stopped)",
                        error,
                    ),
                })?;
            let instance = states.remove(id);
            let state = instance.as_ref().map_or("unknown", |i| i.state.as_str());
            let fell_back = state == "stopped" && seen_pending;
            match state {
                "running" => return Ok(()),
                "pending" => seen_pending = true,
                _ => {}
            }
            if fell_back || tokio::time::Instant::now() >= deadline {
                let reason = instance
                    .as_ref()
                    .and_then(|i| i.reason.as_ref())
                    .map(|reason| format!(" ({reason})"))
                    .unwrap_or_default();
                let seen = if fell_back {
                    format!("{id} fell back to {state}{reason} after StartInstances was accepted")
                } else {
                    format!(
                        "{id} was not running {} after StartInstances was accepted (state \
                         {state}{reason})",
                        humantime::format_duration(self.settings.start_timeout)
                    )
                };
                return Err(RestartError::Unrecovered {
                    host: host.clone(),
                    after: started.elapsed(),
                    cause: Cause::from(format!(
                        "{seen}; its start-after tag stays, so the companion starts it"
                    )),
                    output: Some(output.to_owned()),
                });
            }
            tokio::time::sleep(self.settings.poll_interval).await;
        }
    }

    /// Terminates `id` in its Auto Scaling group, keeping the group's
    /// desired capacity; refuses an instance in no group.
    async fn terminate(&self, host: &Hostname, id: &str) -> Result<String, RestartError> {
        let answer = self
            .autoscaling
            .call(
                "DescribeAutoScalingInstances",
                &[("InstanceIds.member.1".to_owned(), id.to_owned())],
            )
            .await
            .map_err(|e| failure(host, "DescribeAutoScalingInstances", e))?;
        let Some(group) = answer
            .items(&["DescribeAutoScalingInstancesResult", "AutoScalingInstances"])
            .find(|member| member.text_at(&["InstanceId"]) == Some(id))
            .and_then(|member| member.text_at(&["AutoScalingGroupName"]))
            .map(str::to_owned)
        else {
            return Err(RestartError::permanent(
                host,
                format!(
                    "{id} is in no auto scaling group: restarter.ec2.action = \"terminate\" \
                     terminates only a group's members, which the group replaces"
                ),
            ));
        };
        self.terminated
            .lock()
            .expect("the map is never left poisoned")
            .insert(id.to_owned(), group.clone());
        self.autoscaling
            .act(
                "TerminateInstanceInAutoScalingGroup",
                &[
                    ("InstanceId".to_owned(), id.to_owned()),
                    (
                        "ShouldDecrementDesiredCapacity".to_owned(),
                        "false".to_owned(),
                    ),
                ],
            )
            .await
            .map_err(|e| act_failure(host, "TerminateInstanceInAutoScalingGroup", e))?;
        Ok(format!(
            "TerminateInstanceInAutoScalingGroup {id} in {group} accepted (desired capacity kept)"
        ))
    }

    /// Each instance's state and tags (`DescribeInstances` with `params`),
    /// by id.
    async fn states(
        &self,
        params: &[(String, String)],
    ) -> Result<HashMap<String, Instance>, AwsError> {
        let answer = self.ec2.call("DescribeInstances", params).await?;
        Ok(instances(&answer))
    }

    /// `Ok` when `request`'s instance has recovered from the action, else
    /// what was seen (`verify.probe = "ec2"`).
    pub(crate) async fn recovered(&self, request: &RestartRequest) -> Result<(), Cause> {
        let id = request.instance_name.as_str();
        match self.settings.action {
            Ec2Action::Reboot | Ec2Action::StopStart => {
                let answer = self
                    .ec2
                    .call(
                        "DescribeInstanceStatus",
                        &[
                            ("InstanceId.1".to_owned(), id.to_owned()),
                            ("IncludeAllInstances".to_owned(), "true".to_owned()),
                        ],
                    )
                    .await
                    .map_err(Cause::from_error)?;
                instance_status_ok(&answer, id)
            }
            Ec2Action::Terminate => {
                let group = self
                    .terminated
                    .lock()
                    .expect("the map is never left poisoned")
                    .get(id)
                    .cloned()
                    .ok_or_else(|| {
                        Cause::from(format!("{id} was not terminated by this mandrill"))
                    })?;
                let answer = self
                    .autoscaling
                    .call(
                        "DescribeAutoScalingGroups",
                        &[("AutoScalingGroupNames.member.1".to_owned(), group.clone())],
                    )
                    .await
                    .map_err(Cause::from_error)?;
                group_back_to_capacity(&answer, &group, id)?;
                self.terminated
                    .lock()
                    .expect("the map is never left poisoned")
                    .remove(id);
                Ok(())
            }
        }
    }

    /// Starts every instance a stop-start left stopped past its
    /// start-after time, and removes the tag from those running again.
    /// Returns when the next such time falls, if one is pending. One
    /// instance that fails is logged and left to the next sweep: the
    /// others are still finished.
    async fn sweep(&self) -> Result<Option<u64>, AwsError> {
        let found = self
            .states(&[
                ("Filter.1.Name".to_owned(), "tag-key".to_owned()),
                ("Filter.1.Value.1".to_owned(), START_AFTER_TAG.to_owned()),
            ])
            .await?;
        let now = unix_now();
        let mut next = None;
        let mut tagged: Vec<(u64, String, Instance)> = found
            .into_iter()
            .map(|(id, instance)| {
                let due = instance
                    .tags
                    .get(START_AFTER_TAG)
                    .and_then(|value| value.parse::<u64>().ok())
                    .unwrap_or(0);
                (due, id, instance)
            })
            .collect();
        // The longest overdue first.
        tagged.sort_by(|(a_due, a_id, _), (b_due, b_id, _)| (a_due, a_id).cmp(&(b_due, b_id)));
        for (due, id, instance) in tagged {
            let again = if due > now {
                Some(due)
            } else {
                match self.finish_stop_start(&id, &instance).await {
                    Ok(again) => again.map(|after| now + after.as_secs()),
                    Err(error) => {
                        warn!(instance = %id, error = %WithCauses(&error), "cannot finish a stop-start left unfinished; the next sweep tries again");
                        None
                    }
                }
            };
            if let Some(again) = again {
                next = Some(next.map_or(again, |next: u64| next.min(again)));
            }
        }
        Ok(next)
    }

    /// Starts `id`, past its start-after time, if it is stopped, and
    /// removes the tag it has from a running one. When it is stopped,
    /// stopping or pending, the tag stays and the answer is how soon to
    /// look at it again.
    async fn finish_stop_start(
        &self,
        id: &str,
        instance: &Instance,
    ) -> Result<Option<Duration>, AwsError> {
        match instance.state.as_str() {
            // An accepted start is not a running instance: it may fall
            // back to stopped, and the tag is what gets it started again.
            "stopped" => {
                self.ec2.act("StartInstances", &instance_ids(id)).await?;
                warn!(instance = %id, "started an instance a stop-start left stopped (the mandrill that stopped it did not start it in time)");
                return Ok(Some(AFTER_START));
            }
            // Still on its way down: started at the next sweep. Or on its
            // way up, and it may fall back to stopped: the tag goes once
            // it runs.
            "stopping" | "pending" => return Ok(Some(SWEEP_INTERVAL)),
            _ => {}
        }
        // The value read: a tag a new stop-start wrote since is not this
        // one, and stays.
        let value = instance
            .tags
            .get(START_AFTER_TAG)
            .map_or("", String::as_str);
        self.ec2
            .call("DeleteTags", &start_after_tag(id, value))
            .await?;
        Ok(None)
    }

    /// The companion: [`Self::sweep`] at once, then again whenever a
    /// start-after time falls or [`SWEEP_INTERVAL`] passes, until `stop`.
    pub(crate) async fn start_left_stopped(&self, stop: CancellationToken) {
        loop {
            let wait = match self.sweep().await {
                Ok(Some(due)) => {
                    Duration::from_secs(due.saturating_sub(unix_now()) + 1).min(SWEEP_INTERVAL)
                }
                Ok(None) => SWEEP_INTERVAL,
                Err(error) => {
                    warn!(error = %WithCauses(&error), "cannot look for instances a stop-start left stopped");
                    SWEEP_INTERVAL
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

#[async_trait]
impl Restarter for Ec2Restarter {
    fn describe(&self, request: &RestartRequest) -> String {
        let id = request.instance_name.as_str();
        match self.settings.action {
            Ec2Action::Reboot => format!("ec2 RebootInstances {id}"),
            Ec2Action::StopStart => format!(
                "ec2 StopInstances {id}, then StartInstances after {} stopped",
                humantime::format_duration(self.settings.stopped_for)
            ),
            Ec2Action::Terminate => format!(
                "autoscaling TerminateInstanceInAutoScalingGroup {id} (desired capacity kept; \
                 refused outside a group)"
            ),
        }
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        _reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let id = request.instance_name.as_str();
        if !is_instance_id(id) {
            return Err(RestartError::permanent(
                &request.hostname,
                format!("{id} is not an EC2 instance id (i- and 8 or 17 hexadecimal digits)"),
            ));
        }
        let host = &request.hostname;
        let output = match self.settings.action {
            Ec2Action::Reboot => self
                .reboot(id)
                .await
                .map_err(|e| act_failure(host, "RebootInstances", e))?,
            Ec2Action::StopStart => self.stop_start(host, id).await?,
            Ec2Action::Terminate => self.terminate(host, id).await?,
        };
        Ok(Restarted {
            recovered_after: None,
            output: Some(output),
        })
    }
}

/// An AWS error as a restart's: transient ones (throttling past the
/// tries, 5xx, a connection) are retried by the worker, the rest (an
/// unknown instance, a missing permission: AWS's code is in the message)
/// are permanent.
fn failure(host: &Hostname, what: &str, error: AwsError) -> RestartError {
    let transient = error.is_transient();
    let cause = Cause::new(what.to_owned(), error);
    if transient {
        RestartError::failed(host, cause)
    } else {
        RestartError::permanent(host, cause)
    }
}

/// A failure once AWS accepted the stop (`stopped`: when): the restart
/// was issued and the instance is not back. Neither retried nor recorded
/// as refused, whatever AWS answered: a retry would stop it again and put
/// its start off, a refusal would say nothing was done. Its start-after tag
/// stays, so the companion starts it.
fn left_stopped(
    host: &Hostname,
    stopped: tokio::time::Instant,
    what: impl Into<String>,
    error: AwsError,
) -> RestartError {
    RestartError::Unrecovered {
        host: host.clone(),
        after: stopped.elapsed(),
        cause: Cause::new(
            format!(
                "{} after StopInstances was accepted; its start-after tag stays, so the \
                 companion starts it",
                what.into()
            ),
            error,
        ),
        output: None,
    }
}

/// An AWS error of a call that acts on the instance: as [`failure`], but
/// one after which AWS may have acted (no answer, a late or unreadable
/// one, a 5xx) is [`RestartError::OutcomeUnknown`]. Retrying it could
/// restart the host a second time.
fn act_failure(host: &Hostname, what: &str, error: AwsError) -> RestartError {
    if error.may_have_been_done() {
        RestartError::OutcomeUnknown {
            host: host.clone(),
            cause: Cause::new(format!("{what}: AWS may have done it"), error),
        }
    } else {
        failure(host, what, error)
    }
}

fn instance_ids(id: &str) -> Vec<(String, String)> {
    vec![("InstanceId.1".to_owned(), id.to_owned())]
}

/// `CreateTags` or `DeleteTags` of the start-after tag on `id` with
/// `value`: AWS deletes a tag only if its value is still that one.
fn start_after_tag(id: &str, value: &str) -> Vec<(String, String)> {
    vec![
        ("ResourceId.1".to_owned(), id.to_owned()),
        ("Tag.1.Key".to_owned(), START_AFTER_TAG.to_owned()),
        ("Tag.1.Value".to_owned(), value.to_owned()),
    ]
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests;
