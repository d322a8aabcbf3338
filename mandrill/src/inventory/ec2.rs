//! EC2's `DescribeInstances` answer (its pages, as XML) as an inventory.
//! Pure: `source.rs` makes the calls. An instance's name is its id, its
//! group the `group_tag` tag's value, else its Auto Scaling group's name
//! (the `aws:autoscaling:groupName` tag AWS puts on every member), else
//! none; its zone its availability zone; its address its private IP. Tags
//! become labels only when `label_tags` names them (tags hold secrets
//! too); the instance's state and Auto Scaling group are always labels.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Format, Host, Inventory, Shared, host};
use crate::domain::Reach;
use crate::restarter::http::aws::Element;

/// The tag AWS puts on every instance an Auto Scaling group runs.
pub(crate) const AUTO_SCALING_TAG: &str = "aws:autoscaling:groupName";
/// The label showing an instance's Auto Scaling group.
pub(crate) const AUTO_SCALING_LABEL: &str = "auto_scaling_group";

/// What the parser needs beyond the answer.
#[derive(Debug, Clone)]
pub(crate) struct Ec2Keys<'a> {
    /// The tag holding an instance's group.
    pub group_tag: &'a str,
    /// The tags shown as labels.
    pub label_tags: &'a [String],
}

/// The token of the next page, if the answer has one.
pub(crate) fn next_token(page: &Element) -> Option<String> {
    page.text_at(&["nextToken"]).map(str::to_owned)
}

/// The inventory of every instance on `pages`.
pub(crate) fn parse(pages: &[Element], keys: &Ec2Keys<'_>) -> Result<Inventory, String> {
    let mut hosts = Vec::new();
    let mut skipped = Vec::new();
    let mut shared = Shared::default();
    for page in pages {
        if page.name != "DescribeInstancesResponse" {
            return Err(format!(
                "a {} where DescribeInstancesResponse was expected",
                page.name
            ));
        }
        for reservation in page.items(&["reservationSet"]) {
            for instance in reservation.items(&["instancesSet"]) {
                match instance_host(instance, keys, &mut shared)? {
                    Some(host) => hosts.push(Arc::new(host)),
                    None => {
                        skipped.push(instance.text_at(&["instanceId"]).unwrap_or("?").to_owned())
                    }
                }
            }
        }
    }
    Inventory::from_hosts(hosts, skipped, Format::Ec2)
}

fn instance_host(
    instance: &Element,
    keys: &Ec2Keys<'_>,
    shared: &mut Shared,
) -> Result<Option<Host>, String> {
    let Some(id) = instance.text_at(&["instanceId"]) else {
        return Err("an instance without an instanceId".into());
    };
    let tags: BTreeMap<&str, &str> = instance
        .items(&["tagSet"])
        .filter_map(|tag| {
            Some((
                tag.text_at(&["key"])?,
                tag.text_at(&["value"]).unwrap_or(""),
            ))
        })
        .collect();
    let auto_scaling_group = tags.get(AUTO_SCALING_TAG).copied();
    let mut labels = BTreeMap::new();
    for key in keys.label_tags {
        if let Some(value) = tags.get(key.as_str()) {
            labels.insert(key.clone(), (*value).to_owned());
        }
    }
    if let Some(state) = instance.text_at(&["instanceState", "name"]) {
        labels.insert("state".to_owned(), state.to_owned());
    }
    if let Some(group) = auto_scaling_group {
        labels.insert(AUTO_SCALING_LABEL.to_owned(), group.to_owned());
    }
    let group = tags
        .get(keys.group_tag)
        .or(auto_scaling_group.as_ref())
        .copied();
    let reach = Reach {
        address: instance.text_at(&["privateIpAddress"]).map(str::to_owned),
        port: None,
        user: None,
    };
    let zone = instance.text_at(&["placement", "availabilityZone"]);
    let untagged = group.is_none();
    let built = match host(id, group, reach.clone(), zone, labels.clone(), shared) {
        // A tag or group name no store or label could carry: the instance
        // stays listed, without a group, so that requests for it are
        // denied saying why, and the rest of the fleet is read.
        Err(bad) if bad.field == "group" => {
            host(id, None, reach, zone, labels, shared).map(|host| {
                host.map(|host| Host {
                    no_group: Some(format!("its group {}", bad.why)),
                    ..host
                })
            })
        }
        other => other.map(|host| {
            host.map(|host| Host {
                no_group: untagged.then(|| {
                    format!(
                        "it has no {} tag and is in no auto scaling group",
                        keys.group_tag
                    )
                }),
                ..host
            })
        }),
    };
    built.map_err(|bad| format!("instance {id}: {} {}", bad.field, bad.why))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("testdata/ec2_describe_instances.xml");

    /// The answer moto gave for two tagged `web` instances (one stopped),
    /// one tagged `chaos` alone, and one member of the `api-asg` group.
    #[test]
    fn instances_take_their_group_from_the_tag_else_their_auto_scaling_group() {
        let page = Element::parse(FIXTURE).unwrap();
        let labels = ["team".to_owned()];
        let keys = Ec2Keys {
            group_tag: "chaos-group",
            label_tags: &labels,
        };
        let inventory = parse(&[page], &keys).unwrap();
        assert_eq!(inventory.format, Format::Ec2);
        assert_eq!(inventory.len(), 4);
        let web: Vec<_> = inventory
            .hosts()
            .into_iter()
            .filter(|host| host.group.as_deref() == Some("web"))
            .collect();
        assert_eq!(web.len(), 2);
        assert!(
            web.iter()
                .all(|host| host.zone.as_deref() == Some("us-east-1a"))
        );
        assert!(
            web.iter()
                .all(|host| host.labels.get("team").map(String::as_str) == Some("payments"))
        );
        let states: Vec<&str> = web
            .iter()
            .map(|host| host.labels["state"].as_str())
            .collect();
        assert!(
            states.contains(&"stopped") && states.contains(&"running"),
            "{states:?}"
        );
        assert!(web.iter().all(|host| {
            host.reach
                .address
                .as_deref()
                .is_some_and(|a| a.starts_with("10."))
        }));
        let member = inventory
            .hosts()
            .into_iter()
            .find(|host| host.group.as_deref() == Some("api-asg"))
            .expect("the auto scaling group's member");
        assert_eq!(member.labels[AUTO_SCALING_LABEL], "api-asg");
        assert_eq!(member.zone.as_deref(), Some("us-east-1b"));
        let lone = inventory
            .hosts()
            .into_iter()
            .find(|host| host.group.is_none())
            .expect("the instance with no group");
        assert_eq!(
            lone.no_group.as_deref(),
            Some("it has no chaos-group tag and is in no auto scaling group")
        );
        assert!(lone.name.starts_with("i-"));
        let shown = serde_json::to_string(&inventory.hosts()).unwrap();
        assert!(
            !shown.contains("hunter2"),
            "a tag not named is never shown: {shown}"
        );
        assert_eq!(inventory.groups().get("web"), Some(&2));
    }

    #[test]
    fn a_group_tag_no_store_could_keep_leaves_that_instance_without_a_group() {
        let text = FIXTURE.replacen("<value>web</value>", "<value>web tier/ä</value>", 1);
        let keys = Ec2Keys {
            group_tag: "chaos-group",
            label_tags: &[],
        };
        let inventory = parse(&[Element::parse(&text).unwrap()], &keys).unwrap();
        assert_eq!(inventory.len(), 4);
        assert_eq!(inventory.groups().get("web"), Some(&1));
        let odd = inventory
            .hosts()
            .into_iter()
            .find(|host| {
                host.no_group
                    .as_deref()
                    .is_some_and(|why| why.starts_with("its group"))
            })
            .expect("the instance with the odd tag");
        assert!(odd.group.is_none());
    }

    #[test]
    fn an_answer_that_is_not_describe_instances_is_refused() {
        let other = Element::parse("<DescribeTagsResponse/>").unwrap();
        let keys = Ec2Keys {
            group_tag: "chaos-group",
            label_tags: &[],
        };
        assert!(parse(&[other], &keys).is_err());
        let page = Element::parse(
            "<DescribeInstancesResponse><reservationSet/><nextToken>abc</nextToken></DescribeInstancesResponse>",
        )
        .unwrap();
        assert_eq!(next_token(&page).as_deref(), Some("abc"));
    }
}
