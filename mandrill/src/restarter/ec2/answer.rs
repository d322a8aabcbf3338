//! What the `ec2` restarter reads in EC2's and Auto Scaling's answers:
//! pure, tested on answers moto gave (`testdata/`).

use std::collections::HashMap;

use super::Cause;
use crate::restarter::http::aws::Element;

/// `i-` and 8 or 17 lower-case hexadecimal digits.
pub(super) fn is_instance_id(name: &str) -> bool {
    name.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17) && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
    })
}

/// What `DescribeInstances` says of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Instance {
    /// `pending`, `running`, `stopping`, `stopped`, …
    pub state: String,
    /// Why it is in that state, when EC2 says (`Server.InsufficientInstanceCapacity: …`).
    pub reason: Option<String>,
    pub tags: HashMap<String, String>,
}

/// Each instance of a `DescribeInstances` answer, by id.
pub(super) fn instances(answer: &Element) -> HashMap<String, Instance> {
    let mut found = HashMap::new();
    for reservation in answer.items(&["reservationSet"]) {
        for instance in reservation.items(&["instancesSet"]) {
            let Some(id) = instance.text_at(&["instanceId"]) else {
                continue;
            };
            let state = instance
                .text_at(&["instanceState", "name"])
                .unwrap_or("unknown")
                .to_owned();
            let reason = instance
                .text_at(&["stateReason", "message"])
                .map(str::to_owned);
            let tags = instance
                .items(&["tagSet"])
                .filter_map(|tag| {
                    Some((
                        tag.text_at(&["key"])?.to_owned(),
                        tag.text_at(&["value"]).unwrap_or("").to_owned(),
                    ))
                })
                .collect();
            found.insert(
                id.to_owned(),
                Instance {
                    state,
                    reason,
                    tags,
                },
            );
        }
    }
    found
}

/// Whether `DescribeInstanceStatus` says `id` runs with its instance and
/// system status `ok`; else what it says.
pub(super) fn instance_status_ok(answer: &Element, id: &str) -> Result<(), Cause> {
    let Some(item) = answer
        .items(&["instanceStatusSet"])
        .find(|item| item.text_at(&["instanceId"]) == Some(id))
    else {
        return Err(format!("{id} has no status (not running)").into());
    };
    let state = item
        .text_at(&["instanceState", "name"])
        .unwrap_or("unknown");
    let instance = item
        .text_at(&["instanceStatus", "status"])
        .unwrap_or("unknown");
    let system = item
        .text_at(&["systemStatus", "status"])
        .unwrap_or("unknown");
    if state == "running" && instance == "ok" && system == "ok" {
        Ok(())
    } else {
        Err(format!("{id} is {state}, instance status {instance}, system status {system}").into())
    }
}

/// Whether `DescribeAutoScalingGroups` says `group` has its desired
/// capacity of healthy `InService` instances, `terminated` not among them.
pub(super) fn group_back_to_capacity(
    answer: &Element,
    group: &str,
    terminated: &str,
) -> Result<(), Cause> {
    let Some(found) = answer
        .items(&["DescribeAutoScalingGroupsResult", "AutoScalingGroups"])
        .find(|member| member.text_at(&["AutoScalingGroupName"]) == Some(group))
    else {
        return Err(format!("auto scaling group {group} is not found").into());
    };
    let desired: usize = found
        .text_at(&["DesiredCapacity"])
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    let in_service = found
        .items(&["Instances"])
        .filter(|instance| {
            instance.text_at(&["InstanceId"]) != Some(terminated)
                && instance.text_at(&["LifecycleState"]) == Some("InService")
                && instance.text_at(&["HealthStatus"]) == Some("Healthy")
        })
        .count();
    if in_service >= desired {
        Ok(())
    } else {
        Err(format!("{group} has {in_service} of {desired} instances in service").into())
    }
}
