//! Where AWS credentials come from: the part of the standard chain that
//! mandrill reads. In order: the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), then the shared
//! credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//! `~/.aws/credentials`) and the shared config file (`AWS_CONFIG_FILE`,
//! else `~/.aws/config`), in the profile `AWS_PROFILE` names (else
//! `default`). Not read: web identity tokens, the instance metadata
//! service, SSO, `credential_process` and `role_arn` profiles; a profile
//! that has only those is an error that says so. Read at each call, so a
//! rotated file or token is taken up without a restart. Never logged:
//! `Debug` masks the secret and the token.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::settings::Secret;

/// One set of keys.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Keys in a profile that name a source mandrill does not read.
const UNSUPPORTED_KEYS: &[&str] = &[
    "role_arn",
    "web_identity_token_file",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "credential_source",
];

/// The credentials the chain finds, reading the process's environment and
/// files.
pub(crate) fn from_chain() -> Result<Credentials, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let home = env("HOME").map(PathBuf::from);
    let file = |var: &str, default: &str| {
        env(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|home| home.join(default)))
    };
    let read = |path: Option<PathBuf>| -> Result<Option<(PathBuf, String)>, String> {
        let Some(path) = path else { return Ok(None) };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some((path, text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    };
    let credentials = read(file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"))?;
    let config = read(file("AWS_CONFIG_FILE", ".aws/config"))?;
    resolve(&env, credentials.as_ref(), config.as_ref())
}

/// The chain over what was read: `env` looks a variable up, each file is
/// its path and text. Pure.
fn resolve(
    env: &dyn Fn(&str) -> Option<String>,
    credentials_file: Option<&(PathBuf, String)>,
    config_file: Option<&(PathBuf, String)>,
) -> Result<Credentials, String> {
    if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        return Ok(Credentials {
            access_key_id: id,
            secret_access_key: Secret(secret),
            session_token: env("AWS_SESSION_TOKEN").map(Secret),
        });
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    let mut unsupported = None;
    // The credentials file's sections are bare names; the config file's
    // are `profile NAME`, but for `default`.
    for (file, section) in [
        (credentials_file, profile.clone()),
        (
            config_file,
            if profile == "default" {
                profile.clone()
            } else {
                format!("profile {profile}")
            },
        ),
    ] {
        let Some((path, text)) = file else { continue };
        let Some(keys) = ini_sections(text).remove(&section) else {
            continue;
        };
        if let (Some(id), Some(secret)) = (
            keys.get("aws_access_key_id"),
            keys.get("aws_secret_access_key"),
        ) {
            return Ok(Credentials {
                access_key_id: id.clone(),
                secret_access_key: Secret(secret.clone()),
                session_token: keys.get("aws_session_token").cloned().map(Secret),
            });
        }
        if let Some(key) = UNSUPPORTED_KEYS.iter().find(|key| keys.contains_key(**key)) {
            unsupported = Some(format!("{} [{section}] {key}", shown(path)));
        }
    }
    Err(match unsupported {
        Some(found) => format!(
            "no AWS credentials: profile {profile:?} uses {found}, which mandrill does not read \
             (it reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or aws_access_key_id and \
             aws_secret_access_key in the shared credentials or config file)"
        ),
        None => format!(
            "no AWS credentials: neither AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the \
             environment nor aws_access_key_id and aws_secret_access_key for profile {profile:?} \
             in the shared credentials or config file"
        ),
    })
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// The sections of an INI file as AWS writes them: `[name]`, then `key =
/// value` lines; `#` and `;` start comments. Indented lines (sub-sections
/// such as `s3 =`) belong to the key above and are skipped.
fn ini_sections(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
        } else if let (Some(section), Some((key, value))) = (&current, line.split_once('=')) {
            sections
                .entry(section.clone())
                .or_default()
                .insert(key.trim().to_owned(), value.trim().to_owned());
        }
    }
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn file(text: &str) -> (PathBuf, String) {
        (PathBuf::from("/home/ops/.aws/credentials"), text.to_owned())
    }

    #[test]
    fn the_environment_comes_first_then_the_profile_in_the_credentials_then_the_config_file() {
        let credentials = file(
            "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s1\n\
             [chaos]\naws_access_key_id=AKCHAOS\naws_secret_access_key=s2\naws_session_token=t2\n",
        );
        let config = file(
            "[default]\nregion = eu-west-1\n[profile other]\naws_access_key_id = AKOTHER\n\
             aws_secret_access_key = s3\n  s3 =\n    max_concurrent_requests = 1\n",
        );
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "AKENV"),
            ("AWS_SECRET_ACCESS_KEY", "s0"),
        ]);
        let found = resolve(&env, Some(&credentials), Some(&config)).unwrap();
        assert_eq!(found.access_key_id, "AKENV");
        let found = resolve(&env_of(&[]), Some(&credentials), Some(&config)).unwrap();
        assert_eq!(found.access_key_id, "AKDEFAULT");
        let found = resolve(
            &env_of(&[("AWS_PROFILE", "chaos")]),
            Some(&credentials),
            Some(&config),
        )
        .unwrap();
        assert_eq!(
            (found.access_key_id.as_str(), found.session_token),
            ("AKCHAOS", Some(Secret("t2".into())))
        );
        let found = resolve(
            &env_of(&[("AWS_PROFILE", "other")]),
            Some(&credentials),
            Some(&config),
        )
        .unwrap();
        assert_eq!(found.access_key_id, "AKOTHER");
        assert!(!format!("{found:?}").contains("s3"), "{found:?}");
    }

    #[test]
    fn a_profile_that_assumes_a_role_is_refused_naming_what_is_not_read() {
        let config = file("[profile ops]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = a\n");
        let why = resolve(&env_of(&[("AWS_PROFILE", "ops")]), None, Some(&config)).unwrap_err();
        assert!(
            why.contains("role_arn") && why.contains("does not read"),
            "{why}"
        );
        let why = resolve(&env_of(&[]), None, None).unwrap_err();
        assert!(why.starts_with("no AWS credentials"), "{why}");
    }
}
