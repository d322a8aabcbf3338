//! The generated admin token: when `admin.token` is not set, the kill
//! switch's endpoints still need a credential (a loopback address keeps
//! out other hosts, not other processes on this one), so the service makes
//! one and writes it where only its own user can read it.
//!
//! The file is reused while it exists (instances sharing a SQLite file
//! share its token file, and a restart keeps the operator's copy valid);
//! removing it and restarting rotates the token. A file that others could
//! read, or that is not this user's, is refused rather than trusted.

use std::io::{ErrorKind, Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use anyhow::{Context as _, bail};
use rand::RngCore as _;

use crate::settings::Secret;

/// Random bytes in a generated token (hex-encoded: 64 characters).
const TOKEN_BYTES: usize = 32;

/// Longest token read back from a file.
const MAX_TOKEN_CHARS: usize = 1024;

/// The token in `path`, made (mode 0600) if the file does not exist yet.
/// Errors name the path.
pub(crate) fn load_or_create(path: &Path) -> anyhow::Result<Secret> {
    // Twice at most: another instance may create the file between our
    // look and our link; then its token is the one to use.
    for _ in 0..2 {
        match read(path)? {
            Some(token) => return Ok(token),
            None => {
                if let Some(token) = create(path)? {
                    return Ok(token);
                }
            }
        }
    }
    bail!(
        "admin token file {} keeps appearing and disappearing",
        path.display()
    )
}

/// The token the file holds; `None` if there is no file.
fn read(path: &Path) -> anyhow::Result<Option<Secret>> {
    // Not through a symbolic link: the file must be the one named.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut file = match opened {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(error)
                .with_context(|| format!("cannot open the admin token file {}", path.display()));
        }
    };
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot read the admin token file {}", path.display()))?;
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    if !metadata.is_file() || metadata.uid() != user || metadata.mode() & 0o077 != 0 {
        bail!(
            "the admin token file {} must be a file of this user (uid {user}) readable by \
             it alone (mode 0600); it is uid {} mode {:o}: remove it and a new one is made",
            path.display(),
            metadata.uid(),
            metadata.mode() & 0o7777
        );
    }
    let mut text = String::new();
    std::io::Read::by_ref(&mut file)
        .take(MAX_TOKEN_CHARS as u64 + 2)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the admin token file {}", path.display()))?;
    let token = Secret(text.trim().to_owned());
    if token.0.chars().count() > MAX_TOKEN_CHARS || !token.fits_a_header() {
        bail!(
            "the admin token file {} holds no token (one line of at most {MAX_TOKEN_CHARS} \
             printable ASCII characters): remove it and a new one is made",
            path.display()
        );
    }
    Ok(Some(token))
}

/// Writes a new token to `path`; `None` if another process made the file
/// first. Written to a private file beside it and linked into place, so
/// that nobody ever reads a half-written token or a looser mode.
fn create(path: &Path) -> anyhow::Result<Option<Secret>> {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    let directory = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temporary = tempfile::Builder::new()
        .prefix(".admin-token.")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(directory)
        .with_context(|| {
            format!(
                "cannot write the admin token file {} (set admin.token_file to a \
                 directory this user can write, or set admin.token)",
                path.display()
            )
        })?;
    temporary
        .write_all(format!("{token}\n").as_bytes())
        .and_then(|()| temporary.as_file().sync_all())
        .with_context(|| format!("cannot write the admin token file {}", path.display()))?;
    // The temporary file is removed when dropped, the link stays.
    match std::fs::hard_link(temporary.path(), path) {
        Ok(()) => Ok(Some(Secret(token))),
        Err(error) if error.kind() == ErrorKind::AlreadyExists => Ok(None),
        Err(error) => Err(error)
            .with_context(|| format!("cannot write the admin token file {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_made_private_then_reused_and_a_readable_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-token");
        let made = load_or_create(&path).unwrap();
        assert_eq!(made.0.len(), 2 * TOKEN_BYTES);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        assert_eq!(
            load_or_create(&path).unwrap(),
            made,
            "reused while it exists"
        );
        // Nothing else left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_or_create(&path).unwrap_err().to_string();
        assert!(
            error.contains("mode 0600") && error.contains("644"),
            "{error}"
        );

        let linked = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &linked).unwrap();
        assert!(
            load_or_create(&linked).is_err(),
            "a symbolic link is refused"
        );

        let missing = dir.path().join("no/such/dir/admin-token");
        let error = format!("{:#}", load_or_create(&missing).unwrap_err());
        assert!(error.contains("admin.token_file"), "{error}");
    }
}
