//! `[safety]`: the defaults a real backend gets, and the guards' settings
//! from every layer.

use super::*;

#[test]
fn a_real_backend_is_leashed_and_restarts_no_one_until_told() {
    let simulated = Config::default();
    assert!(!simulated.dry_run());
    let mut real = Config::default();
    real.restarter.kind = RestarterKind::Command;
    assert!(real.dry_run(), "a real backend defaults to a dry run");
    assert!(
        real.worker_config()
            .policy
            .current()
            .eligibility
            .check("cattle-ab12")
            .is_err(),
        "and nothing is eligible until safety.allow names it"
    );
    real.safety.dry_run = Some(false);
    real.safety.allow = vec!["cattle-*".into()];
    assert!(!real.dry_run());
    assert!(
        real.worker_config()
            .policy
            .current()
            .eligibility
            .check("cattle-ab12")
            .is_ok()
    );
    let error = load(Some("[safety]\nallow = [\"\"]\n"), &[], &[]).unwrap_err();
    assert!(error.to_string().contains("safety.allow[0]"), "{error}");
}

#[test]
fn counting_guards_load_from_every_source_and_name_bad_keys() {
    let file = "[safety]\ngroups = { web = [\"frontend-*\"] }\n\
                [safety.rate]\ngroup_max = 5\nwindow = \"1h\"\n\
                [safety.budget]\nmax_disrupted_percent = 20\n\
                group_sizes = { web = 10 }\n";
    let config = load(
        Some(file),
        &[("MANDRILL_SAFETY__RATE__HOST_COOLDOWN", "10m")],
        &["safety.rate.global_max=50"],
    )
    .unwrap();
    assert_eq!(config.safety.rate.group_max, Some(5));
    assert_eq!(config.safety.rate.host_cooldown, Duration::from_secs(600));
    assert_eq!(config.safety.rate.global_max, Some(50));
    let counting = config.counting().unwrap();
    let limits = counting.limits("web").unwrap();
    assert_eq!(limits.budget, Some(2));
    assert_eq!(limits.window, Duration::from_secs(3600));
    let error = load(
        Some("[safety.budget]\nmax_disrupted_percent = 150\n"),
        &[],
        &[],
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("safety.budget.max_disrupted_percent"),
        "{error}"
    );
    let error = load(Some("[safety]\ngroups = { web = [\"\"] }\n"), &[], &[]).unwrap_err();
    assert!(
        error.to_string().contains("safety.groups.web[0]"),
        "{error}"
    );
    // A real backend counts by default: Chaos Monkey's one per group
    // per day, one host of a group disrupted at once.
    let mut real = Config::default();
    real.restarter.kind = RestarterKind::Command;
    let limits = real.counting().unwrap().limits("cattle").unwrap();
    assert_eq!(limits.group_max, Some(1));
    assert_eq!(limits.window, Duration::from_secs(24 * 3600));
    assert_eq!(limits.budget, Some(1));
    assert!(
        !Config::default()
            .counting()
            .unwrap()
            .limits("cattle")
            .unwrap()
            .is_active()
    );
}

/// Without a probe, a restarted host counts as disrupted for
/// `safety.budget.settle`; a probe's verified recovery ends it at once.
#[test]
fn the_budgets_settle_applies_only_without_a_verification_probe() {
    let mut config = Config::default();
    config.safety.budget.max_disrupted_per_zone = Some(3);
    let limits = config.counting().unwrap().limits("cattle").unwrap();
    assert_eq!(limits.settle, Duration::from_secs(300));
    assert_eq!(limits.zone_budget, Some(3));
    assert!(!config.verified_by_probe());
    config.verify.probe = crate::restarter::verify::ProbeKind::Tcp;
    assert!(config.verified_by_probe());
    let limits = config.counting().unwrap().limits("cattle").unwrap();
    assert_eq!(limits.settle, Duration::ZERO);
}

#[test]
fn a_real_backend_gets_chaos_monkeys_calendar_unless_one_is_configured() {
    assert!(Config::default().calendar().unwrap().is_none());
    let mut real = Config::default();
    real.restarter.kind = RestarterKind::Command;
    let default = real.calendar().unwrap().unwrap();
    assert_eq!(default.describe(), "Mon–Fri 09:00–15:00 UTC");
    let file = "[safety]\nmax_defer = \"2h\"\n[safety.calendar]\n\
                weekdays = [\"sat\"]\ntimezone = \"Europe/Stockholm\"\n\
                [[safety.calendar.freezes]]\nfrom = \"2026-12-20T00:00\"\n\
                to = \"2027-01-04T00:00\"\nname = \"year-end\"\n";
    let config = load(Some(file), &[], &[]).unwrap();
    assert_eq!(config.safety.max_defer, Duration::from_secs(7200));
    let calendar = config.calendar().unwrap().unwrap();
    assert_eq!(calendar.describe(), "Sat 09:00–15:00 Europe/Stockholm");
    let error = load(Some("[safety.calendar]\nhours = [\"9-5\"]\n"), &[], &[]).unwrap_err();
    assert!(
        error.to_string().contains("safety.calendar.hours[0]"),
        "{error}"
    );
}

#[test]
fn stop_conditions_and_the_pause_file_load_and_bad_ones_name_the_key() {
    let file = "[safety]\nstop_retry = \"10s\"\npause_file = \"/run/mandrill/PAUSE\"\n\
                [[safety.stop_conditions]]\nname = \"alerts\"\nhttp = \"http://127.0.0.1:9093/firing\"\n\
                [[safety.stop_conditions]]\nname = \"deploys\"\ncommand = [\"true\"]\ntimeout = \"2s\"\n";
    let config = load(Some(file), &[], &[]).unwrap();
    assert_eq!(config.safety.stop_conditions.len(), 2);
    assert_eq!(
        config.safety.stop_conditions[1].timeout,
        Duration::from_secs(2)
    );
    let policy = config.policy().unwrap();
    assert_eq!(policy.stop_retry, Duration::from_secs(10));
    assert!(!policy.stop_conditions.is_empty());
    for (file, key) in [
        (
            "[[safety.stop_conditions]]\nname = \"x\"\nhttp = \"nope\"\n",
            "safety.stop_conditions[0].http",
        ),
        (
            "[[safety.stop_conditions]]\nname = \"x\"\nurl = \"http://a/\"\n",
            "safety.stop_conditions",
        ),
        ("[safety]\nstop_retry = \"0s\"\n", "safety.stop_retry"),
        ("[safety]\npause_file = \"/\"\n", "safety.pause_file"),
    ] {
        let error = load(Some(file), &[], &[]).unwrap_err().to_string();
        assert!(error.contains(key), "{file}: {error}");
    }
}

/// On a reload the file's stricter pause and signature rules win over the
/// flags that loosened them at start-up; at start-up the flags win as
/// ever, and a file that says nothing leaves them in force. The leash is
/// not among them: a reload reports what the file itself says of it
/// (`file_dry_run`), and the caller turns it only when that changed
/// (`safety::leash::reloaded_dry_run`): a file that keeps `dry_run = true`
/// under `--unleash` is not a trap a routine reload springs (issue 37).
#[test]
fn on_reload_the_files_stricter_safety_settings_win_over_flags() {
    let sources = |file: &str, env: &[(&str, &str)], flags: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mandrill.toml");
        std::fs::write(&path, file).unwrap();
        let sources = Sources {
            file: Some(path),
            environment: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            overrides: flags.iter().map(|f| parse_override(f).unwrap()).collect(),
        };
        (dir, sources)
    };
    let strict = "[safety]\ndry_run = true\npause_on_unrecovered = true\nrequire_signed = true\n";
    let loosening = [
        "safety.dry_run=false",
        "safety.pause_on_unrecovered=false",
        "safety.require_signed=false",
    ];
    let (_dir, flagged) = sources(strict, &[], &loosening);
    let started = flagged.load().unwrap();
    assert_eq!(
        started.safety.dry_run,
        Some(false),
        "at start-up the flag wins"
    );
    assert!(!started.safety.pause_on_unrecovered);
    assert_eq!(started.safety.require_signed, Some(false));
    let reloaded = flagged.reload().unwrap();
    assert_eq!(
        reloaded.config.safety.dry_run,
        Some(false),
        "the leash is not tightened by the reload itself"
    );
    assert_eq!(reloaded.file_dry_run, Some(true));
    assert!(reloaded.config.safety.pause_on_unrecovered);
    assert_eq!(reloaded.config.safety.require_signed, Some(true));
    assert!(reloaded.config.require_signed());
    assert_eq!(
        reloaded.tightened,
        ["safety.pause_on_unrecovered", "safety.require_signed"]
    );

    // The environment is below the flags too.
    let (_dir, from_env) = sources("", &[("MANDRILL_SAFETY__DRY_RUN", "true")], &loosening);
    let reloaded = from_env.reload().unwrap();
    assert_eq!(reloaded.file_dry_run, Some(true));
    assert_eq!(from_env.file_dry_run().unwrap(), Some(true));
    assert!(reloaded.tightened.is_empty(), "{:?}", reloaded.tightened);

    // Silent on the key, or as loose: the flag stays in force.
    for (file, said) in [("", None), ("[safety]\ndry_run = false\n", Some(false))] {
        let (_dir, quiet) = sources(file, &[], &loosening);
        let reloaded = quiet.reload().unwrap();
        assert_eq!(reloaded.config.safety.dry_run, Some(false), "{file:?}");
        assert_eq!(reloaded.file_dry_run, said, "{file:?}");
        assert!(
            reloaded.tightened.is_empty(),
            "{file:?}: {:?}",
            reloaded.tightened
        );
    }
}

#[test]
fn a_real_backend_requires_signed_requests_unless_told_otherwise() {
    let simulated = Config::default();
    assert!(
        !simulated.require_signed(),
        "the quick start works unsigned"
    );
    let signatures = |config: &Config| {
        config
            .worker_config()
            .policy
            .current()
            .requesters
            .signatures()
            .required()
    };
    assert!(!signatures(&simulated));
    let mut real = Config::default();
    real.restarter.kind = RestarterKind::Command;
    assert!(real.require_signed() && signatures(&real));
    real.safety.require_signed = Some(false);
    assert!(!real.require_signed() && !signatures(&real));
    // Every layer names the key at fault, never quoting a key.
    let file = "[[requesters]]\nname = \"alice\"\npublic_key = \"-----BEGIN PUBLIC KEY-----\"\n";
    let error = load(Some(file), &[], &[]).unwrap_err();
    assert!(
        error.to_string().contains("requesters[0].public_key"),
        "{error}"
    );
    let file = "[[requesters]]\nname = \"alice\"\npublic_key_file = \"/nonexistent.pub\"\n\
                [requesters.quota]\nmax = 2\nwindow = \"1h\"\n";
    let error = load(Some(file), &[], &[]).unwrap_err();
    assert!(
        error.to_string().contains("requesters[0].public_key_file"),
        "{error}"
    );
    // And a reload applies it (the policy is rebuilt from [[requesters]]).
    assert!(crate::config::reloads("requesters"));
}
