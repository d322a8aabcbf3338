//! The SQL migrations, embedded at compile time without sqlx's `macros`
//! feature.
//!
//! `sqlx::migrate!` is the only reason to build sqlx's proc-macro, and that
//! proc-macro compiles sqlx, its SQLite (with the bundled C library) and
//! tokio a second time for the host (docs/benchmarks.md, "Build", has the
//! measured cost). Here each file is `include_str!`ed (so editing one
//! rebuilds the crate, as with the macro) and turned into a
//! [`Migration`] by sqlx's own [`Migration::new`], which computes the
//! checksum exactly as `migrate!` does (SHA-384 of the file's text): a
//! database migrated by an earlier build still matches.
//!
//! One function per migration set (a directory of `migrations/`); a new set
//! is one more function and one more line in the tests' `SETS`. The tests
//! check each set against what sqlx reads from its directory, so a file or
//! a directory added but not listed here fails them.

use std::borrow::Cow;
use std::sync::LazyLock;

use sqlx::migrate::{Migration, MigrationType, Migrator};

/// A `Vec<Migration>` from files of `migrations/$dir`, in the order given
/// (ascending versions, as sqlx applies them).
macro_rules! embed {
    ($dir:literal: $($file:literal),+ $(,)?) => {
        vec![$(
            migration(
                $file,
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/", $dir, "/", $file)),
            )
        ),+]
    };
}

/// The SQLite queue's migrations (`migrations/sqlite/queue`): only its own
/// tables. sqlx keeps one `_sqlx_migrations` table per file, and the queue
/// and the store share the file by default: each finds the other's versions
/// there (the numbers are disjoint) and must not take them for unknown
/// ones, hence `ignore_missing`.
pub(crate) fn sqlite_queue() -> &'static Migrator {
    static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| Migrator {
        ignore_missing: true,
        ..migrator(embed!("sqlite/queue": "0002_queue.sql"))
    });
    &MIGRATOR
}

/// The SQLite store's migrations (`migrations/sqlite/store`): only its own
/// tables; see [`sqlite_queue`] for `ignore_missing`.
pub(crate) fn sqlite_store() -> &'static Migrator {
    static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| Migrator {
        ignore_missing: true,
        ..migrator(embed!("sqlite/store":
            "0001_requests.sql",
            "0003_claims.sql",
            "0005_control.sql",
            "0006_journal.sql",
            "0007_journal_zone_requester.sql",
            "0008_claim_token.sql",
            "0009_campaigns.sql",
            "0010_group_pauses.sql",
            "0011_request_identity.sql",
            "0012_leash.sql",
            "0013_campaign_stop.sql",
            "0014_write_less.sql",
        ))
    });
    &MIGRATOR
}

/// The PostgreSQL store's migrations (`migrations/postgres`).
pub(crate) fn postgres() -> &'static Migrator {
    static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
        migrator(embed!("postgres":
            "0001_requests.sql",
            "0002_claims.sql",
            "0004_control.sql",
            "0005_journal.sql",
            "0006_journal_zone_requester.sql",
            "0007_claim_token.sql",
            "0008_campaigns.sql",
            "0009_group_pauses.sql",
            "0010_request_identity.sql",
            "0011_leash.sql",
            "0012_campaign_stop.sql",
            "0013_write_less.sql",
        ))
    });
    &MIGRATOR
}

/// A migrator with sqlx's defaults (locking on, missing versions an error),
/// as `migrate!` builds it.
fn migrator(migrations: Vec<Migration>) -> Migrator {
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

/// One migration from its file name and text, named as sqlx names it when
/// it reads a directory (`sqlx_core::migrate::resolve_blocking`):
/// `{version}_{description}.sql`, underscores in the description read as
/// spaces, `.up.sql`/`.down.sql` reversible, a first line of
/// `-- no-transaction` run outside a transaction.
fn migration(file_name: &'static str, sql: &'static str) -> Migration {
    // Only this module's own literals reach here: a bad name is a typo in
    // the list above, which every test run (and every start) shows at once.
    let (version, rest) = file_name
        .split_once('_')
        .expect("a migration file is named {version}_{description}.sql");
    let version = version
        .parse()
        .expect("a migration file name starts with an integer version");
    let migration_type = MigrationType::from_filename(rest);
    let description = rest
        .trim_end_matches(migration_type.suffix())
        .replace('_', " ");
    let no_tx = sql.starts_with("-- no-transaction");
    Migration::new(
        version,
        Cow::Owned(description),
        migration_type,
        Cow::Borrowed(sql),
        no_tx,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What matters to a database: sqlx compares versions and checksums
    /// with what it applied before; description, type and transaction mode
    /// decide how a new one runs.
    fn summary(migrator: &Migrator) -> Vec<(i64, String, MigrationType, bool, Vec<u8>)> {
        migrator
            .iter()
            .map(|m| {
                (
                    m.version,
                    m.description.to_string(),
                    m.migration_type,
                    m.no_tx,
                    m.checksum.to_vec(),
                )
            })
            .collect()
    }

    /// sqlx's own reading of a directory at run time, the code the
    /// `migrate!` macro runs at compile time.
    async fn from_directory(dir: &str) -> Migrator {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(dir);
        Migrator::new(path).await.expect("migrations directory")
    }

    /// A set's function.
    type Set = fn() -> &'static Migrator;

    /// Every set, by its directory under `migrations/`.
    const SETS: &[(&str, Set)] = &[
        ("sqlite/queue", sqlite_queue),
        ("sqlite/store", sqlite_store),
        ("postgres", postgres),
    ];

    #[tokio::test]
    async fn every_directory_is_embedded_version_by_version_and_checksum_by_checksum() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        // Every directory holding `.sql` files is a set.
        fn sets_below(dir: &std::path::Path, root: &std::path::Path, found: &mut Vec<String>) {
            let mut has_sql = false;
            for entry in std::fs::read_dir(dir).expect("migrations directory") {
                let path = entry.expect("directory entry").path();
                if path.is_dir() {
                    sets_below(&path, root, found);
                } else if path.extension().is_some_and(|ext| ext == "sql") {
                    has_sql = true;
                }
            }
            if has_sql {
                let relative = dir.strip_prefix(root).expect("below the root");
                found.push(relative.to_string_lossy().into_owned());
            }
        }
        let mut directories = Vec::new();
        sets_below(&root, &root, &mut directories);
        directories.sort();
        let mut embedded: Vec<String> = SETS.iter().map(|(dir, _)| dir.to_string()).collect();
        embedded.sort();
        assert_eq!(directories, embedded, "each directory has its function");
        for (dir, set) in SETS {
            assert_eq!(summary(set()), summary(&from_directory(dir).await), "{dir}");
        }
    }

    #[test]
    fn file_names_are_read_as_sqlx_reads_them() {
        let m = migration("0042_add_a_thing.sql", "SELECT 1");
        assert_eq!(
            (m.version, m.description.as_ref(), m.no_tx),
            (42, "add a thing", false)
        );
        assert_eq!(m.migration_type, MigrationType::Simple);
        let m = migration("7_undo_it.down.sql", "-- no-transaction\nSELECT 1");
        assert_eq!(
            (m.version, m.description.as_ref(), m.no_tx),
            (7, "undo it", true)
        );
        assert_eq!(m.migration_type, MigrationType::ReversibleDown);
    }
}
