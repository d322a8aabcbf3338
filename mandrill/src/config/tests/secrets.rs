//! Secrets: never echoed in errors, masked in anything printed.

use super::*;

#[test]
fn secret_values_are_never_echoed_in_errors() {
    const CANARY: &str = "31337424242";
    for (section, variable) in [("broker.nats", "MANDRILL_BROKER__NATS__TOKEN")] {
        // As numbers they are still passwords: taken as strings.
        let config = load(
            None,
            &[],
            &[
                &format!("{section}.password={CANARY}"),
                &format!("{section}.user=u"),
            ],
        )
        .unwrap();
        assert_eq!(config.broker.nats.password, Some(Secret(CANARY.into())));
        let config = load(None, &[(variable, CANARY)], &[]).unwrap();
        assert_eq!(config.broker.nats.token, Some(Secret(CANARY.into())));
        // A file gives them a type: the error names the key, not the value.
        let errors = [
            load(
                Some(&format!("[{section}]\npassword = {CANARY}\n")),
                &[],
                &[],
            ),
            load(
                Some(&format!("[{section}]\ntoken = [{CANARY}]\n")),
                &[],
                &[],
            ),
            load(
                Some(&format!("[{section}]\npassword = \"{CANARY}\n")),
                &[],
                &[],
            ),
            load(
                Some(&format!("[{section}]\npassword = {CANARY}{CANARY}x\n")),
                &[],
                &[],
            ),
            load(None, &[], &[&format!("broker.url=kafka://u:{CANARY}@h")]),
            load(
                None,
                &[],
                &[&format!("store.url=mysql://h/?password={CANARY}")],
            ),
            load(
                None,
                &[],
                &[&format!("store.url=postgres://u:{CANARY}@[::1")],
            ),
        ];
        for error in errors {
            let error = error.unwrap_err().to_string();
            assert!(!error.contains(CANARY), "{error}");
            assert!(!error.is_empty());
        }
        let flag = parse_override(&format!("{section}.password.x={CANARY}")).unwrap_err();
        assert!(!flag.to_string().contains(CANARY), "{flag}");
    }
}

/// An inventory command's argument may be a URL with credentials, which
/// the command quotes in its errors: the read's error, logged, kept in a
/// deferral's reason and shown by the API, is masked.
#[test]
fn redactor_masks_the_credentials_of_an_inventory_commands_arguments() {
    let config = load(
        None,
        &[],
        &["inventory.command=[\"ansible-inventory\", \"-i\", \"https://ops:S3cr3t@cmdb.example/hosts\", \"--list\"]"],
    )
    .unwrap();
    let stderr = "[WARNING]: Unable to parse https://ops:S3cr3t@cmdb.example/hosts as an \
                  inventory source";
    let scrubbed = config.redactor().scrub(stderr);
    assert!(!scrubbed.contains("S3cr3t"), "{scrubbed}");
    assert!(scrubbed.contains("cmdb.example/hosts"), "{scrubbed}");
}

#[test]
fn redactor_masks_every_secret_of_the_configuration() {
    let config = load(
        None,
        &[],
        &[
            "broker.url=nats://nu:np%40ss@h:4222",
            "store.url=postgres://pu:pp@db/x?sslpassword=sp&sslmode=require",
        ],
    )
    .unwrap();
    let redactor = config.redactor();
    let text = "nats://nu:np%40ss@h np@ss postgres://pu:pp@db/x?sslpassword=sp";
    let scrubbed = redactor.scrub(text);
    for secret in ["np%40ss", "np@ss", ":pp@", "=sp"] {
        assert!(!scrubbed.contains(secret), "{scrubbed}");
    }
    assert!(scrubbed.contains("require") || !text.contains("require"));
}
