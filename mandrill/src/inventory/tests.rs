//! Each parser on its format, and the format detection.

use super::*;

fn parse(text: &str) -> Inventory {
    Inventory::parse(text, false, &Keys::default()).unwrap()
}

#[test]
fn mandrills_toml_lists_hosts_with_group_zone_and_reach() {
    let text = r#"
[[hosts]]
name = "cattle-a1"
group = "cattle"
address = "10.0.0.1"
port = 2222
user = "ops"
zone = "eu-1"
labels = { rack = "r7" }

[[hosts]]
name = "cattle-a2"
group = "cattle"
"#;
    let inventory = Inventory::parse(text, true, &Keys::default()).unwrap();
    assert_eq!(inventory.format, Format::Mandrill);
    let a1 = inventory.host("cattle-a1").unwrap();
    assert_eq!(a1.group.as_deref(), Some("cattle"));
    assert_eq!(a1.zone.as_deref(), Some("eu-1"));
    assert_eq!(a1.reach.address.as_deref(), Some("10.0.0.1"));
    assert_eq!(a1.reach.port, Some(2222));
    assert_eq!(a1.reach.user.as_deref(), Some("ops"));
    assert_eq!(a1.labels["rack"], "r7");
    assert_eq!(inventory.group_size("cattle"), Some(2));
    assert_eq!(inventory.zones()["eu-1"], 1);
    // TOML is also recognised without the hint, when it is not JSON.
    assert_eq!(parse(text).len(), 2);
}

#[test]
fn mandrills_json_and_its_refusals_name_the_entry() {
    let inventory = parse(r#"{"hosts": [{"name": "web-1", "group": "web"}]}"#);
    assert_eq!(
        inventory.host("web-1").unwrap().group.as_deref(),
        Some("web")
    );
    let refuse = |text: &str| Inventory::parse(text, false, &Keys::default()).unwrap_err();
    let twice = refuse(
        r#"{"hosts": [{"name": "web-1", "group": "web"}, {"name": "web-1", "group": "db"}]}"#,
    );
    assert!(twice.contains("web-1 is listed twice"), "{twice}");
    let no_group = refuse(r#"{"hosts": [{"name": "web-1"}]}"#);
    assert!(no_group.contains("group"), "{no_group}");
    let bad_name = refuse(r#"{"hosts": [{"name": "Web 1", "group": "web"}]}"#);
    assert!(bad_name.contains("hosts[0]"), "{bad_name}");
    let flag =
        refuse(r#"{"hosts": [{"name": "web-1", "group": "web", "address": "-oProxyCommand=x"}]}"#);
    assert!(flag.contains("address"), "{flag}");
    let unknown = refuse(r#"{"hosts": [{"name": "web-1", "group": "web", "grup": "x"}]}"#);
    assert!(unknown.contains("grup"), "{unknown}");
    let neither = refuse(r#"{"servers": []}"#);
    assert!(neither.contains("neither"), "{neither}");
}

/// As `ansible-inventory -i hosts.ini --list` prints it.
const ANSIBLE: &str = r#"{
    "_meta": {"hostvars": {
        "cattle-a1": {"ansible_host": "127.0.0.1", "ansible_port": 2222, "ansible_user": "ops", "zone": "eu-1", "rack": "r7"},
        "cattle-a2": {"ansible_port": "22"},
        "db-1": {},
        "lonely-1": {},
        "10.0.0.9": {}
    }},
    "all": {"children": ["ungrouped", "cattle", "stateful"]},
    "cattle": {"hosts": ["cattle-a1", "cattle-a2"], "children": ["cattle_eu"]},
    "cattle_eu": {"hosts": ["cattle-a1"]},
    "stateful": {"children": ["db", "cache"]},
    "db": {"hosts": ["db-1"]},
    "cache": {"hosts": ["db-1"]},
    "ungrouped": {"hosts": ["lonely-1", "10.0.0.9"]}
}"#;

#[test]
fn ansible_hosts_take_their_most_specific_group_and_ties_have_none() {
    let inventory = parse(ANSIBLE);
    assert_eq!(inventory.format, Format::Ansible);
    let a1 = inventory.host("cattle-a1").unwrap();
    assert_eq!(a1.group.as_deref(), Some("cattle_eu"), "deeper than cattle");
    assert_eq!(a1.reach.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(a1.reach.port, Some(2222));
    assert_eq!(a1.reach.user.as_deref(), Some("ops"));
    assert_eq!(a1.zone.as_deref(), Some("eu-1"));
    let a2 = inventory.host("cattle-a2").unwrap();
    assert_eq!(a2.group.as_deref(), Some("cattle"));
    assert_eq!(a2.reach.port, Some(22), "a port given as text");
    let db = inventory.host("db-1").unwrap();
    assert_eq!(db.group, None, "db and cache are equally specific");
    let why = db.no_group.as_deref().unwrap();
    assert!(why.contains("cache, db"), "{why}");
    let lonely = inventory.host("lonely-1").unwrap();
    assert_eq!(lonely.group, None);
    assert!(lonely.no_group.as_deref().unwrap().contains("ungrouped"));
    assert_eq!(inventory.skipped, vec!["10.0.0.9".to_owned()]);
    assert_eq!(inventory.group_size("cattle"), Some(1));
    assert_eq!(inventory.group_size("cattle_eu"), Some(1));

    let zone_var = Keys {
        zone_var: "rack".into(),
        ..Keys::default()
    };
    let by_rack = Inventory::parse(ANSIBLE, false, &zone_var).unwrap();
    assert_eq!(
        by_rack.host("cattle-a1").unwrap().zone.as_deref(),
        Some("r7")
    );
}

#[test]
fn ansible_bad_ports_and_cycles_are_handled() {
    let bad_port = Inventory::parse(
        r#"{"_meta": {"hostvars": {"web-1": {"ansible_port": "ssh"}}}, "web": {"hosts": ["web-1"]}}"#,
        false,
        &Keys::default(),
    )
    .unwrap_err();
    assert!(bad_port.contains("ansible_port"), "{bad_port}");
    // A cycle of children ends; the host still gets a group.
    let cyclic = parse(
        r#"{"all": {"children": ["a"]}, "a": {"children": ["b"]}, "b": {"children": ["a"], "hosts": ["web-1"]}}"#,
    );
    assert!(cyclic.host("web-1").unwrap().group.is_some());
}

#[test]
fn file_sd_targets_take_group_and_zone_from_labels() {
    let text = r#"[
        {"targets": ["cattle-a1:9100", "cattle-a2:9100"], "labels": {"group": "cattle", "zone": "eu-1", "env": "prod"}},
        {"targets": ["db-1"], "labels": {"team": "db"}},
        {"targets": ["10.0.0.9:9100", "[::1]:9100"], "labels": {"group": "cattle"}}
    ]"#;
    let inventory = parse(text);
    assert_eq!(inventory.format, Format::FileSd);
    let a1 = inventory.host("cattle-a1").unwrap();
    assert_eq!(a1.group.as_deref(), Some("cattle"));
    assert_eq!(a1.zone.as_deref(), Some("eu-1"));
    assert_eq!(a1.reach.address.as_deref(), Some("cattle-a1"));
    assert_eq!(a1.reach.port, None, "the scrape port is not the host's");
    assert_eq!(a1.labels["env"], "prod");
    assert!(!a1.labels.contains_key("group"));
    assert_eq!(inventory.host("db-1").unwrap().group, None);
    assert_eq!(inventory.group_size("cattle"), Some(2));
    assert_eq!(inventory.skipped, vec!["10.0.0.9:9100", "[::1]:9100"]);

    let team = Keys {
        group_label: "team".into(),
        ..Keys::default()
    };
    let by_team = Inventory::parse(text, false, &team).unwrap();
    assert_eq!(by_team.host("db-1").unwrap().group.as_deref(), Some("db"));
    let twice = Inventory::parse(
        r#"[{"targets": ["web-1:1"], "labels": {"group": "a"}}, {"targets": ["web-1:2"], "labels": {"group": "b"}}]"#,
        false,
        &Keys::default(),
    )
    .unwrap_err();
    assert!(twice.contains("listed twice"), "{twice}");
}

/// An address reaches URLs (`https://{host}:8443/`) and ssh's command line:
/// anything but a DNS name or an IP address could send a request, with its
/// credentials, elsewhere.
#[test]
fn an_address_must_be_a_dns_name_or_an_ip_and_a_bad_one_fails_the_read() {
    let own = |address: &str| {
        let entry = serde_json::json!({"name": "web-1", "group": "web", "address": address});
        Inventory::parse(
            &serde_json::json!({ "hosts": [entry] }).to_string(),
            false,
            &Keys::default(),
        )
    };
    for good in [
        "10.0.0.1",
        "fd00::1",
        "::ffff:10.0.0.1",
        "web-1",
        "Web-1.eu.Example.net",
    ] {
        let inventory = own(good).unwrap_or_else(|why| panic!("{good}: {why}"));
        assert_eq!(
            inventory.host("web-1").unwrap().reach.address.as_deref(),
            Some(good)
        );
    }
    for bad in [
        "evil.example/",
        "x@evil.example#",
        "evil.example?",
        "host.example:8443",
        "[fd00::1]",
        "fd00::1%eth0",
        "-oProxyCommand=x",
        "a..b",
        "web-.example",
        "10.0.0.999",
        "evil%2eexample",
        "",
    ] {
        let why = own(bad).unwrap_err();
        assert!(
            why.starts_with("hosts[0].address ") && why.contains("not a DNS name or an IP"),
            "{bad}: {why}"
        );
    }
    let ansible = Inventory::parse(
        r#"{"_meta": {"hostvars": {"web-1": {"ansible_host": "x@evil.example#"}}}, "web": {"hosts": ["web-1"]}}"#,
        false,
        &Keys::default(),
    )
    .unwrap_err();
    assert!(ansible.contains("host web-1: ansible_host"), "{ansible}");
}

#[test]
fn a_user_must_be_a_plain_user_name() {
    let own = |user: &str| {
        let entry = serde_json::json!({"name": "web-1", "group": "web", "user": user});
        Inventory::parse(
            &serde_json::json!({ "hosts": [entry] }).to_string(),
            false,
            &Keys::default(),
        )
    };
    for good in ["ops", "deploy_bot.2", "Svc-Restart"] {
        assert!(own(good).is_ok(), "{good}");
    }
    for bad in [
        "ops@evil.example",
        "a/b",
        "ops:pw",
        "-oops",
        "o ps",
        "o%40ps",
        "",
    ] {
        let why = own(bad).unwrap_err();
        assert!(why.starts_with("hosts[0].user "), "{bad}: {why}");
    }
    let ansible = Inventory::parse(
        r#"{"_meta": {"hostvars": {"web-1": {"ansible_user": "ops@evil"}}}, "web": {"hosts": ["web-1"]}}"#,
        false,
        &Keys::default(),
    )
    .unwrap_err();
    assert!(ansible.contains("host web-1: ansible_user"), "{ansible}");
}

/// `webservers` at depth 1 and `prod_db` under `prod` at depth 2 are
/// unrelated: counting the host in `prod_db` alone would let `webservers`'
/// limits and budget miss it.
#[test]
fn ansible_groups_at_different_depths_give_a_group_only_on_one_chain() {
    let inventory = parse(
        r#"{
        "all": {"children": ["webservers", "prod"]},
        "webservers": {"hosts": ["web-1", "both-1"]},
        "prod": {"hosts": ["chain-1"], "children": ["prod_db"]},
        "prod_db": {"hosts": ["both-1", "chain-1", "db-1"], "children": ["prod_db_eu"]},
        "prod_db_eu": {"hosts": ["chain-1"]}
    }"#,
    );
    let both = inventory.host("both-1").unwrap();
    assert_eq!(both.group, None, "webservers and prod_db are unrelated");
    let why = both.no_group.as_deref().unwrap();
    assert!(why.contains("prod_db, webservers"), "{why}");
    assert_eq!(
        inventory.host("chain-1").unwrap().group.as_deref(),
        Some("prod_db_eu"),
        "prod, prod_db and prod_db_eu lie on one chain"
    );
    assert_eq!(
        inventory.host("db-1").unwrap().group.as_deref(),
        Some("prod_db")
    );
    assert_eq!(inventory.group_size("webservers"), Some(1));
    assert_eq!(inventory.group_size("prod_db"), Some(1));
}

/// Host variables hold secrets (`api_token`, `ansible_password`), and labels
/// are printed by `mandrill inventory --json`: none is kept.
#[test]
fn ansible_host_variables_are_not_kept_as_labels() {
    let inventory = parse(
        r#"{"_meta": {"hostvars": {"web-1": {"zone": "eu-1", "api_token": "S3cr3t", "ansible_password": "pw", "rack": "r7"}}},
            "web": {"hosts": ["web-1"]}}"#,
    );
    let web = inventory.host("web-1").unwrap();
    assert_eq!(web.zone.as_deref(), Some("eu-1"));
    assert!(web.labels.is_empty(), "{:?}", web.labels);
    let shown = serde_json::to_string(&**web).unwrap();
    assert!(!shown.contains("S3cr3t"), "{shown}");
}

#[test]
fn entries_sharing_an_address_are_one_machine_with_aliases() {
    let inventory = Inventory::parse(
        r#"
[[hosts]]
name = "cattle-a1"
group = "cattle"
address = "10.0.0.1"

[[hosts]]
name = "cattle-a2"
group = "cattle"
address = "0:0::0:1"

[[hosts]]
name = "cattle-a3"
group = "cattle"
address = "::1"

[[hosts]]
name = "cattle-a9"
group = "cattle"
address = "DB-Primary.internal"

[[hosts]]
name = "db-primary"
group = "db"
address = "db-primary.internal"

[[hosts]]
name = "cattle-b1"
group = "cattle"
"#,
        true,
        &Keys::default(),
    )
    .unwrap();
    // One address however it is spelled: an IP's forms, a name's case.
    assert_eq!(inventory.aliases("cattle-a2"), ["cattle-a3"]);
    assert_eq!(inventory.aliases("cattle-a9"), ["db-primary"]);
    assert_eq!(inventory.aliases("db-primary"), ["cattle-a9"]);
    assert!(inventory.aliases("cattle-a1").is_empty());
    assert!(inventory.aliases("cattle-b1").is_empty());
    // The counting guards know a machine by its first name.
    assert_eq!(inventory.machine("cattle-a3"), Some("cattle-a2"));
    assert_eq!(inventory.machine("cattle-a2"), Some("cattle-a2"));
    assert_eq!(inventory.machine("db-primary"), Some("cattle-a9"));
    assert_eq!(inventory.machine("cattle-a1"), None);
    // Four entries of cattle with a group, three machines: padding a group
    // with aliases never raises its percentage budget.
    assert_eq!(inventory.group_size("cattle"), Some(3));
    assert_eq!(inventory.len(), 6);
    // One machine named in cattle and in db is counted in neither: a
    // request naming it in one would pass the other's limits.
    for (name, other) in [
        ("cattle-a9", "db-primary (group db)"),
        ("db-primary", "cattle-a9 (group cattle)"),
    ] {
        let host = inventory.host(name).unwrap();
        assert_eq!(host.group, None, "{name}");
        let why = host.no_group.as_deref().unwrap();
        assert!(why.contains(&format!("also listed as {other}")), "{why}");
        assert!(why.contains("two groups"), "{why}");
    }
    assert_eq!(inventory.group_size("db"), None);
    assert_eq!(inventory.in_group("cattle").count(), 4);
}

/// mandrill's own hosts are checked as they are read: the first bad entry
/// is named by its index however many good ones came before or after, in
/// JSON and in TOML, and a duplicate is found across the whole list.
#[test]
fn own_format_names_the_first_bad_entry_by_its_index() {
    let entries = |bad: serde_json::Value| {
        let mut hosts: Vec<serde_json::Value> = (0..5)
            .map(|i| serde_json::json!({"name": format!("web-{i}"), "group": "web"}))
            .collect();
        hosts[2] = bad;
        hosts.push(serde_json::json!({"name": "web-9", "group": "web", "user": "a/b"}));
        serde_json::json!({ "hosts": hosts })
    };
    let json = entries(serde_json::json!({"name": "web-2", "group": "web", "user": "a@b"}));
    let why = Inventory::parse(&json.to_string(), false, &Keys::default()).unwrap_err();
    assert!(why.starts_with("hosts[2].user "), "{why}");
    let toml = toml::to_string(&entries(
        serde_json::json!({"name": "10.0.0.1", "group": "web"}),
    ))
    .unwrap();
    let why = Inventory::parse(&toml, true, &Keys::default()).unwrap_err();
    assert!(why.starts_with("hosts[2]: name \"10.0.0.1\""), "{why}");
    let mut twice = entries(serde_json::json!({"name": "web-4", "group": "web"}));
    twice["hosts"].as_array_mut().unwrap().pop();
    let why = Inventory::parse(&twice.to_string(), false, &Keys::default()).unwrap_err();
    assert_eq!(why, "host web-4 is listed twice");
}
