//! Old spellings: `[nats]` (now `[broker.nats]`) and `broker.poll_interval`
//! (now `broker.sqlite.poll_interval` and `broker.pubsub.poll_interval`)
//! are still read from every layer, named in one warning, and layered like
//! the new ones.

use super::*;
use crate::config::renamed_warning as warning;

fn olds(renamed: &[Renamed]) -> Vec<(&str, &str)> {
    renamed
        .iter()
        .map(|r| (r.old.as_str(), r.new.as_str()))
        .collect()
}

#[test]
fn the_old_nats_section_is_read_from_every_layer_and_named_with_its_new_name() {
    let (config, renamed) = load_with_renames(
        Some("[nats]\nstream = \"FROM_FILE\"\nuser = \"u\"\n"),
        &[("MANDRILL_NATS__PASSWORD", "12345")],
        &["nats.consumer=from-flag"],
    )
    .unwrap();
    let nats = &config.broker.nats;
    assert_eq!(nats.stream, "FROM_FILE");
    assert_eq!(nats.user.as_deref(), Some("u"));
    // Typed by its new key: a password, not a number.
    assert_eq!(nats.password, Some(Secret("12345".into())));
    assert_eq!(nats.consumer, "from-flag");
    assert_eq!(
        olds(&renamed),
        [
            ("[nats]", "[broker.nats]"),
            ("MANDRILL_NATS__PASSWORD", "MANDRILL_BROKER__NATS__PASSWORD"),
            ("--set nats.consumer", "--set broker.nats.consumer"),
        ]
    );
    let warning = warning(&renamed).unwrap();
    for name in ["[nats]", "[broker.nats]", "MANDRILL_BROKER__NATS__PASSWORD"] {
        assert!(warning.contains(name), "{warning}");
    }
    assert!(!warning.contains("12345"), "{warning}");
}

#[test]
fn the_new_names_are_read_without_a_warning() {
    let (config, renamed) = load_with_renames(
        Some("[broker.nats]\nstream = \"FROM_FILE\"\n[broker.sqlite]\npoll_interval = \"5ms\"\n"),
        &[("MANDRILL_BROKER__NATS__PASSWORD", "12345")],
        &["broker.nats.user=u", "broker.pubsub.poll_interval=7ms"],
    )
    .unwrap();
    assert_eq!(config.broker.nats.stream, "FROM_FILE");
    assert_eq!(config.broker.nats.password, Some(Secret("12345".into())));
    assert_eq!(config.broker.sqlite.poll_interval, Duration::from_millis(5));
    assert_eq!(config.broker.pubsub.poll_interval, Duration::from_millis(7));
    assert!(renamed.is_empty(), "{renamed:?}");
    assert_eq!(warning(&renamed), None);
}

#[test]
fn the_old_poll_interval_sets_both_polling_brokers() {
    for (file, env, flags) in [
        (
            Some("[broker]\npoll_interval = \"25ms\"\n"),
            &[][..],
            &[][..],
        ),
        (
            None,
            &[("MANDRILL_BROKER__POLL_INTERVAL", "25ms")][..],
            &[][..],
        ),
        (None, &[][..], &["broker.poll_interval=25ms"][..]),
    ] {
        let (config, renamed) = load_with_renames(file, env, flags).unwrap();
        assert_eq!(
            config.broker.sqlite.poll_interval,
            Duration::from_millis(25)
        );
        assert_eq!(
            config.broker.pubsub.poll_interval,
            Duration::from_millis(25)
        );
        let warning = warning(&renamed).unwrap();
        assert!(warning.contains("POLL_INTERVAL") || warning.contains("broker.poll_interval"));
        assert!(warning.contains("SQLITE") || warning.contains("broker.sqlite.poll_interval"));
    }
}

#[test]
fn old_and_new_names_layer_as_one_setting() {
    // The environment beats the file, whichever name each uses.
    let config = load(
        Some("[broker.nats]\nstream = \"FILE\"\n"),
        &[("MANDRILL_NATS__STREAM", "ENV")],
        &[],
    )
    .unwrap();
    assert_eq!(config.broker.nats.stream, "ENV");
    let config = load(
        Some("[nats]\nstream = \"FILE\"\n"),
        &[("MANDRILL_BROKER__NATS__STREAM", "ENV")],
        &["nats.subject=from.flag"],
    )
    .unwrap();
    assert_eq!(config.broker.nats.stream, "ENV");
    assert_eq!(config.broker.nats.subject, "from.flag");
    // One file with both names for one key: which was meant is not guessed.
    for (file, key) in [
        (
            "[nats]\nstream = \"A\"\n[broker.nats]\nstream = \"B\"\n",
            "broker.nats.stream",
        ),
        (
            "[broker]\npoll_interval = \"1s\"\n[broker.sqlite]\npoll_interval = \"2s\"\n",
            "broker.sqlite.poll_interval",
        ),
    ] {
        let error = load(Some(file), &[], &[]).unwrap_err().to_string();
        assert!(error.contains(key), "{error}");
    }
}

#[test]
fn errors_under_an_old_name_name_the_key_and_how_it_was_written() {
    for (file, flags, key, written) in [
        (
            Some("[nats]\nmax_ack_pending = 0\n"),
            &[][..],
            "broker.nats.max_ack_pending",
            "[nats]",
        ),
        (
            Some("[nats]\ntls = \"yes\"\n"),
            &[][..],
            "broker.nats.tls",
            "[nats]",
        ),
        (
            None,
            &["nats.stream=a b"][..],
            "broker.nats.stream",
            "--set nats.stream",
        ),
        (
            Some("[broker]\npoll_interval = \"0s\"\n"),
            &[][..],
            "broker.sqlite.poll_interval",
            "broker.poll_interval",
        ),
        (Some("nats = 5\n"), &[][..], "nats", "nats"),
        (Some("[nats]\nsteam = \"x\"\n"), &[][..], "steam", "[nats]"),
    ] {
        let error = load(file, &[], flags).unwrap_err().to_string();
        assert!(error.contains(key), "{file:?} {flags:?}: {error}");
        assert!(error.contains(written), "{file:?} {flags:?}: {error}");
    }
}
