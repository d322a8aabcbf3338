//! The admin server's routes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, State as Shared};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::auth::authorized;
use super::{State, bad_request, json};

/// Most history entries one request returns.
pub(super) const MAX_LIMIT: usize = 1_000;

pub(crate) fn router(state: Arc<State>) -> Router {
    // What only `admin.token` may read: the history names hosts and who
    // asked, a profile costs the process a CPU.
    let protected = Router::new()
        .route("/api/requests", get(requests))
        .route("/api/requests/{message_id}", get(request))
        .route("/api/campaigns/{id}", get(super::campaigns::status))
        .route("/debug/pprof/profile", get(super::profile::profile))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::auth::token_required,
        ));
    Router::new()
        .route("/", get(super::dashboard::serve))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/status", get(status))
        .route("/api/pause", post(super::switch::pause))
        .route("/api/resume", post(super::switch::resume))
        .route("/api/leash", post(super::switch::leash))
        .route("/api/unleash", post(super::switch::unleash))
        .route("/api/campaigns/{id}/stop", post(super::campaigns::stop))
        .merge(protected)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::auth::scrubbed,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::auth::guard,
        ))
        .with_state(state)
}

async fn metrics(Shared(state): Shared<Arc<State>>) -> Response {
    let mut text = state.metrics.render(
        &state.stats.snapshot(),
        &super::metrics::reasons(&state.stats),
        &crate::diagnostics::RuntimeMetrics::read(),
        state.leashed(),
        state.shutdown.is_requested(),
    );
    text.push_str(&super::metrics::render_histograms(&state.stats.timings));
    // The disruption budget in use, per group (nothing if the store does
    // not answer within `STORE_TIMEOUT`: /readyz says so).
    let policy = state.policy.current();
    // Together: a store that hangs holds the scrape for one bound.
    let (usage, switch, groups) = tokio::join!(
        super::switch::read_usage(&state),
        super::switch::read(&state),
        super::switch::read_groups(&state)
    );
    if let Ok(usage) = usage {
        text.push_str(&super::metrics::render_groups(&usage, |group| {
            policy.limits(group).ok().and_then(|limits| limits.budget)
        }));
    }
    if let Some(inventory) = &policy.inventory {
        text.push_str(&super::metrics::render_inventory(inventory));
    }
    let (pauses, judged) = groups.unwrap_or_default();
    text.push_str(&super::metrics::render_recovery(
        switch.ok().map(|s| s.paused),
        &pauses,
        &judged,
    ));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// How long the broker may take to answer the readiness probe.
const BROKER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the service should not be sent work, if it should not: shutting
/// down (from the moment it is requested, before the drain), the store
/// found down by the handlers, or the broker not answering for its backlog.
pub(crate) async fn not_ready(state: &State) -> Option<&'static str> {
    if state.shutdown.is_requested() {
        return Some("shutting down");
    }
    if state.stats.store_down.get() != 0 {
        return Some("store unreachable");
    }
    match tokio::time::timeout(BROKER_PROBE_TIMEOUT, state.broker.backlog()).await {
        Ok(Ok(_)) => None,
        Ok(Err(_)) | Err(_) => Some("broker unreachable"),
    }
}

async fn readyz(Shared(state): Shared<Arc<State>>) -> Response {
    match not_ready(&state).await {
        None => (StatusCode::OK, "ready\n".to_owned()).into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// Each schedule's next planned restarts, or why they are not shown: a
/// victim is a host name, which `admin.token` keeps to those who have it.
/// A slot's message id is shown only to a caller who sent the token (none
/// without `admin.token`): known ahead, it could be published first, by
/// anyone who may publish, and a broker's duplicate window or the store
/// would then take the real request for a repeat.
pub(super) fn planned(
    state: &State,
    authorized: bool,
) -> Result<Vec<crate::schedule::Planned>, &'static str> {
    if !authorized && !state.schedules.is_empty() {
        return Err("admin.token is set; send it to see the planned restarts");
    }
    let mut planned = state
        .schedules
        .next(&state.policy.current(), jiff::Timestamp::now());
    if !(authorized && state.token.is_some()) {
        for slot in planned.iter_mut().flat_map(|schedule| &mut schedule.next) {
            slot.message_id = None;
        }
    }
    Ok(planned)
}

async fn status(Shared(state): Shared<Arc<State>>, headers: HeaderMap) -> Response {
    let stats = state.stats.snapshot();
    let shown = authorized(state.token.as_ref(), &headers);
    let schedules = planned(&state, shown);
    // `null` when the store did not answer: the switch is unknown, not off.
    let (switch, groups) = tokio::join!(
        super::switch::read(&state),
        super::switch::read_groups(&state)
    );
    let switch = switch.ok();
    // The mode and its origin read together, so they never disagree: the
    // leash the store records now, else (the store silent) as last read.
    let leash = match &switch {
        Some(switch) => state.policy.leash_with(switch.leash.as_ref()),
        None => state.policy.leash(),
    };
    let (group_pauses, recovery) = match groups {
        Ok((pauses, judged)) => (Some(pauses), Some(judged)),
        Err(_) => (None, None),
    };
    // The copy this instance decides with, and why the last read was not
    // taken (a source answering nothing, or a drop past max_drop). The
    // source and the error name paths and hosts (a parse error quotes
    // them, a command's its stderr): kept to those `admin.token` admits,
    // as the schedules' victims are; the counts are public, as on /metrics.
    let inventory = state.policy.current().inventory.as_ref().map(|handle| {
        let current = handle.current();
        let (source, last_error) = if shown {
            (
                json!(current.as_ref().map(|s| s.source.clone())),
                json!(handle.last_error()),
            )
        } else {
            let hidden = json!({ "hidden": "admin.token is set; send it to see this" });
            (hidden.clone(), hidden)
        };
        json!({
            "source": source,
            "hosts": current.as_ref().map_or(0, |s| s.inventory.len()),
            "age_seconds": current.as_ref().map(|s| s.age().as_secs()),
            "refresh_failures": handle.failures(),
            "last_error": last_error,
        })
    });
    json(
        StatusCode::OK,
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "mode": if leash.leashed { "leashed" } else { "unleashed" },
            "leash": leash,
            "paused": switch.as_ref().map(|s| s.paused),
            "switch": switch,
            "group_pauses": group_pauses,
            "recovery_objectives": recovery,
            "inventory": inventory,
            "ready": not_ready(&state).await.is_none(),
            "shutting_down": state.shutdown.is_requested(),
            "store": if stats.store_down == 0 { "up" } else { "down" },
            "in_flight": stats.in_flight,
            "counters": stats,
            "runtime": crate::diagnostics::RuntimeMetrics::read(),
            "schedules": match &schedules {
                Ok(planned) => json!(planned),
                Err(why) => json!({ "hidden": why }),
            },
        }),
    )
}

/// `?limit=N&status=S`: the latest requests, newest first. Needs the token.
async fn requests(Shared(state): Shared<Arc<State>>, RawQuery(query): RawQuery) -> Response {
    let mut limit = 50;
    let mut wanted: Option<crate::domain::Status> = None;
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*key {
            "limit" => match value.parse::<usize>() {
                Ok(n) => limit = n.min(MAX_LIMIT),
                Err(_) => return bad_request(format!("limit {value:?} is not a number")),
            },
            "status" => match crate::domain::Status::from_name(&value) {
                Some(status) => wanted = Some(status),
                None => return bad_request(format!("status {value:?} is no status")),
            },
            other => return bad_request(format!("unknown parameter {other:?}")),
        }
    }
    // Filtering by status reads the most the API returns, then keeps `limit`.
    let read = if wanted.is_some() { MAX_LIMIT } else { limit };
    match state.store.history(read).await {
        Ok(entries) => {
            let searched = entries.len();
            let entries: Vec<_> = entries
                .into_iter()
                .filter(|entry| wanted.is_none_or(|status| entry.status == status))
                .take(limit)
                .collect();
            let mut answer = json!({ "requests": entries });
            if wanted.is_some() {
                // An empty answer is not "none": only the newest were read.
                answer["searched"] = json!(searched);
                answer["searched_all"] = json!(searched < read);
            }
            json(StatusCode::OK, answer)
        }
        Err(error) => unreadable(&error),
    }
}

/// The answer when the store cannot be read: 504 if it did not answer
/// within `store.timeout` (a store that hangs), 503 if it failed.
fn unreadable(error: &crate::store::StoreError) -> Response {
    let status = if error.outcome_unknown() {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(
        status,
        json!({ "error": format!("cannot read the history: {}", error.with_causes()) }),
    )
}

/// One request's whole story: its record, its restart attempts, the guards'
/// decisions, and the story in words, as `mandrill explain` prints it.
/// Needs the token.
async fn request(Shared(state): Shared<Arc<State>>, Path(message_id): Path<String>) -> Response {
    let Ok(id) = message_id.parse::<uuid::Uuid>() else {
        return bad_request(format!("{message_id:?} is not a message id"));
    };
    match state.store.story(id).await {
        Ok(Some(story)) => {
            let mut value = json!(story.entry);
            value["attempts"] = json!(story.attempts);
            value["decisions"] = json!(story.decisions);
            value["explanation"] = json!(story.explain());
            json(StatusCode::OK, value)
        }
        Ok(None) => json(
            StatusCode::NOT_FOUND,
            json!({ "error": format!("no request {id} is recorded") }),
        ),
        Err(error) => unreadable(&error),
    }
}

#[cfg(test)]
mod tests;
