//! The production configurations shipped (`deploy/mandrill.toml` and
//! README's) load with their secrets from the environment, start leashed,
//! take signed requests only and know their inventory.

use std::path::Path;

use super::*;

#[path = "../../../tests/services/shipped.rs"]
mod files;

use files::{SECRETS, deploy_configuration, readme_configuration, runnable};

/// RFC 8410's example Ed25519 public key, as the requester's key file.
const REQUESTER_KEY: &str = "-----BEGIN PUBLIC KEY-----\n\
    MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n\
    -----END PUBLIC KEY-----\n";

/// The configuration `text` as the service would load it in `dir`, with
/// `environment`.
fn sources(text: &str, dir: &Path, environment: &[(&str, &str)]) -> Sources {
    std::fs::write(dir.join("oncall-bot.pub"), REQUESTER_KEY).unwrap();
    Sources {
        file: Some(runnable(text, dir)),
        environment: environment
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        overrides: Vec::new(),
    }
}

#[test]
fn the_shipped_production_configurations_start_leashed_signed_and_with_an_inventory() {
    for (name, text) in [
        ("deploy", deploy_configuration()),
        ("README", readme_configuration()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let loaded = sources(&text, dir.path(), &SECRETS).load().unwrap();
        assert!(loaded.dry_run(), "{name}: starts leashed");
        assert!(
            loaded.require_signed() && loaded.requesters.len() == 1,
            "{name}: takes signed requests only, from its one requester"
        );
        assert!(loaded.inventory.is_configured(), "{name}: has an inventory");
        // The stop condition asks for the firing alerts, not for liveness.
        let alerts = &loaded.safety.stop_conditions[0];
        assert!(alerts.expect_empty_json_array, "{name}: {alerts:?}");
        let url = alerts.http.as_deref().unwrap();
        assert!(
            url.contains("/api/v2/alerts?active=true&silenced=false&inhibited=false"),
            "{name}: {url}"
        );
    }
}

/// The example's secrets come from the environment file the unit reads:
/// without them it refuses to start, naming the setting; with them they
/// are in force and never shown.
#[test]
fn the_example_production_configuration_loads_with_its_secrets_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let text = deploy_configuration();
    let config = sources(&text, dir.path(), &SECRETS).load().unwrap();
    assert_eq!(
        config.broker.nats.password,
        Some(crate::settings::Secret("nats-pw".into()))
    );
    assert_eq!(config.admin.listen, "0.0.0.0:9730");
    assert_eq!(config.notify.len(), 1, "the example has a notification");
    assert!(
        !format!("{config:?}").contains("XXXXXXXX"),
        "its URL is masked"
    );
    // Without the token, the example refuses to start, naming it.
    let error = sources(&text, dir.path(), &SECRETS[..2])
        .load()
        .unwrap_err();
    assert!(error.to_string().contains("admin.token"), "{error}");
}
