//! The loader never panics, whatever the keys and values.

use proptest::prelude::*;

use super::super::*;

/// A value as an operator might type it, or anything at all.
fn raw_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|x| x.to_string()),
        Just("nan".to_owned()),
        Just("-inf".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        (
            any::<u64>(),
            prop::sample::select(vec!["ns", "ms", "s", "m", "h", "days", "years", ""])
        )
            .prop_map(|(n, unit)| format!("{n}{unit}")),
        (0u64..100_000, prop::sample::select(vec!["ms", "s", "m"]))
            .prop_map(|(n, unit)| format!("{n}{unit}")),
        prop::sample::select(vec![
            "memory",
            "sqlite:x.db",
            "nats://h:4222",
            "postgres://u:p@h/d",
            "kafka://x",
            "nats://",
            "simulate",
            "json",
            "text",
            "info",
        ])
        .prop_map(str::to_owned),
        ".*",
    ]
}

/// Loads `flags` the way the property below does; the error's text.
fn load_flags(flags: &[(&str, String)], through_environment: bool) -> Result<Config, String> {
    let mut sources = Sources::default();
    for (key, raw) in flags {
        if through_environment {
            let name = format!("MANDRILL_{}", key.replace('.', "__").to_ascii_uppercase());
            sources.environment.push((name, raw.clone()));
        } else {
            let pair = parse_override(&format!("{key}={raw}")).map_err(|e| e.to_string())?;
            sources.overrides.push(pair);
        }
    }
    sources.load().map_err(|e| e.to_string())
}

fn settings() -> impl Strategy<Value = Vec<(&'static str, String)>> {
    static KEYS: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| docs::documented_keys().collect());
    let keys: Vec<&'static str> = KEYS.iter().map(String::as_str).collect();
    prop::collection::vec((prop::sample::select(keys), raw_value()), 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Arbitrary values for any keys never panic: either a
    /// configuration that validates and whose every duration can be
    /// added to a clock reading, or an error naming a key.
    #[test]
    fn loader_never_panics_and_names_the_key(
        flags in settings(),
        through_environment in any::<bool>(),
    ) {
        let mut sources = Sources::default();
        for (key, raw) in &flags {
            if through_environment {
                let name = format!("MANDRILL_{}", key.replace('.', "__").to_ascii_uppercase());
                sources.environment.push((name, raw.clone()));
            } else {
                match parse_override(&format!("{key}={raw}")) {
                    Ok(pair) => sources.overrides.push(pair),
                    Err(error) => {
                        prop_assert!(error.to_string().contains(key));
                        return Ok(());
                    }
                }
            }
        }
        match sources.load() {
            Ok(config) => {
                prop_assert!(config.validate().is_ok());
                let now = std::time::Instant::now();
                for (key, duration) in config.durations() {
                    prop_assert!(now.checked_add(duration).is_some(), "{key}");
                    prop_assert!(
                        tokio::time::Instant::now().checked_add(duration).is_some(),
                        "{key}"
                    );
                }
                let worker = config.worker_config();
                let _ = tokio::sync::Semaphore::new(worker.max_in_flight);
                let _ = tokio::sync::Semaphore::new(config.restarter.blocking_threads);
                let _ = config.flatten();
                let _ = config.redactor();
            }
            Err(error) => {
                let text = error.to_string();
                // The restart-timeout cross-check names the setting to
                // raise, whichever of its inputs (restarter.max_latency,
                // a backend's timeout, verify.*) was set.
                // A section that one of its keys brings in names the
                // key it cannot do without (`[inventory.ec2]`'s region).
                prop_assert!(
                    flags.iter().any(|(key, _)| text.contains(key))
                        || text.contains("MANDRILL_")
                        || text.contains("worker.restart_timeout")
                        || text.contains("inventory.ec2.region"),
                    "{text}"
                );
                // The same load without the secrets: a value the
                // message contains anyway (a variant name, another
                // flag's value) is not an echo of the secret.
                let public: Vec<(&str, String)> = flags
                    .iter()
                    .filter(|(key, _)| !SECRET_KEYS.contains(key))
                    .cloned()
                    .collect();
                let text_without_secrets = load_flags(&public, through_environment)
                    .err()
                    .unwrap_or_default();
                let shown = |raw: &String| {
                    flags.iter().any(|(key, other)| !SECRET_KEYS.contains(key) && other.contains(raw.as_str()))
                        || text_without_secrets.contains(raw.as_str())
                };
                for (key, raw) in &flags {
                    if SECRET_KEYS.contains(key) && raw.len() >= 4 && !shown(raw) {
                        prop_assert!(!text.contains(raw.as_str()), "{text}");
                    }
                }
            }
        }
    }
}
