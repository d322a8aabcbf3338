//! `[[schedule]]` checked against the rest of the configuration, and the
//! schedules built from it: each plan seeded from its key file, each key
//! read once, at start-up.

use std::sync::Arc;

use super::{Config, ConfigError};
use std::time::Duration;

use crate::domain::{RestartRequest, SigningKey, WireRequest};
use crate::inventory::InventoryHandle;
use crate::schedule::{Plan, Scheduled};

impl Config {
    /// The schedules, ready to run: validated, their keys read (a bad or
    /// unreadable key names `schedule[N].key_file`). A schedule needs an
    /// `[inventory]` (its victims come from it), a requester that
    /// `[[requesters]]` configures, and, where unsigned requests are
    /// refused, a key to sign with.
    pub(crate) fn schedules(&self) -> Result<Vec<Scheduled>, ConfigError> {
        crate::schedule::validate(&self.schedule)
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        let mut schedules = Vec::with_capacity(self.schedule.len());
        for (index, entry) in self.schedule.iter().enumerate() {
            let at = |key: &str| format!("schedule[{index}].{key}");
            if !self.inventory.is_configured() {
                return Err(ConfigError::invalid(
                    &at("group"),
                    "a schedule draws its victims from the inventory: configure [inventory]",
                ));
            }
            let signer = match (&entry.requester, &entry.key_file) {
                (Some(name), Some(path)) => {
                    if !self.requesters.iter().any(|r| &r.name == name) {
                        return Err(ConfigError::invalid(
                            &at("requester"),
                            format!(
                                "{name:?} is not configured in [[requesters]]: its requests would \
                                 be rejected"
                            ),
                        ));
                    }
                    let pem = std::fs::read(path).map_err(|error| {
                        ConfigError::invalid(
                            &at("key_file"),
                            format!("cannot read {}: {error}", path.display()),
                        )
                    })?;
                    let key = std::str::from_utf8(&pem)
                        .map_err(|_| "is not PEM text".to_owned())
                        .and_then(SigningKey::from_pem)
                        .map_err(|why| {
                            ConfigError::invalid(
                                &at("key_file"),
                                format!("{} {why}", path.display()),
                            )
                        })?
                        .for_audience(self.safety.audience.clone());
                    self.signs_as(&key, name).map_err(|why| {
                        ConfigError::invalid(&at("key_file"), format!("{} {why}", path.display()))
                    })?;
                    Some((name.clone(), Arc::new(key), canonical_pem(&pem)))
                }
                _ if self.require_signed() => {
                    return Err(ConfigError::invalid(
                        &at("requester"),
                        "unsigned requests are refused (safety.require_signed): give the \
                         requester and key_file it signs as",
                    ));
                }
                _ => None,
            };
            let seed = signer
                .as_ref()
                .map_or(&[][..], |(_, _, pem)| pem.as_slice());
            schedules.push(Scheduled {
                plan: Plan::new(entry, seed),
                signer: signer.map(|(name, key, _)| (name, key)),
            });
        }
        Ok(schedules)
    }

    /// `Ok` if a request `key` signs as `name` verifies against the key
    /// `[[requesters]]` gives `name`: a schedule signing with another key
    /// would publish every slot to be rejected. A requester whose own key
    /// cannot be read is left to the policy's check, which names it.
    fn signs_as(&self, key: &SigningKey, name: &str) -> Result<(), String> {
        let Ok(requesters) =
            crate::safety::Requesters::new(&self.requesters, self.require_signed())
        else {
            return Ok(());
        };
        let requesters = requesters.for_audience(self.safety.audience.clone());
        let probe = WireRequest {
            message_id: uuid::Uuid::new_v4().to_string(),
            instance_name: "schedule-key-probe".into(),
            ..WireRequest::default()
        };
        let token = key
            .sign(
                &probe,
                name,
                std::time::SystemTime::now(),
                Duration::from_secs(60),
            )
            .map_err(|error| format!("cannot sign: {error}"))?;
        RestartRequest::parse_verified(
            token.as_bytes(),
            token.len(),
            &self.parse_rules(),
            requesters.signatures(),
        )
        .map(drop)
        .map_err(|why| {
            format!("is not the key [[requesters]] gives {name:?}: a request it signs is {why}")
        })
    }
}

/// The key file's text as `mandrill keygen` writes it (LF line ends, no
/// blank around it, one final newline), whatever copy of it an instance
/// has: the plan is seeded from it, and every instance must draw the same
/// slots (a copy with CRLF line ends or no final newline would otherwise
/// publish slots of its own, under ids of its own).
fn canonical_pem(pem: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(pem);
    let mut canonical = text
        .trim()
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n");
    canonical.push('\n');
    canonical.into_bytes()
}

/// Every schedule's group is one the inventory has, when an inventory is
/// configured: a group it does not have is a typo until proven otherwise,
/// refused naming it (`run` at start-up, and `schedule preview`, alike). A
/// group that empties later only leaves its slots without a victim.
pub(crate) fn schedule_groups_known(
    schedules: &[Scheduled],
    inventory: &InventoryHandle,
) -> Result<(), ConfigError> {
    let Some(snapshot) = inventory.current() else {
        return Ok(());
    };
    for (index, scheduled) in schedules.iter().enumerate() {
        let group = &scheduled.plan.group;
        if snapshot.inventory.group_size(group).is_none() {
            return Err(ConfigError::invalid(
                &format!("schedule[{index}].group"),
                format!(
                    "{group:?} is not a group of the inventory ({})",
                    snapshot.source
                ),
            ));
        }
    }
    Ok(())
}
