//! The reference in docs/ is current: every generated region (between
//! `<!-- generated: NAME -->` and `<!-- end generated -->`) holds what the
//! code generates today. After changing a setting's field doc, a command's
//! help or a metric, refresh them all with
//! `MANDRILL_BLESS=1 cargo test -p mandrill --test reference`.

use std::path::{Path, PathBuf};

const BLESS: &str = "MANDRILL_BLESS=1 cargo test -p mandrill --test reference";
const END: &str = "<!-- end generated -->";

/// Each generated region: the file under the repository's root, the
/// region's name, and its text.
fn regions() -> [(&'static str, &'static str, String); 3] {
    [
        (
            "docs/settings.md",
            "settings",
            mandrill::settings_reference(),
        ),
        ("docs/cli.md", "commands", mandrill::commands_reference()),
        (
            "docs/operating.md",
            "metrics",
            mandrill::metrics_reference(),
        ),
    ]
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate lives in the workspace")
        .to_owned()
}

/// `file` with region `name`'s text replaced by `text`; `None` if the file
/// has no such region.
fn splice(file: &str, name: &str, text: &str) -> Option<String> {
    let start = format!("<!-- generated: {name} -->");
    let (before, rest) = file.split_once(&start)?;
    let (_, after) = rest.split_once(END)?;
    let text = text.trim_matches('\n');
    Some(format!("{before}{start}\n{text}\n{END}{after}"))
}

#[test]
fn the_generated_reference_in_docs_is_current() {
    let bless = std::env::var_os("MANDRILL_BLESS").is_some();
    let mut stale = Vec::new();
    for (path, name, text) in regions() {
        let full = root().join(path);
        let file = std::fs::read_to_string(&full)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", full.display()));
        let Some(current) = splice(&file, name, &text) else {
            panic!("{path} has no region `<!-- generated: {name} -->` … `{END}`");
        };
        if current == file {
            continue;
        }
        if bless {
            std::fs::write(&full, current)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", full.display()));
        } else {
            stale.push(format!("{path} ({name})"));
        }
    }
    assert!(
        stale.is_empty(),
        "the generated reference is stale in {}; refresh it with:\n    {BLESS}",
        stale.join(", ")
    );
}

#[test]
fn a_region_is_replaced_whole_and_the_rest_kept() {
    let file = "intro\n<!-- generated: x -->\nold\nlines\n<!-- end generated -->\noutro\n";
    assert_eq!(
        splice(file, "x", "\nnew\n").as_deref(),
        Some("intro\n<!-- generated: x -->\nnew\n<!-- end generated -->\noutro\n")
    );
    assert_eq!(splice(file, "y", "new"), None);
}

#[test]
fn the_reference_covers_every_setting_command_and_metric_family() {
    let settings = mandrill::settings_reference();
    for key in [
        "`restarter.ssh.known_hosts_file`",
        "`restarter.http.hmac_header`",
        "`restarter.command.argv`",
        "`verify.expect_down`",
        "`broker.nats.password`",
        "`worker.max_in_flight`",
    ] {
        assert!(settings.contains(key), "{key} missing from:\n{settings}");
    }
    let commands = mandrill::commands_reference();
    for command in ["`mandrill run`", "`mandrill policy check`", "`--unleash`"] {
        assert!(commands.contains(command), "{command} missing");
    }
    let metrics = mandrill::metrics_reference();
    for family in [
        "`mandrill_requests_total` | counter | `outcome`: denied, dry_run",
        "`mandrill_restart_seconds` | histogram",
        "`mandrill_group_disruption_budget` | gauge | `group` |",
        "`mandrill_inventory_age_seconds`",
    ] {
        assert!(
            metrics.contains(family),
            "{family} missing from:\n{metrics}"
        );
    }
}
