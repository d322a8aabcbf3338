//! The EC2 answers read as moto gave them (`testdata/`).

use super::*;
use crate::restarter::http::aws::Element;

const STATUS: &str = include_str!("testdata/describe_instance_status.xml");
const GROUPS: &str = include_str!("testdata/describe_auto_scaling_groups.xml");

#[test]
fn an_instance_is_recovered_when_running_with_both_statuses_ok() {
    let answer = Element::parse(STATUS).unwrap();
    assert!(instance_status_ok(&answer, "i-a8b9faa87f40d49d5").is_ok());
    let impaired = STATUS.replacen("<status>ok</status>", "<status>initializing</status>", 1);
    let seen = instance_status_ok(&Element::parse(&impaired).unwrap(), "i-a8b9faa87f40d49d5")
        .unwrap_err()
        .to_string();
    assert_eq!(
        seen,
        "i-a8b9faa87f40d49d5 is running, instance status initializing, system status ok"
    );
    let seen = instance_status_ok(&answer, "i-0000000000000000f").unwrap_err();
    assert!(seen.to_string().contains("no status"), "{seen}");
}

#[test]
fn a_group_is_recovered_at_its_desired_capacity_without_the_terminated_member() {
    let answer = Element::parse(GROUPS).unwrap();
    // Two in service, two desired, neither of them terminated.
    assert!(group_back_to_capacity(&answer, "api-asg", "i-0000000000000000f").is_ok());
    // The terminated instance still listed in service does not count.
    let seen = group_back_to_capacity(&answer, "api-asg", "i-1ede1b36cedc139c5").unwrap_err();
    assert_eq!(seen.to_string(), "api-asg has 1 of 2 instances in service");
    let pending = GROUPS.replacen("InService", "Pending", 1);
    let seen =
        group_back_to_capacity(&Element::parse(&pending).unwrap(), "api-asg", "i-x").unwrap_err();
    assert_eq!(seen.to_string(), "api-asg has 1 of 2 instances in service");
    assert!(group_back_to_capacity(&answer, "other", "i-x").is_err());
}

#[test]
fn only_instance_ids_are_acted_on() {
    assert!(is_instance_id("i-0abc1234def567890"));
    assert!(is_instance_id("i-1234abcd"));
    for name in [
        "web-1",
        "i-",
        "i-0ABC1234DEF567890",
        "i-0abc1234def56789",
        "x-1234abcd",
    ] {
        assert!(!is_instance_id(name), "{name}");
    }
}

#[test]
fn the_start_after_tag_is_written_and_removed_with_its_time() {
    assert_eq!(
        start_after_tag("i-1234abcd", "42"),
        [
            ("ResourceId.1".to_owned(), "i-1234abcd".to_owned()),
            ("Tag.1.Key".to_owned(), START_AFTER_TAG.to_owned()),
            ("Tag.1.Value".to_owned(), "42".to_owned()),
        ]
    );
}

#[test]
fn the_longest_restart_counts_every_call_try_backoff_and_wait() {
    let settings = Ec2Settings {
        action: Ec2Action::StopStart,
        stopped_for: Duration::from_secs(60),
        stop_timeout: Duration::from_secs(600),
        start_timeout: Duration::from_secs(300),
        poll_interval: Duration::from_secs(5),
        call_timeout: Duration::from_secs(20),
        ..Ec2Settings::default()
    };
    // One call: five tries of 20s, and 0.2 + 0.4 + 0.8 + 1.6s between them.
    let call = 5 * 20 + 3;
    // Seven calls: the look before, the tag, the stop, the start, the
    // untag, and the last look of each wait, past its timeout by a poll.
    assert_eq!(
        settings.longest_restart(),
        Duration::from_secs(7 * call + 600 + 5 + 60 + 300 + 5)
    );
    let reboot = Ec2Settings {
        action: Ec2Action::Reboot,
        ..settings.clone()
    };
    assert_eq!(reboot.longest_restart(), Duration::from_secs(call));
    let terminate = Ec2Settings {
        action: Ec2Action::Terminate,
        ..settings
    };
    assert_eq!(terminate.longest_restart(), Duration::from_secs(2 * call));
}
