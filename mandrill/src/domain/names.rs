//! Validated names: an instance name (a DNS label), a domain, a hostname.

use std::fmt;

/// A validated DNS label: lower-case letters, digits and hyphens, 1 to 63
/// characters, neither starting nor ending with a hyphen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct InstanceName(String);

impl InstanceName {
    /// Parses `raw`, explaining what is wrong when it is not a valid DNS label.
    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        validate_label(raw).map(|()| Self(raw.to_owned()))
    }

    /// The name as a string slice.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn validate_label(raw: &str) -> Result<(), String> {
    if raw.is_empty() {
        return Err("is empty".into());
    }
    if raw.len() > 63 {
        return Err(format!("is {} characters long (at most 63)", raw.len()));
    }
    if let Some(bad) = raw
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "contains {bad:?} (only a-z, 0-9 and '-' are allowed)"
        ));
    }
    if raw.starts_with('-') || raw.ends_with('-') {
        return Err("starts or ends with a hyphen".into());
    }
    Ok(())
}

/// A validated DNS domain, e.g. `example.net`: dot-separated valid labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Domain(String);

impl Domain {
    /// Parses a domain such as `example.net`.
    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        if raw.len() > 253 - 64 {
            return Err(format!("domain {raw:?} is too long"));
        }
        for label in raw.split('.') {
            validate_label(label).map_err(|why| format!("domain label {label:?} {why}"))?;
        }
        Ok(Self(raw.to_owned()))
    }
}

impl Default for Domain {
    fn default() -> Self {
        Self("example.net".to_owned())
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fully-qualified host to restart: `{instance_name}.{domain}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Hostname(String);

impl Hostname {
    /// Builds the hostname of an instance in a domain; both are already valid.
    pub(crate) fn new(instance: &InstanceName, domain: &Domain) -> Self {
        // Not `format!`: built once per message, in one allocation of the
        // right size, without the formatting machinery.
        let mut name = String::with_capacity(instance.0.len() + 1 + domain.0.len());
        name.push_str(&instance.0);
        name.push('.');
        name.push_str(&domain.0);
        Self(name)
    }

    /// The hostname as a string slice.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tutorial-style random instance name: `cattle-` plus 4 characters from `[a-z0-9]`.
pub(crate) fn random_instance_name(rng: &mut impl rand::Rng) -> InstanceName {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = (0..4)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    InstanceName(format!("cattle-{suffix}"))
}
