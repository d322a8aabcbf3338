//! The production configurations shipped, `deploy/mandrill.toml` and the
//! one README shows, made runnable in a directory. The one copy: the
//! configuration's unit tests and `tests/deploy.rs` include this file
//! (`#[path]`).

// Each includer uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A file of the repository, from its root.
pub fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The secrets the unit's environment file provides.
pub const SECRETS: [(&str, &str); 3] = [
    (
        "MANDRILL_STORE__URL",
        "postgres://mandrill:pw@db.internal/mandrill",
    ),
    ("MANDRILL_BROKER__NATS__PASSWORD", "nats-pw"),
    ("MANDRILL_ADMIN__TOKEN", "admin-token"),
];

/// `deploy/mandrill.toml`.
pub fn deploy_configuration() -> String {
    std::fs::read_to_string(repo_file("deploy/mandrill.toml")).unwrap()
}

/// The production configuration README's "Safe by default" shows.
pub fn readme_configuration() -> String {
    let readme = std::fs::read_to_string(repo_file("README.md")).unwrap();
    let section = readme
        .split_once("### Safe by default")
        .expect("README has a \"Safe by default\" section")
        .1;
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split_once("```"))
        .expect("the section opens with a toml block")
        .0;
    assert!(
        block.contains("[inventory]") && block.contains("[[requesters]]"),
        "README's production configuration has an inventory and a requester:\n{block}"
    );
    block.to_owned()
}

/// `text` made runnable in `dir`, where the caller has written the
/// requester's public key `oncall-bot.pub`: the key file and the inventory
/// command point at files here (the real ones live on the production host);
/// everything else as shipped. Each replacement must find what it replaces,
/// so that the shipped text cannot drift from it.
pub fn runnable(text: &str, dir: &Path) -> PathBuf {
    let inventory = dir.join("inventory.json");
    std::fs::write(
        &inventory,
        r#"{"hosts": [
            {"name": "cattle-web-01", "group": "web", "zone": "eu-1a"},
            {"name": "cattle-db1", "group": "db", "zone": "eu-1a"}
        ]}"#,
    )
    .unwrap();
    let mut text = text.to_owned();
    for (shipped, here) in [
        (
            "\"/etc/mandrill/requesters/oncall-bot.pub\"".to_owned(),
            format!("{:?}", dir.join("oncall-bot.pub").display().to_string()),
        ),
        (
            r#"["ansible-inventory", "-i", "/etc/mandrill/hosts.ini", "--list"]"#.to_owned(),
            format!("[\"cat\", {:?}]", inventory.display().to_string()),
        ),
    ] {
        assert!(text.contains(&shipped), "{shipped} not in:\n{text}");
        text = text.replace(&shipped, &here);
    }
    let path = dir.join("mandrill.toml");
    std::fs::write(&path, text).unwrap();
    path
}
