//! Where AWS credentials come from: the standard chain, in the order the
//! Java v2 and PHP SDKs document it (the Rust SDK reads the profile before
//! the web identity variables; both are rarely set together):
//!
//! 1. the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//!    `AWS_SESSION_TOKEN`);
//! 2. web identity from the environment (`AWS_WEB_IDENTITY_TOKEN_FILE`,
//!    `AWS_ROLE_ARN`, `AWS_ROLE_SESSION_NAME`): STS
//!    `AssumeRoleWithWebIdentity` (`temporary.rs`);
//! 3. the profile `AWS_PROFILE` names (else `default`) in the shared
//!    credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//!    `~/.aws/credentials`), then the shared config file
//!    (`AWS_CONFIG_FILE`, else `~/.aws/config`): keys, or
//!    `web_identity_token_file` with `role_arn`;
//! 4. the instance metadata service (IMDSv2), unless
//!    `AWS_EC2_METADATA_DISABLED=true` (`temporary.rs`).
//!
//! Not read: ECS container credentials, SSO, `credential_process` and
//! `role_arn` profiles with a source profile; a profile that has only
//! those is an error that says so. Which source applies is decided at
//! each call, so a rotated file is taken up without a restart; temporary
//! credentials are cached until shortly before they expire. Never
//! logged: `Debug` masks the secret and the token.

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
    /// When temporary credentials stop working; `None` for keys given as
    /// they are.
    pub expires: Option<jiff::Timestamp>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// The source the chain settles on: the first one configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// Keys given as they are, in the environment or a profile.
    Keys(Credentials),
    /// A role assumed with the token in `token_file`.
    WebIdentity {
        token_file: PathBuf,
        role_arn: String,
        session_name: String,
        /// `AWS_ENDPOINT_URL_STS`, else STS's regional endpoint.
        sts_endpoint: Option<url::Url>,
    },
    /// The instance's role, from the instance metadata service.
    InstanceMetadata { endpoint: url::Url },
}

/// The session name of an assumed role when none is given (CloudTrail
/// shows it).
const DEFAULT_SESSION_NAME: &str = "mandrill";
/// Where the instance metadata service answers, over IPv4 and IPv6.
const METADATA_ENDPOINT: &str = "http://169.254.169.254";
const METADATA_ENDPOINT_IPV6: &str = "http://[fd00:ec2::254]";

/// Keys in a profile that name a source mandrill does not read.
const UNSUPPORTED_KEYS: &[&str] = &[
    "role_arn",
    "web_identity_token_file",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "credential_source",
];

/// The source the chain settles on, reading the process's environment
/// and files.
pub(crate) fn source() -> Result<Source, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let home = env("HOME").map(PathBuf::from);
    let file = |var: &str, default: &str| {
        env(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|home| home.join(default)))
    };
    let read = |path: Option<PathBuf>| -> Result<Option<SharedFile>, String> {
        let Some(path) = path else { return Ok(None) };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some((path, Some(text)))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some((path, None))),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    };
    let credentials = read(file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"))?;
    let config = read(file("AWS_CONFIG_FILE", ".aws/config"))?;
    resolve(&env, credentials.as_ref(), config.as_ref())
}

/// A shared file's path and its text, `None` if there is no such file.
type SharedFile = (PathBuf, Option<String>);

/// The chain over what was read: `env` looks a variable up, each file is
/// its path and text. Pure.
fn resolve(
    env: &dyn Fn(&str) -> Option<String>,
    credentials_file: Option<&SharedFile>,
    config_file: Option<&SharedFile>,
) -> Result<Source, String> {
    if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        return Ok(Source::Keys(Credentials {
            access_key_id: id,
            secret_access_key: Secret(secret),
            session_token: env("AWS_SESSION_TOKEN").map(Secret),
            expires: None,
        }));
    }
    if let (Some(token_file), Some(role_arn)) =
        (env("AWS_WEB_IDENTITY_TOKEN_FILE"), env("AWS_ROLE_ARN"))
    {
        return web_identity(env, token_file, role_arn, env("AWS_ROLE_SESSION_NAME"));
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    if let Some(found) = from_profile(env, &profile, credentials_file, config_file)? {
        return Ok(found);
    }
    let disabled = env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !disabled {
        return Ok(Source::InstanceMetadata {
            endpoint: metadata_endpoint(env)?,
        });
    }
    let described = |file: Option<&SharedFile>, var: &str| match file {
        Some((path, Some(_))) => shown(path),
        Some((path, None)) => format!("{}, absent", shown(path)),
        None => format!("none: no {var} and no HOME"),
    };
    Err(format!(
        "no AWS credentials; tried: the environment (AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY), web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), \
         profile {profile:?} in the shared credentials file ({}) and config file ({}), the \
         instance metadata service (disabled by AWS_EC2_METADATA_DISABLED)",
        described(credentials_file, "AWS_SHARED_CREDENTIALS_FILE"),
        described(config_file, "AWS_CONFIG_FILE"),
    ))
}

/// What profile `profile` gives, if it is in either file: keys, or a
/// role assumed with a web identity token. A profile that uses only a
/// source mandrill does not read is an error naming it.
fn from_profile(
    env: &dyn Fn(&str) -> Option<String>,
    profile: &str,
    credentials_file: Option<&SharedFile>,
    config_file: Option<&SharedFile>,
) -> Result<Option<Source>, String> {
    let mut unsupported = None;
    // The credentials file's sections are bare names; the config file's
    // are `profile NAME`, but for `default`.
    for (file, section) in [
        (credentials_file, profile.to_owned()),
        (
            config_file,
            if profile == "default" {
                profile.to_owned()
            } else {
                format!("profile {profile}")
            },
        ),
    ] {
        let Some((path, Some(text))) = file else {
            continue;
        };
        let Some(keys) = ini_sections(text).remove(&section) else {
            continue;
        };
        if let (Some(id), Some(secret)) = (
            keys.get("aws_access_key_id"),
            keys.get("aws_secret_access_key"),
        ) {
            return Ok(Some(Source::Keys(Credentials {
                access_key_id: id.clone(),
                secret_access_key: Secret(secret.clone()),
                session_token: keys.get("aws_session_token").cloned().map(Secret),
                expires: None,
            })));
        }
        if let (Some(token_file), Some(role_arn)) =
            (keys.get("web_identity_token_file"), keys.get("role_arn"))
        {
            return web_identity(
                env,
                token_file.clone(),
                role_arn.clone(),
                keys.get("role_session_name").cloned(),
            )
            .map(Some);
        }
        if let Some(key) = UNSUPPORTED_KEYS.iter().find(|key| keys.contains_key(**key)) {
            unsupported = Some(format!("{} [{section}] {key}", shown(path)));
        }
    }
    match unsupported {
        Some(found) => Err(format!(
            "no AWS credentials: profile {profile:?} uses {found}, which mandrill does not read \
             (it reads aws_access_key_id and aws_secret_access_key, or web_identity_token_file \
             and role_arn, in the shared credentials or config file)"
        )),
        None => Ok(None),
    }
}

fn web_identity(
    env: &dyn Fn(&str) -> Option<String>,
    token_file: String,
    role_arn: String,
    session_name: Option<String>,
) -> Result<Source, String> {
    let sts_endpoint = env("AWS_ENDPOINT_URL_STS")
        .map(|raw| {
            super::check_endpoint(&raw).map_err(|why| format!("AWS_ENDPOINT_URL_STS: {why}"))
        })
        .transpose()?;
    Ok(Source::WebIdentity {
        token_file: PathBuf::from(token_file),
        role_arn,
        session_name: session_name.unwrap_or_else(|| DEFAULT_SESSION_NAME.to_owned()),
        sts_endpoint,
    })
}

/// `AWS_EC2_METADATA_SERVICE_ENDPOINT`, else the IPv6 address if
/// `AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE` is `IPv6`, else the IPv4 one.
/// Plain http anywhere: the service is link-local, and nothing secret is
/// sent to it.
fn metadata_endpoint(env: &dyn Fn(&str) -> Option<String>) -> Result<url::Url, String> {
    let ipv6 = env("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE")
        .is_some_and(|mode| mode.eq_ignore_ascii_case("ipv6"));
    let raw = env("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or_else(|| {
        if ipv6 {
            METADATA_ENDPOINT_IPV6
        } else {
            METADATA_ENDPOINT
        }
        .to_owned()
    });
    let why = |why: String| format!("AWS_EC2_METADATA_SERVICE_ENDPOINT: {why}");
    let shown = super::quoted_endpoint(&raw);
    let url = url::Url::parse(&raw).map_err(|e| why(format!("{shown} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(why(format!(
            "{shown} must be an http:// or https:// URL with a host"
        )));
    }
    Ok(url)
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
mod tests;
