//! `[[requesters]]`: who may ask for restarts, with which key, for which
//! instances and groups, and how many per window.
//!
//! The trust model: the signature is verified where bytes become a request
//! (`RestartRequest::parse_verified`, with this module's [`Signatures`]);
//! what a verified requester may touch is checked at eligibility
//! ([`Requesters::check`]), with the group the operator's configuration
//! decides; its quota is counted in the store's claim ([`Requesters::limit`]
//! puts it in the claim's [`Limits`]). Nothing a message says widens any of
//! it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::Limits;
use crate::domain::{RestartRequest, Signatures, Signer};
use crate::pattern::Pattern;

/// One `[[requesters]]` entry, as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RequesterSettings {
    /// The requester's name: the `iss` its tokens carry, and what the
    /// history records as `requested_by`.
    pub name: String,
    /// Its public key, PEM text (Ed25519 or P-256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// Or the file holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_file: Option<PathBuf>,
    /// Instance-name patterns it may restart (empty: none).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Groups it may restart (empty: any its `allow` admits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// `[requesters.quota]`: restarts it may claim per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaSettings>,
}

/// `[requesters.quota]`: `max` restarts per `window`, over every group and
/// instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QuotaSettings {
    /// Restarts per window.
    pub max: u32,
    /// The window, e.g. `1h`.
    #[serde(with = "crate::settings::duration")]
    pub window: Duration,
}

/// What one verified requester may do.
#[derive(Debug, Clone, PartialEq)]
struct Permit {
    allow: Vec<Pattern>,
    groups: Vec<String>,
    quota: Option<(u32, Duration)>,
}

/// The configured requesters: their keys (for the parse) and their permits
/// (for eligibility and the claim).
#[derive(Debug, Clone, Default)]
pub(crate) struct Requesters {
    signatures: Signatures,
    permits: HashMap<String, Permit>,
}

/// A key at fault, and why: (`requesters[0].public_key_file`, `cannot read
/// …`).
pub(crate) type AtFault = (String, String);

/// Longest requester name, in characters (it is recorded as `requested_by`).
const MAX_NAME_CHARS: usize = 128;

/// Whether `name` may name a requester (it is an `iss`, a file name for
/// `mandrill keygen`, and recorded as `requested_by`): else why not.
pub(crate) fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.starts_with('.')
        || name.chars().count() > MAX_NAME_CHARS
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    {
        return Err(format!(
            "{name:?} must be 1 to {MAX_NAME_CHARS} letters, digits, '-', '_', '.' or '@', \
             not starting with '.'"
        ));
    }
    Ok(())
}

impl Requesters {
    /// Parses the entries, reading key files; `require_signed`: refuse
    /// unsigned requests. The error names the key at fault
    /// (`requesters[0].public_key`) and never quotes a key.
    pub(crate) fn new(
        entries: &[RequesterSettings],
        require_signed: bool,
    ) -> Result<Self, (String, String)> {
        Self::build(entries, require_signed, None)
    }

    /// As [`new`](Self::new), for a reload: an entry whose key cannot be
    /// used (its file deleted, unreadable or not a key; no key, or two) is
    /// left out, and its (key, why) returned, instead of refusing the
    /// reload. Deleting or replacing a key file and sending SIGHUP is how a
    /// key is revoked: refusing the reload would keep trusting the old key
    /// (fail open). Any other error still fails.
    pub(crate) fn without_unusable_keys(
        entries: &[RequesterSettings],
        require_signed: bool,
    ) -> Result<(Self, Vec<AtFault>), AtFault> {
        let mut left_out = Vec::new();
        let requesters = Self::build(entries, require_signed, Some(&mut left_out))?;
        Ok((requesters, left_out))
    }

    /// `left_out`: where to put the entries whose key cannot be used, or
    /// `None` to fail on the first.
    fn build(
        entries: &[RequesterSettings],
        require_signed: bool,
        mut left_out: Option<&mut Vec<AtFault>>,
    ) -> Result<Self, (String, String)> {
        let mut signers = HashMap::new();
        let mut permits = HashMap::new();
        // A token names its signer in `iss`, which only the key binds:
        // two entries sharing a key would let either's holder sign as the
        // other, with the other's allowances.
        let mut keys = HashMap::new();
        for (index, entry) in entries.iter().enumerate() {
            let at = |key: &str| format!("requesters[{index}].{key}");
            let name = &entry.name;
            valid_name(name).map_err(|why| (at("name"), why))?;
            if permits.contains_key(name) {
                return Err((at("name"), format!("{name:?} is configured twice")));
            }
            let allow = entry
                .allow
                .iter()
                .enumerate()
                .map(|(i, raw)| {
                    Pattern::parse(raw).map_err(|why| (at(&format!("allow[{i}]")), why))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let quota = match &entry.quota {
                None => None,
                Some(QuotaSettings { max: 0, .. }) => {
                    return Err((
                        at("quota.max"),
                        "must be at least 1 (leave [requesters.quota] out for none)".into(),
                    ));
                }
                Some(QuotaSettings { window, .. }) if window.is_zero() => {
                    return Err((at("quota.window"), "must be longer than 0s".into()));
                }
                Some(quota) => Some((quota.max, quota.window)),
            };
            let signer = match (signer(entry), left_out.as_deref_mut()) {
                (Ok(signer), _) => signer,
                (Err((key, why)), Some(left_out)) => {
                    left_out.push((at(key), why));
                    // The name stays taken, so that a second entry of the
                    // same name is still refused.
                    permits.insert(name.clone(), None);
                    continue;
                }
                (Err((key, why)), None) => return Err((at(key), why)),
            };
            if let Some(first) = keys.insert(signer.fingerprint(), name.clone()) {
                let key = if entry.public_key.is_some() {
                    "public_key"
                } else {
                    "public_key_file"
                };
                return Err((
                    at(key),
                    format!(
                        "is requester {first:?}'s key too: whoever holds it could sign as \
                         either (a token names its requester, only the key proves it); give \
                         each requester a key of its own (`mandrill keygen NAME`)"
                    ),
                ));
            }
            signers.insert(name.clone(), signer);
            permits.insert(
                name.clone(),
                Some(Permit {
                    allow,
                    groups: entry.groups.clone(),
                    quota,
                }),
            );
        }
        Ok(Self {
            signatures: Signatures::new(signers, require_signed),
            permits: permits
                .into_iter()
                .filter_map(|(name, permit)| Some((name, permit?)))
                .collect(),
        })
    }

    /// These requesters less every one whose entry in `entries` (the
    /// `[[requesters]]` of a reload that was refused for another key) is
    /// gone or differs in its key, `allow`, `groups` or quota; and the
    /// names of those left out. The edit that could not be applied may
    /// have been a revocation: trusting the old entry would fail open.
    pub(crate) fn keeping_unchanged(&self, entries: &[RequesterSettings]) -> (Self, Vec<String>) {
        let mut kept = self.clone();
        let mut revoked = Vec::new();
        for (name, permit) in &self.permits {
            let unchanged = entries
                .iter()
                .find(|entry| &entry.name == name)
                .and_then(|entry| {
                    Self::build(std::slice::from_ref(entry), false, Some(&mut Vec::new())).ok()
                })
                .is_some_and(|new| {
                    new.permits.get(name) == Some(permit)
                        && new.signatures.fingerprint(name).is_some()
                        && new.signatures.fingerprint(name) == self.signatures.fingerprint(name)
                });
            if !unchanged {
                revoked.push(name.clone());
            }
        }
        kept.permits.retain(|name, _| !revoked.contains(name));
        kept.signatures = kept
            .signatures
            .retaining(|name| !revoked.contains(&name.to_owned()));
        revoked.sort();
        (kept, revoked)
    }

    /// No requester, and unsigned requests refused: what an invalid
    /// configuration falls back to (fail closed).
    pub(crate) fn refuse_unsigned() -> Self {
        Self {
            signatures: Signatures::new(HashMap::new(), true),
            permits: HashMap::new(),
        }
    }

    /// These requesters, accepting only tokens for `audience`
    /// (`safety.audience`) when one is set.
    pub(crate) fn for_audience(self, audience: Option<String>) -> Self {
        Self {
            signatures: self.signatures.for_audience(audience),
            ..self
        }
    }

    /// The keys a payload is verified with, and whether one is required.
    pub(crate) fn signatures(&self) -> &Signatures {
        &self.signatures
    }

    /// `Ok` if the request's verified requester (if any) may restart its
    /// instance in `group`, the group the operator's configuration puts
    /// the instance in; else why not, naming the requester: what a denied
    /// request records. An unsigned request is not this check's to refuse.
    /// The signature is checked again at `now` against the keys in force
    /// ([`Signatures::still_valid`]): this runs before the claim and again
    /// right before the restart, after whatever the request waited on.
    pub(crate) fn check(
        &self,
        request: &RestartRequest,
        group: &str,
        now: SystemTime,
    ) -> Result<(), String> {
        let Some(name) = request.requester.as_deref() else {
            return Ok(());
        };
        let instance = request.instance_name.as_str();
        if let Some(terms) = request.signature {
            self.signatures.still_valid(name, terms, now)?;
        }
        let Some(permit) = self.permits.get(name) else {
            // Removed by a reload since the request was verified.
            return Err(format!(
                "denied: requester {name} is no longer configured in [[requesters]]"
            ));
        };
        if !permit.allow.iter().any(|p| p.matches(instance)) {
            return Err(format!(
                "denied: requester {name} may not restart {instance} (matches none of its allow patterns)"
            ));
        }
        // Only the operator's group: a message naming another one
        // (`requested_group`) was denied by `Policy::place` before
        // eligibility, so a message cannot name its way into a group.
        if !permit.groups.is_empty() && !permit.groups.iter().any(|g| g == group) {
            return Err(format!(
                "denied: requester {name} may not restart {instance} in group {group} \
                 (its groups: {})",
                permit.groups.join(", ")
            ));
        }
        Ok(())
    }

    /// `Err` with the denial's reason when the request's verified requester
    /// may not restart `alias`, another entry of the inventory at the same
    /// address as the request's instance: one machine, so a requester's
    /// `allow` must admit it by every name it has.
    pub(crate) fn check_alias(&self, request: &RestartRequest, alias: &str) -> Result<(), String> {
        let Some(name) = request.requester.as_deref() else {
            return Ok(());
        };
        // A requester removed since is refused by `check`.
        let Some(permit) = self.permits.get(name) else {
            return Ok(());
        };
        if permit.allow.iter().any(|p| p.matches(alias)) {
            return Ok(());
        }
        Err(format!(
            "denied: requester {name} may not restart {}: it is also {alias} (the same address \
             in the inventory), which matches none of its allow patterns",
            request.instance_name
        ))
    }

    /// Adds the request's requester's quota to the claim's limits.
    pub(crate) fn limit(&self, request: &RestartRequest, limits: &mut Limits) {
        if let Some((max, window)) = request
            .requester
            .as_deref()
            .and_then(|name| self.permits.get(name))
            .and_then(|permit| permit.quota)
        {
            limits.requester_max = Some(max);
            limits.requester_window = window;
        }
    }

    /// The longest quota window: pruning must keep the journal that long.
    pub(crate) fn lookback(&self) -> Duration {
        self.permits
            .values()
            .filter_map(|permit| permit.quota.map(|(_, window)| window))
            .max()
            .unwrap_or_default()
    }
}

/// The entry's key: else the key at fault (`public_key_file`) and why,
/// never quoting the key.
fn signer(entry: &RequesterSettings) -> Result<Signer, (&'static str, String)> {
    let pem = match (&entry.public_key, &entry.public_key_file) {
        (Some(pem), None) => pem.clone(),
        (None, Some(path)) => std::fs::read_to_string(path).map_err(|error| {
            (
                "public_key_file",
                format!("cannot read {}: {error}", path.display()),
            )
        })?,
        (Some(_), Some(_)) => {
            return Err((
                "public_key",
                "give public_key or public_key_file, not both".into(),
            ));
        }
        (None, None) => {
            return Err(("public_key", "is required (or public_key_file)".into()));
        }
    };
    let key_field = if entry.public_key.is_some() {
        "public_key"
    } else {
        "public_key_file"
    };
    Signer::from_pem(&pem).map_err(|why| (key_field, why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::request;

    const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAiXnPth0YTU/nwanl6fRVhSdyP7GowJ3i9meT7iYSEjw=
-----END PUBLIC KEY-----
";

    /// A key of each test requester's own: one key is one requester.
    fn public_key(name: &str) -> String {
        let body = match name {
            "bob" => "MCowBQYDK2VwAyEAo3QB/utf+Gz8FSEkzUCPoLcMrIKSbjEbTl8TjSHsKsM=",
            "carol" => "MCowBQYDK2VwAyEATMk029WTC5Q/NlNv6ZeeQeBfN6et7EQRx7uR0VfatOw=",
            "dave" => "MCowBQYDK2VwAyEARChNB34Ygjnz9UQkXGWZs8XHuibL5DnNZxmWPxBFyow=",
            _ => return ED_PUBLIC.into(),
        };
        format!("-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n")
    }

    fn entry(name: &str) -> RequesterSettings {
        RequesterSettings {
            name: name.into(),
            public_key: Some(public_key(name)),
            public_key_file: None,
            allow: vec!["cattle-*".into()],
            groups: Vec::new(),
            quota: None,
        }
    }

    fn signed_by(name: &str, instance: &str) -> RestartRequest {
        let mut request = request(instance);
        request.requester = Some(name.into());
        request
    }

    #[test]
    fn a_requesters_allow_must_admit_every_alias_of_the_machine() {
        let requesters = Requesters::new(&[entry("alice")], true).unwrap();
        let signed = signed_by("alice", "cattle-a9");
        assert!(requesters.check_alias(&signed, "cattle-b9").is_ok());
        let denied = requesters.check_alias(&signed, "db-primary").unwrap_err();
        assert!(
            denied.contains("requester alice may not restart cattle-a9")
                && denied.contains("db-primary"),
            "{denied}"
        );
        // Unsigned: not this check's to refuse.
        let unsigned = request("cattle-a9");
        assert!(requesters.check_alias(&unsigned, "db-primary").is_ok());
    }

    #[test]
    fn a_requester_is_denied_outside_its_allow_and_groups_and_named() {
        let requesters = Requesters::new(
            &[RequesterSettings {
                groups: vec!["cattle".into()],
                ..entry("alice")
            }],
            true,
        )
        .unwrap();
        assert!(requesters.signatures().required());
        assert!(
            requesters
                .check(
                    &signed_by("alice", "cattle-ab12"),
                    "cattle",
                    SystemTime::now()
                )
                .is_ok()
        );
        let outside = requesters
            .check(&signed_by("alice", "pet-01"), "pet", SystemTime::now())
            .unwrap_err();
        assert!(
            outside.contains("requester alice may not restart pet-01"),
            "{outside}"
        );
        // The operator puts cattle-db01 in group db: not alice's.
        let group = requesters
            .check(&signed_by("alice", "cattle-db01"), "db", SystemTime::now())
            .unwrap_err();
        assert!(group.contains("in group db"), "{group}");
        // The group checked is the one given, the operator's, once: not
        // the request's field as well.
        let mut named = signed_by("alice", "cattle-db01");
        named.group = Some("cattle".into());
        assert!(requesters.check(&named, "db", SystemTime::now()).is_err());
        let mut named = signed_by("alice", "cattle-ab12");
        named.group = Some("web".into());
        assert!(
            requesters
                .check(&named, "cattle", SystemTime::now())
                .is_ok()
        );
        // A requester removed by a reload is denied; unsigned is not this
        // check's business.
        let gone = requesters
            .check(
                &signed_by("bob", "cattle-ab12"),
                "cattle",
                SystemTime::now(),
            )
            .unwrap_err();
        assert!(gone.contains("bob is no longer configured"), "{gone}");
        assert!(
            requesters
                .check(&request("pet-01"), "pet", SystemTime::now())
                .is_ok()
        );
    }

    #[test]
    fn a_signed_request_carries_its_requesters_quota_into_the_claim() {
        let requesters = Requesters::new(
            &[RequesterSettings {
                quota: Some(QuotaSettings {
                    max: 2,
                    window: Duration::from_secs(3600),
                }),
                ..entry("alice")
            }],
            false,
        )
        .unwrap();
        let mut limits = Limits::NONE;
        requesters.limit(&request("cattle-ab12"), &mut limits);
        assert_eq!(limits.requester_max, None, "unsigned: no quota");
        requesters.limit(&signed_by("alice", "cattle-ab12"), &mut limits);
        assert_eq!(limits.requester_max, Some(2));
        assert_eq!(limits.requester_window, Duration::from_secs(3600));
        assert_eq!(requesters.lookback(), Duration::from_secs(3600));
    }

    #[test]
    fn a_bad_entry_fails_naming_its_key() {
        let cases = [
            (
                RequesterSettings {
                    public_key: Some("-----BEGIN PUBLIC KEY-----\nnope\n".into()),
                    ..entry("alice")
                },
                "requesters[0].public_key",
            ),
            (
                RequesterSettings {
                    public_key: None,
                    public_key_file: Some("/nonexistent/alice.pub".into()),
                    ..entry("alice")
                },
                "requesters[0].public_key_file",
            ),
            (
                RequesterSettings {
                    public_key: None,
                    ..entry("alice")
                },
                "requesters[0].public_key",
            ),
            (entry("../alice"), "requesters[0].name"),
            (
                RequesterSettings {
                    allow: vec!["".into()],
                    ..entry("alice")
                },
                "requesters[0].allow[0]",
            ),
            (
                RequesterSettings {
                    quota: Some(QuotaSettings {
                        max: 0,
                        window: Duration::from_secs(60),
                    }),
                    ..entry("alice")
                },
                "requesters[0].quota.max",
            ),
        ];
        for (settings, key) in cases {
            let (at, why) = Requesters::new(&[settings], true).unwrap_err();
            assert_eq!(at, key, "{why}");
            assert!(!why.contains("MCow"), "a key is never quoted: {why}");
        }
        // One key for two requesters: either's holder could sign as the
        // other.
        let shared = RequesterSettings {
            public_key: Some(ED_PUBLIC.into()),
            ..entry("bob")
        };
        let (at, why) = Requesters::new(&[entry("alice"), shared], true).unwrap_err();
        assert_eq!(at, "requesters[1].public_key");
        assert!(why.contains("\"alice\"'s key too"), "{why}");
        let (at, _) = Requesters::new(&[entry("alice"), entry("alice")], true).unwrap_err();
        assert_eq!(at, "requesters[1].name");
    }

    #[test]
    fn on_reload_an_entry_whose_key_cannot_be_used_is_left_out_naming_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let corrupt = dir.path().join("bob.pub");
        std::fs::write(&corrupt, "not a key").unwrap();
        let entries = [
            entry("alice"),
            RequesterSettings {
                public_key: None,
                public_key_file: Some(corrupt),
                ..entry("bob")
            },
            RequesterSettings {
                public_key: None,
                public_key_file: Some(dir.path().join("deleted.pub")),
                ..entry("carol")
            },
            RequesterSettings {
                public_key: None,
                ..entry("dave")
            },
        ];
        let (requesters, left_out) = Requesters::without_unusable_keys(&entries, true).unwrap();
        let keys: Vec<&str> = left_out.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "requesters[1].public_key_file",
                "requesters[2].public_key_file",
                "requesters[3].public_key",
            ]
        );
        assert!(requesters.signatures().required());
        assert!(
            requesters
                .check(
                    &signed_by("alice", "cattle-ab12"),
                    "cattle",
                    SystemTime::now()
                )
                .is_ok()
        );
        for name in ["bob", "carol", "dave"] {
            let why = requesters
                .check(&signed_by(name, "cattle-ab12"), "cattle", SystemTime::now())
                .unwrap_err();
            assert!(why.contains("no longer configured"), "{why}");
        }
        // What the configuration's text gets wrong still refuses the reload,
        // a left-out entry's name included.
        let (at, _) = Requesters::without_unusable_keys(
            &[
                entry("alice"),
                RequesterSettings {
                    allow: vec!["".into()],
                    ..entry("bob")
                },
            ],
            true,
        )
        .unwrap_err();
        assert_eq!(at, "requesters[1].allow[0]");
        let (at, _) =
            Requesters::without_unusable_keys(&[entries[2].clone(), entry("carol")], true)
                .unwrap_err();
        assert_eq!(at, "requesters[1].name");
        // At start-up, the first unusable key fails.
        let (at, _) = Requesters::new(&entries, true).unwrap_err();
        assert_eq!(at, "requesters[1].public_key_file");
    }

    /// A reload refused for another key still revokes each requester whose
    /// entry it removes or changes (key, allow, groups, quota); the others
    /// stay trusted.
    #[test]
    fn a_refused_reload_keeps_only_the_requesters_it_leaves_unchanged() {
        const OTHER_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEZpcC+wXjHJWk+hudTxVEj/SobKJ8
w05iow7Fx4RuGrwsPegFABmbHNE9Zuyf1LKSs8IrDZAP7MMxt/hP19EaZw==
-----END PUBLIC KEY-----
";
        let running = Requesters::new(
            &[entry("alice"), entry("bob"), entry("carol"), entry("dave")],
            true,
        )
        .unwrap();
        let reloaded = [
            // alice as she was; bob removed.
            entry("alice"),
            RequesterSettings {
                public_key: Some(OTHER_PUBLIC.into()),
                ..entry("carol")
            },
            RequesterSettings {
                allow: vec!["*".into()],
                ..entry("dave")
            },
        ];
        let (kept, revoked) = running.keeping_unchanged(&reloaded);
        assert_eq!(revoked, ["bob", "carol", "dave"]);
        let now = SystemTime::now();
        assert!(
            kept.check(&signed_by("alice", "cattle-ab12"), "cattle", now)
                .is_ok()
        );
        for name in ["bob", "carol", "dave"] {
            assert!(
                kept.check(&signed_by(name, "cattle-ab12"), "cattle", now)
                    .is_err()
            );
            assert_eq!(kept.signatures().fingerprint(name), None);
        }
        assert!(kept.signatures().required(), "the rest stays as it was");
    }
}
