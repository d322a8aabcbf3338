//! `GET /api/campaigns/{id}` (where each target stands, as `mandrill
//! campaign status --json` prints it; behind `admin.token`, as the
//! history is) and `POST /api/campaigns/{id}/stop` (as `mandrill campaign
//! stop`: the targets not yet issued are recorded `cancelled`).
//!
//! The stop takes the body and the token the pause endpoints take
//! (`super::switch::accept`): JSON `{"reason": "…", "by": "…"}` or a form
//! (`reason=…&by=…&token=…`, answered with a redirect to the dashboard);
//! `by` defaults to `admin-api`. The answer: 200 with the campaign judged
//! and the targets cancelled now, 404 for an unknown campaign, 503 when
//! the store refused (`"outcome": "failed"`), 504 when it did not answer
//! in time (`"outcome": "unknown"`: the stop may have been recorded).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State as Shared};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{State, bad_request, json};

/// A campaign's id from the path, or why not.
fn campaign_id(raw: &str) -> Result<uuid::Uuid, String> {
    raw.parse::<uuid::Uuid>()
        .map_err(|_| format!("{raw:?} is not a campaign id"))
}

/// `GET /api/campaigns/{id}`.
pub(crate) async fn status(Shared(state): Shared<Arc<State>>, Path(id): Path<String>) -> Response {
    let id = match campaign_id(&id) {
        Ok(id) => id,
        Err(why) => return bad_request(why),
    };
    let read = async {
        let Some(campaign) = state.store.campaign(id).await? else {
            return Ok(None);
        };
        let (targets, verdict) = crate::campaign::judge(&*state.store, &campaign).await?;
        Ok::<_, anyhow::Error>(Some(crate::campaign::status_json(
            &campaign, &targets, verdict,
        )))
    };
    match tokio::time::timeout(super::STORE_TIMEOUT, read).await {
        Ok(Ok(Some(value))) => json(StatusCode::OK, value),
        Ok(Ok(None)) => not_found(id),
        Ok(Err(_)) | Err(_) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": "the store did not answer" }),
        ),
    }
}

fn not_found(id: uuid::Uuid) -> Response {
    json(
        StatusCode::NOT_FOUND,
        json!({ "error": format!("no campaign {id} is recorded") }),
    )
}

/// `POST /api/campaigns/{id}/stop`.
pub(crate) async fn stop(
    Shared(state): Shared<Arc<State>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let asked = match super::switch::accept(&state, &headers, &body) {
        Ok(asked) => asked,
        Err(refused) => return *refused,
    };
    if asked.group.is_some() {
        return bad_request("a campaign's stop takes no group".into());
    }
    let id = match campaign_id(&id) {
        Ok(id) => id,
        Err(why) => return bad_request(why),
    };
    let (by, reason) = (asked.by.as_str(), asked.reason.as_str());
    let (campaign, cancelled) = match state.store.stop_campaign(id, by, reason).await {
        Ok(Some(stopped)) => stopped,
        Ok(None) => return not_found(id),
        Err(error) => {
            let (status, outcome, said) = if error.outcome_unknown() {
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    "unknown",
                    "the campaign may or may not be stopped",
                )
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "failed",
                    "cannot stop the campaign",
                )
            };
            tracing::error!(error = %error.with_causes(), %id, by, reason, "campaign stop from the admin API: {outcome}");
            return json(
                status,
                json!({
                    "outcome": outcome,
                    "error": format!("{said}: {}; read it with GET /api/campaigns/{id}", error.with_causes()),
                }),
            );
        }
    };
    tracing::warn!(%id, by, reason, cancelled = cancelled.len(), "campaign stopped from the admin API");
    if asked.form {
        return (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    }
    // Judged after the stop, bounded: the stop stands whatever the read.
    let judged = tokio::time::timeout(
        super::STORE_TIMEOUT,
        crate::campaign::judge(&*state.store, &campaign),
    )
    .await;
    let mut value = match judged {
        Ok(Ok((targets, verdict))) => crate::campaign::status_json(&campaign, &targets, verdict),
        Ok(Err(_)) | Err(_) => json!({ "id": campaign.id, "stopped": campaign.stopped }),
    };
    value["cancelled"] = json!(cancelled);
    json(StatusCode::OK, value)
}
