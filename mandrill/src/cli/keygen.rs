//! `mandrill keygen NAME`: an Ed25519 key pair for a requester, and the
//! `[[requesters]]` entry that trusts it.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::Args;

use super::BadInput;
use crate::safety::requesters::valid_name;

/// `mandrill keygen`
#[derive(Debug, Args)]
pub(crate) struct KeygenArgs {
    /// The requester's name: the files are NAME.key and NAME.pub, and its
    /// tokens' `iss`.
    #[arg(value_name = "NAME")]
    name: String,
    /// Where to write the key pair.
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
}

/// A PKCS#8 v1 `PrivateKeyInfo` for Ed25519 (RFC 8410) before its 32-byte
/// seed: version 0, algorithm 1.3.101.112, the seed as an OCTET STRING in
/// an OCTET STRING.
const PKCS8_ED25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];
/// An Ed25519 `SubjectPublicKeyInfo` (RFC 8410) before its 32-byte key.
const SPKI_ED25519_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// An Ed25519 key pair as PEM: (PKCS#8 private key, SPKI public key).
pub(crate) fn ed25519_pem_pair() -> anyhow::Result<(String, String)> {
    use ring::rand::{SecureRandom as _, SystemRandom};
    let mut seed = [0u8; 32];
    SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| anyhow::anyhow!("the operating system's random generator failed"))?;
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed)
        .map_err(|_| anyhow::anyhow!("cannot derive the Ed25519 public key"))?;
    let public = ring::signature::KeyPair::public_key(&pair).as_ref();
    let private_der = [&PKCS8_ED25519_PREFIX[..], &seed].concat();
    let public_der = [&SPKI_ED25519_PREFIX[..], public].concat();
    seed.fill(0);
    Ok((
        pem("PRIVATE KEY", &private_der),
        pem("PUBLIC KEY", &public_der),
    ))
}

/// DER as PEM, 64 columns.
fn pem(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        // Base64 is ASCII.
        text.push_str(std::str::from_utf8(line).expect("base64 is ascii"));
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

/// Writes `text` to a new file (never over an existing one) with `mode`.
fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|error| anyhow::anyhow!("cannot create {}: {error}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))
}

/// Writes NAME.key (0600) and NAME.pub, refusing to overwrite either, and
/// prints the entry to paste.
pub(super) fn keygen(args: &KeygenArgs) -> anyhow::Result<()> {
    if let Err(why) = valid_name(&args.name) {
        return Err(BadInput(format!("requester name {why}")).into());
    }
    let private_path = args.dir.join(format!("{}.key", args.name));
    let public_path = args.dir.join(format!("{}.pub", args.name));
    for path in [&private_path, &public_path] {
        if path.symlink_metadata().is_ok() {
            return Err(BadInput(format!(
                "{} exists; not overwriting a key (remove it or choose another name)",
                path.display()
            ))
            .into());
        }
    }
    let (private_pem, public_pem) = ed25519_pem_pair()?;
    write_new(&private_path, &private_pem, 0o600)?;
    if let Err(error) = write_new(&public_path, &public_pem, 0o644) {
        // No half pair left behind.
        let _ = std::fs::remove_file(&private_path);
        return Err(error);
    }
    let shown = std::path::absolute(&public_path).unwrap_or(public_path.clone());
    eprintln!(
        "mandrill: wrote {} (private, mode 0600: keep it with the requester) and {}",
        private_path.display(),
        public_path.display()
    );
    println!(
        "# Paste into mandrill's configuration to trust {name}'s signature:\n\
         [[requesters]]\n\
         name = \"{name}\"\n\
         # or public_key_file = {file}\n\
         public_key = '''\n{public_pem}'''\n\
         allow = [\"cattle-*\"]  # the instances {name} may restart\n\
         # groups = [\"cattle\"]  # and, if given, only in these groups\n\
         [requesters.quota]\n\
         max = 10\n\
         window = \"1h\"",
        name = args.name,
        file = toml::Value::String(shown.display().to_string()),
    );
    Ok(())
}
