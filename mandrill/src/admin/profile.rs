//! `/debug/pprof/profile?seconds=N[&format=svg]`: a CPU profile of the live
//! process, sampled with SIGPROF by the `pprof` crate: the pprof protobuf
//! (`go tool pprof`, Grafana Pyroscope) by default, a flamegraph with
//! `format=svg`. Behind the token (`auth::token_required`); one profile at a
//! time.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State as Shared};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pprof::protos::Message as _;

use super::State;

/// The longest profile: a request holds a connection (and the shutdown, at
/// most this long) while it samples.
const MAX_SECONDS: u64 = 60;
/// Samples per second; not a multiple of common timer rates.
const FREQUENCY: i32 = 99;

/// The profiler is process-wide: a second request waits for none, it is
/// refused.
static PROFILING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) async fn profile(
    Shared(state): Shared<Arc<State>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    // A GET that costs the process a core for up to a minute: without
    // `admin.token` any page in the operator's browser could start one
    // with an `<img>`, which carries no Origin but says where it comes
    // from. A tool (curl, `go tool pprof`) or the address bar says nothing
    // or `none`.
    if headers
        .get("sec-fetch-site")
        .is_some_and(|site| !matches!(site.as_bytes(), b"same-origin" | b"none"))
    {
        return text(
            StatusCode::FORBIDDEN,
            "a profile is not taken for another site's page".into(),
        );
    }
    let mut seconds = 10;
    let mut svg = false;
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match (&*key, &*value) {
            ("seconds", n) => match n.parse::<u64>() {
                Ok(n) if (1..=MAX_SECONDS).contains(&n) => seconds = n,
                _ => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!("seconds must be 1 to {MAX_SECONDS}"),
                    );
                }
            },
            ("format", "svg") => svg = true,
            ("format", "pprof" | "proto") => svg = false,
            (other, _) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("unknown parameter {other:?}"),
                );
            }
        }
    }
    let Ok(_only_one) = PROFILING.try_lock() else {
        return text(
            StatusCode::CONFLICT,
            "a profile is already being taken".into(),
        );
    };
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        Err(error) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot profile: {error}"),
            );
        }
    };
    // Cut short by a shutdown, so that a long profile never holds the exit.
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        () = state.shutdown.requested() => {}
    }
    let report = match guard.report().build() {
        Ok(report) => report,
        Err(error) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot report: {error}"),
            );
        }
    };
    drop(guard);
    let mut body = Vec::new();
    if svg {
        if let Err(error) = report.flamegraph(&mut body) {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot draw: {error}"),
            );
        }
        return ([(header::CONTENT_TYPE, "image/svg+xml")], body).into_response();
    }
    match report.pprof() {
        Ok(profile) => {
            // Encoding into a Vec cannot fail for want of space.
            let _ = profile.encode(&mut body);
            ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
        }
        Err(error) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode: {error}"),
        ),
    }
}

fn text(status: StatusCode, message: String) -> Response {
    (status, message + "\n").into_response()
}
