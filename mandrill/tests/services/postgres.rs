//! A throwaway PostgreSQL database: a unique name, created on a server and
//! dropped (forcibly) when the value is dropped. The one copy: the library's
//! unit tests, the integration tests and the benchmark include this file
//! (`#[path]`).

// Each includer uses part of it.
#![allow(dead_code)]

use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// The server tests use; `MANDRILL_TEST_POSTGRES` overrides it.
pub fn server_url() -> String {
    std::env::var("MANDRILL_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/postgres".to_owned())
}

/// A database of its own, dropped afterwards.
pub struct TestDatabase {
    /// Its name, `{prefix}_{uuid}`.
    pub name: String,
    /// A URL to connect to it.
    pub url: String,
    /// The server's URL, to drop it from.
    admin_url: String,
}

impl TestDatabase {
    /// A database on the server tests use.
    pub async fn create() -> Self {
        Self::create_on(&server_url(), "mandrill_test").await
    }

    /// A database named `{prefix}_{uuid}` on the server `admin_url` names
    /// (a URL ending in a database to connect to).
    pub async fn create_on(admin_url: &str, prefix: &str) -> Self {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(admin_url)
            .await
            .expect("postgres reachable for tests");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        let (server, _) = admin_url.rsplit_once('/').expect("url has a database");
        Self {
            url: format!("{server}/{name}"),
            name,
            admin_url: admin_url.to_owned(),
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin_url = self.admin_url.clone();
        // Drop runs inside or outside a runtime; a thread with a short-lived
        // one does the work either way.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url).await?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .map(drop)
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}
