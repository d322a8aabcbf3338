//! The crawl's state in SQLite (`--state FILE`), so that a crawl stopped by
//! Ctrl-C, a crash or `kill -9` resumes where it stopped. The only module
//! that knows `rusqlite`.
//!
//! The file holds every URL seen (queued or done, with its depth), the
//! robots.txt of each host, the hosts that joined the scope by a seed's
//! redirect, and how many bytes of the output are committed. It is written
//! only by the output writer thread, in one transaction per batch, after
//! the batch's edges were written to the output file: on resume the output
//! is cut back to the committed length, so a page is either done with its
//! edges written exactly once, or not done and fetched again.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension as _, params};
use url::Url;

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// SQLite failed.
    #[error("crawl state {path}: {source}")]
    Sqlite {
        /// The state file.
        path: String,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The state was made by a run with another setting that shapes the
    /// output (resuming would mix two formats in one file).
    #[error("crawl state {path} was made with --{key} {stored}, not {given}")]
    Mismatch {
        /// The state file.
        path: String,
        /// The setting.
        key: String,
        /// Its value in the state.
        stored: String,
        /// Its value in this run.
        given: String,
    },
}

/// One change to the state, committed with the edges sent alongside it.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A URL was queued at this depth.
    Queued {
        /// The normalised URL.
        url: Url,
        /// Hops from the seed.
        depth: u32,
    },
    /// A URL is finished (fetched, failed, disallowed): never fetch it again.
    Done(Url),
    /// A URL was reached by a redirect: never queue it, but if it is
    /// already queued it stays queued (as the frontier's seen-set does).
    Seen(Url),
    /// A seed's redirect target joined the scope.
    ScopeSeed(Url),
    /// robots.txt of a host: `None` for no rules (allow all) or the whole
    /// host forbidden, per `disallow_all`; otherwise the file's bytes.
    Robots {
        /// The host key (origin).
        host: String,
        /// Whether a server error made the whole host off limits.
        disallow_all: bool,
        /// The robots.txt body, when one was served.
        body: Option<Vec<u8>>,
    },
}

/// What a previous run left, loaded at start.
#[derive(Debug, Default)]
pub struct Resumed {
    /// URLs queued but not done, with their depth, in the order queued.
    pub queued: Vec<(Url, u32)>,
    /// URLs done (or reached by a redirect).
    pub done: Vec<Url>,
    /// robots.txt per host: (host, disallow_all, body).
    pub robots: Vec<(String, bool, Option<Vec<u8>>)>,
    /// Hosts that joined the scope through a seed's redirect.
    pub scope_seeds: Vec<Url>,
    /// Bytes of the output file written and committed.
    pub output_len: u64,
}

/// An open state file.
#[derive(Debug)]
pub struct State {
    connection: Connection,
    path: String,
}

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS urls (
        id INTEGER PRIMARY KEY,
        url TEXT NOT NULL UNIQUE,
        depth INTEGER NOT NULL,
        done INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS robots (
        host TEXT PRIMARY KEY,
        disallow_all INTEGER NOT NULL,
        body BLOB
    );
    CREATE TABLE IF NOT EXISTS scope_seeds (url TEXT PRIMARY KEY);
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
";

impl State {
    /// Opens (or creates) the state file and loads what it holds.
    pub fn open(path: &Path) -> Result<(Self, Resumed), StateError> {
        let name = path.display().to_string();
        let wrap = |source| StateError::Sqlite {
            path: name.clone(),
            source,
        };
        let connection = Connection::open(path).map_err(wrap)?;
        // WAL with synchronous=NORMAL: a commit survives the process dying
        // (kill -9) without an fsync per batch; only a power cut may lose
        // the last batches, which are then fetched again.
        connection
            .execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
            .map_err(wrap)?;
        connection.execute_batch(SCHEMA).map_err(wrap)?;
        let state = Self {
            connection,
            path: name.clone(),
        };
        let resumed = state.load().map_err(wrap)?;
        Ok((state, resumed))
    }

    fn load(&self) -> rusqlite::Result<Resumed> {
        let mut resumed = Resumed::default();
        let mut urls = self
            .connection
            .prepare("SELECT url, depth, done FROM urls ORDER BY id")?;
        let mut rows = urls.query([])?;
        while let Some(row) = rows.next()? {
            let text: String = row.get(0)?;
            // Only areq writes this table, with URLs it parsed.
            let Ok(url) = Url::parse(&text) else { continue };
            if row.get::<_, bool>(2)? {
                resumed.done.push(url);
            } else {
                resumed.queued.push((url, row.get(1)?));
            }
        }
        let mut robots = self
            .connection
            .prepare("SELECT host, disallow_all, body FROM robots")?;
        resumed.robots = robots
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut seeds = self.connection.prepare("SELECT url FROM scope_seeds")?;
        resumed.scope_seeds = seeds
            .query_map([], |row| row.get::<_, String>(0))?
            .filter_map(|text| text.map(|text| Url::parse(&text).ok()).transpose())
            .collect::<rusqlite::Result<_>>()?;
        resumed.output_len = self
            .connection
            .query_row(
                "SELECT value FROM meta WHERE key = 'output_len'",
                [],
                |row| row.get(0),
            )
            .optional()?
            .unwrap_or(0);
        Ok(resumed)
    }

    /// Commits a batch of changes and the output length they go with, in
    /// one transaction.
    pub fn commit<'a>(
        &mut self,
        changes: impl IntoIterator<Item = &'a Change>,
        output_len: u64,
    ) -> Result<(), StateError> {
        self.try_commit(changes, output_len)
            .map_err(|source| StateError::Sqlite {
                path: self.path.clone(),
                source,
            })
    }

    /// Records a setting on a new state, or checks that it matches the
    /// one recorded.
    pub fn settle(&mut self, key: &str, value: &str) -> Result<(), StateError> {
        let sqlite = |source| StateError::Sqlite {
            path: self.path.clone(),
            source,
        };
        let stored: Option<String> = self
            .connection
            .query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |row| row.get(0),
            )
            .optional()
            .map_err(sqlite)?;
        match stored {
            None => {
                self.connection
                    .execute(
                        "INSERT INTO settings (key, value) VALUES (?1, ?2)",
                        params![key, value],
                    )
                    .map_err(sqlite)?;
                Ok(())
            }
            Some(stored) if stored == value => Ok(()),
            Some(stored) => Err(StateError::Mismatch {
                path: self.path.clone(),
                key: key.to_owned(),
                stored,
                given: value.to_owned(),
            }),
        }
    }

    fn try_commit<'a>(
        &mut self,
        changes: impl IntoIterator<Item = &'a Change>,
        output_len: u64,
    ) -> rusqlite::Result<()> {
        let transaction = self.connection.transaction()?;
        {
            let mut queued = transaction.prepare_cached(
                "INSERT INTO urls (url, depth, done) VALUES (?1, ?2, 0) ON CONFLICT (url) DO NOTHING",
            )?;
            let mut done = transaction.prepare_cached(
                "INSERT INTO urls (url, depth, done) VALUES (?1, 0, 1) \
                 ON CONFLICT (url) DO UPDATE SET done = 1",
            )?;
            let mut seen = transaction.prepare_cached(
                "INSERT INTO urls (url, depth, done) VALUES (?1, 0, 1) ON CONFLICT (url) DO NOTHING",
            )?;
            let mut robots = transaction.prepare_cached(
                "INSERT OR REPLACE INTO robots (host, disallow_all, body) VALUES (?1, ?2, ?3)",
            )?;
            let mut scope_seed = transaction
                .prepare_cached("INSERT OR IGNORE INTO scope_seeds (url) VALUES (?1)")?;
            for change in changes {
                match change {
                    Change::Queued { url, depth } => {
                        queued.execute(params![url.as_str(), depth])?;
                    }
                    Change::Done(url) => {
                        done.execute(params![url.as_str()])?;
                    }
                    Change::Seen(url) => {
                        seen.execute(params![url.as_str()])?;
                    }
                    Change::ScopeSeed(url) => {
                        scope_seed.execute(params![url.as_str()])?;
                    }
                    Change::Robots {
                        host,
                        disallow_all,
                        body,
                    } => {
                        robots.execute(params![host, disallow_all, body])?;
                    }
                }
            }
            transaction.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('output_len', ?1)",
                params![output_len],
            )?;
        }
        transaction.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("test URLs are valid")
    }

    #[test]
    fn what_is_committed_is_loaded_again_done_ends_a_queued_url_and_seen_does_not() {
        let dir = tempfile::tempdir().expect("a temporary directory can be made");
        let path = dir.path().join("state.db");
        let (mut state, resumed) = State::open(&path).expect("a new state opens");
        assert!(resumed.queued.is_empty() && resumed.done.is_empty());
        assert_eq!(resumed.output_len, 0);

        let changes = [
            Change::Queued {
                url: url("http://a.test/"),
                depth: 0,
            },
            Change::Queued {
                url: url("http://a.test/x"),
                depth: 1,
            },
            Change::Queued {
                url: url("http://a.test/y"),
                depth: 1,
            },
            Change::Done(url("http://a.test/")),
            Change::Seen(url("http://a.test/redirected-to")),
            Change::Seen(url("http://a.test/y")),
            Change::Queued {
                url: url("http://a.test/"),
                depth: 0,
            },
            Change::ScopeSeed(url("https://www.a.test/")),
            Change::Robots {
                host: "http://a.test".into(),
                disallow_all: false,
                body: Some(b"User-agent: *\nDisallow: /x\n".to_vec()),
            },
        ];
        state.commit(&changes, 1234).expect("the batch commits");
        drop(state);

        let (_, resumed) = State::open(&path).expect("the state opens again");
        let queued: Vec<(&str, u32)> = resumed
            .queued
            .iter()
            .map(|(u, d)| (u.as_str(), *d))
            .collect();
        assert_eq!(queued, [("http://a.test/x", 1), ("http://a.test/y", 1)]);
        let done: Vec<&str> = resumed.done.iter().map(Url::as_str).collect();
        assert_eq!(done, ["http://a.test/", "http://a.test/redirected-to"]);
        assert_eq!(resumed.scope_seeds, [url("https://www.a.test/")]);
        assert_eq!(
            resumed.robots,
            [(
                "http://a.test".to_owned(),
                false,
                Some(b"User-agent: *\nDisallow: /x\n".to_vec())
            )]
        );
        assert_eq!(resumed.output_len, 1234);
    }

    #[test]
    fn a_setting_is_recorded_once_and_then_checked() {
        let dir = tempfile::tempdir().expect("a temporary directory can be made");
        let path = dir.path().join("state.db");
        let (mut state, _) = State::open(&path).expect("a new state opens");
        state.settle("format", "tsv").expect("recorded");
        drop(state);
        let (mut state, _) = State::open(&path).expect("the state opens again");
        state
            .settle("format", "tsv")
            .expect("the same value matches");
        let error = state
            .settle("format", "dot")
            .expect_err("another value is refused");
        assert!(
            error
                .to_string()
                .ends_with("was made with --format tsv, not dot"),
            "{error}"
        );
    }
}
