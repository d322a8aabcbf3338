//! `POST /api/pause` and `POST /api/resume`: the kill switch from the admin
//! server, as `mandrill pause` and `mandrill resume` turn it, in the store
//! every instance shares; `POST /api/leash` and `/api/unleash`, the leash
//! kept beside it, as `mandrill leash` and `mandrill unleash` turn it; and
//! what the pages read of the store with them (the switch, the groups'
//! pauses, objectives and use), each within `STORE_TIMEOUT`.
//!
//! The body is optional: JSON `{"reason": "…", "by": "…", "group": "…"}`
//! (with `group`, only that group's restarts, as `--group`; the dashboard's
//! buttons send it with the token as a header) or a form (`reason=…&by=…`,
//! which may also carry the token as `token=…` since a form cannot set a
//! header). A form gets a redirect back to the dashboard; anything else
//! gets JSON.
//!
//! Both always need a token (`admin.token`, else the generated one in
//! `admin.token_file`), unlike the pages that only read; [`accept`] is
//! that check, which a campaign's stop takes too.
//!
//! Every request that acts, checked one way, so one file past 400 lines.
//!
//! The answer says which of three things happened: turned (200), not
//! turned (503, `"outcome": "failed"`), or unknown (504, `"outcome":
//! "unknown"`): the store did not answer within `store.timeout`, and the
//! switch may have turned all the same. An operator who paused during an
//! incident must not be told "failed" and walk away from a switch that is
//! on, nor "paused" when it is not.
//!
//! The switch's and the leash's turns share one reading of a turn (the
//! body, the token, who and why), so one file past 400 lines.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State as Shared;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use subtle::ConstantTimeEq as _;

use super::auth::{authorized, unauthorized};
use super::{State, bad_request, json};
use crate::safety::objectives::Judged;
use crate::store::{GroupPause, Switch};

/// Who turned the switch when the request does not say.
const DEFAULT_BY: &str = "admin-api";
/// The reason recorded when a turn gives none.
const NO_REASON: &str = "no reason given";
/// Longest reason kept, as `mandrill pause --reason` allows.
const MAX_REASON_CHARS: usize = 1024;
/// Longest name kept.
const MAX_BY_CHARS: usize = 128;

/// The switch as the store has it, or why not.
pub(crate) async fn read(state: &State) -> Result<Switch, &'static str> {
    match tokio::time::timeout(super::STORE_TIMEOUT, state.store.switch()).await {
        Ok(Ok(switch)) => Ok(switch),
        Ok(Err(_)) | Err(_) => Err("the store did not answer"),
    }
}

/// The group pauses and each recovery objective judged, as the store has
/// them, or why not.
pub(crate) async fn read_groups(
    state: &State,
) -> Result<(Vec<GroupPause>, Vec<Judged>), &'static str> {
    let objectives = state.policy.current().recovery_objectives.clone();
    let read = async {
        let pauses = state.store.group_pauses().await?;
        let judged = crate::service::objectives::judge_all(&*state.store, &objectives).await?;
        Ok::<_, crate::store::StoreError>((pauses, judged))
    };
    match tokio::time::timeout(super::STORE_TIMEOUT, read).await {
        Ok(Ok(groups)) => Ok(groups),
        Ok(Err(_)) | Err(_) => Err("the store did not answer"),
    }
}

/// Each group's use of its limits now (restarts in the rate window, hosts
/// disrupted), as the store has it, or why not.
pub(crate) async fn read_usage(
    state: &State,
) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, &'static str> {
    let starts =
        (state.policy.current().guards.counting).usage_starts(crate::domain::Timestamp::now());
    let read = state.store.group_usage(starts);
    match tokio::time::timeout(super::STORE_TIMEOUT, read).await {
        Ok(Ok(usage)) => Ok(usage),
        Ok(Err(_)) | Err(_) => Err("the store did not answer"),
    }
}

pub(crate) async fn pause(
    Shared(state): Shared<Arc<State>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    turn(&state, &headers, &body, true).await
}

pub(crate) async fn resume(
    Shared(state): Shared<Arc<State>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    turn(&state, &headers, &body, false).await
}

pub(crate) async fn leash(
    Shared(state): Shared<Arc<State>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    turn_leash(&state, &headers, &body, true).await
}

pub(crate) async fn unleash(
    Shared(state): Shared<Arc<State>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    turn_leash(&state, &headers, &body, false).await
}

/// `POST /api/leash` and `/api/unleash`: the leash recorded in the store,
/// as `mandrill leash` and `mandrill unleash` turn it, for every instance
/// sharing it. Same body and answers as the kill switch's; unleashing
/// needs a reason, and neither takes a group (the leash is one).
async fn turn_leash(state: &State, headers: &HeaderMap, body: &[u8], leashed: bool) -> Response {
    let turn = match authorized_turn(state, headers, body) {
        Ok(turn) => turn,
        Err(refused) => return *refused,
    };
    if turn.group.is_some() {
        return bad_request(
            "the leash is one for every instance sharing the store: no group".into(),
        );
    }
    let by = turn.by.unwrap_or_default();
    let reason = match turn.reason {
        Some(reason) => reason,
        None if leashed => NO_REASON.to_owned(),
        None => {
            return bad_request(
                "unleashing needs a reason: who asked for real restarts, and why".into(),
            );
        }
    };
    let what = if leashed { "leash" } else { "unleash" };
    if let Err(error) = state.store.set_leash(leashed, &by, &reason).await {
        if error.outcome_unknown() {
            tracing::error!(error = %error.with_causes(), by, reason, "{what} from the admin API: outcome unknown");
            return json(
                StatusCode::GATEWAY_TIMEOUT,
                json!({
                    "outcome": "unknown",
                    "error": format!(
                        "the leash may or may not have turned: {}; read it with GET /api/status \
                         or `mandrill status`",
                        error.with_causes()
                    ),
                }),
            );
        }
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({
                "outcome": "failed",
                "error": format!("cannot turn the leash: {}", error.with_causes()),
            }),
        );
    }
    tracing::warn!(by, reason, leashed, "the leash turned from the admin API");
    if turn.form {
        return (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    }
    json(
        StatusCode::OK,
        json!({ "leashed": leashed, "by": by, "reason": reason }),
    )
}

/// What a request to turn the switch says.
#[derive(Debug, Default, PartialEq, Eq)]
struct Turn {
    reason: Option<String>,
    by: Option<String>,
    /// Only this group's restarts, not the kill switch.
    group: Option<String>,
    /// The token as a form field (the dashboard's buttons).
    token: Option<String>,
    /// Sent by a form: answered with a redirect to the dashboard.
    form: bool,
}

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded"))
}

/// Parses the body by its content type: a form, else JSON (or nothing). A
/// JSON object sent as a form (`curl -d '{…}'` says form) is read as JSON.
fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Turn, String> {
    let mut turn = Turn::default();
    let json_object = body.trim_ascii_start().starts_with(b"{");
    if is_form(headers) && !json_object {
        turn.form = true;
        for (key, value) in url::form_urlencoded::parse(body) {
            let value = Some(value.into_owned()).filter(|v| !v.trim().is_empty());
            match &*key {
                "reason" => turn.reason = value,
                "by" => turn.by = value,
                "group" => turn.group = value,
                "token" => turn.token = value,
                other => return Err(format!("unknown field {other:?}")),
            }
        }
        return Ok(turn);
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(turn);
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        reason: Option<String>,
        by: Option<String>,
        group: Option<String>,
    }
    let parsed: Body = serde_json::from_slice(body).map_err(|error| {
        format!("the body is not {{\"reason\", \"by\", \"group\"}} JSON: {error}")
    })?;
    // Blank is not given, as in a form: an unleash needs a reason, and
    // "   " is none.
    let given = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
    turn.reason = given(parsed.reason);
    turn.by = given(parsed.by);
    turn.group = given(parsed.group);
    Ok(turn)
}

/// One line of at most `max` characters.
fn one_line(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.chars().any(char::is_control) || value.chars().count() > max {
        return Err(format!(
            "{field} must be one line of at most {max} characters"
        ));
    }
    Ok(())
}

/// A cross-site form post (another page in the operator's browser posting
/// to the loopback admin port): refused, whatever the token.
fn cross_site(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = headers.get(header::HOST).map(HeaderValue::as_bytes);
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|origin| url::Url::parse(origin).ok())
        .map(|url| match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            _ => String::new(),
        });
    origin_host.as_deref().map(str::as_bytes) != host
}

/// A turn's body read and its token checked, with who and why (the
/// defaults filled in); or the answer refusing it.
fn authorized_turn(state: &State, headers: &HeaderMap, body: &[u8]) -> Result<Turn, Box<Response>> {
    // Always a token, loopback or not: any local process can reach a
    // loopback port, and resuming undoes a pause someone needed.
    let token = Some(&state.switch_token);
    let mut turn = match parse(headers, body) {
        Ok(turn) => turn,
        // Checked before the body is trusted for anything, the token first.
        Err(_) if !authorized(token, headers) => return Err(Box::new(unauthorized())),
        Err(why) => return Err(Box::new(bad_request(why))),
    };
    let by_form = turn.token.as_ref().is_some_and(|presented| {
        bool::from(presented.as_bytes().ct_eq(state.switch_token.0.as_bytes()))
    });
    if !(by_form || authorized(token, headers)) {
        return Err(Box::new(unauthorized()));
    }
    if cross_site(headers) {
        return Err(Box::new(
            (StatusCode::FORBIDDEN, "cross-site request refused\n").into_response(),
        ));
    }
    let by = turn.by.get_or_insert_with(|| DEFAULT_BY.to_owned());
    one_line("by", by, MAX_BY_CHARS).map_err(|why| Box::new(bad_request(why)))?;
    if let Some(reason) = &turn.reason {
        one_line("reason", reason, MAX_REASON_CHARS).map_err(|why| Box::new(bad_request(why)))?;
    }
    Ok(turn)
}

/// What an authorized request to act says: who, why, the group if any,
/// and whether it came from a form (answered with a redirect).
pub(super) struct Accepted {
    pub(super) by: String,
    pub(super) reason: String,
    pub(super) group: Option<String>,
    pub(super) form: bool,
}

/// A request that acts other than a turn (a campaign's stop), checked as
/// every turn is ([`authorized_turn`]), with the defaults filled in. `Err`
/// with the answer to send.
pub(super) fn accept(
    state: &State,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Accepted, Box<Response>> {
    let turn = authorized_turn(state, headers, body)?;
    Ok(Accepted {
        by: turn.by.unwrap_or_else(|| DEFAULT_BY.to_owned()),
        reason: turn.reason.unwrap_or_else(|| NO_REASON.to_owned()),
        group: turn.group,
        form: turn.form,
    })
}

async fn turn(state: &State, headers: &HeaderMap, body: &[u8], paused: bool) -> Response {
    let turn = match authorized_turn(state, headers, body) {
        Ok(turn) => turn,
        Err(refused) => return *refused,
    };
    let by = turn.by.clone().unwrap_or_default();
    let reason = turn.reason.clone().unwrap_or_else(|| NO_REASON.to_owned());
    if let Some(group) = &turn.group {
        return turn_group(state, group, paused, &by, &reason, turn.form).await;
    }
    if !paused && !paused_now(state).await {
        // As `mandrill resume`: nothing is written, so no notifier is told
        // `resumed` of a switch that was never on. A pause made after this
        // read is someone else's: left on.
        if turn.form {
            return (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
        }
        return json(
            StatusCode::OK,
            json!({
                "outcome": "unchanged",
                "paused": false,
                "message": "nothing was paused: restarts were not paused, and no resume was recorded",
            }),
        );
    }
    let asked = crate::domain::Timestamp::now();
    if let Err(error) = state.store.set_switch(paused, &by, &reason).await {
        let what = if paused { "pause" } else { "resume" };
        if error.outcome_unknown() {
            tracing::error!(error = %error.with_causes(), by, reason, "{what} from the admin API: outcome unknown");
            return json(
                StatusCode::GATEWAY_TIMEOUT,
                json!({
                    "outcome": "unknown",
                    "error": format!(
                        "the kill switch may or may not have turned: {}; read it with \
                         GET /api/status or `mandrill status`",
                        error.with_causes()
                    ),
                }),
            );
        }
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({
                "outcome": "failed",
                "error": format!("cannot turn the kill switch: {}", error.with_causes()),
            }),
        );
    }
    if paused {
        tracing::warn!(by, reason, "restarts paused from the admin API");
    } else {
        tracing::info!(by, reason, "restarts resumed from the admin API");
    }
    if let Some(notifier) = &state.notifier {
        notifier.switch_turned_here(paused, &by, &reason, asked, crate::domain::Timestamp::now());
    }
    if turn.form {
        return (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    }
    json(
        StatusCode::OK,
        json!({ "paused": paused, "by": by, "reason": reason }),
    )
}

/// Whether restarts are paused, as far as the store says within a second:
/// `true` (a resume is written, as before) when it does not say, so that a
/// hung store's answer stays within its deadline twice.
async fn paused_now(state: &State) -> bool {
    let read = tokio::time::timeout(std::time::Duration::from_secs(1), state.store.switch());
    !matches!(read.await, Ok(Ok(switch)) if !switch.paused)
}

/// Pauses or resumes one group's restarts, or every group beneath an
/// ansible parent group, as `mandrill pause --group`: a group the policy
/// does not know is refused (400), naming the known ones.
async fn turn_group(
    state: &State,
    group: &str,
    paused: bool,
    by: &str,
    reason: &str,
    form: bool,
) -> Response {
    if let Err(why) = one_line("group", group, MAX_BY_CHARS) {
        return bad_request(why);
    }
    let groups = match state.policy.current().group_pause(group) {
        Ok(groups) => groups.groups,
        // A resume still lifts a pause recorded under exactly that name.
        Err(why) if !paused => match state.store.group_pauses().await {
            Ok(pauses) if pauses.iter().any(|pause| pause.group == group) => {
                vec![group.to_owned()]
            }
            _ => return bad_request(why),
        },
        Err(why) => return bad_request(why),
    };
    let mut changed = Vec::new();
    for one in &groups {
        match state
            .store
            .set_group_pause(one, paused.then_some((by, reason)))
            .await
        {
            Ok(true) => {
                tracing::warn!(
                    group = one,
                    by,
                    reason,
                    paused,
                    "a group's pause turned from the admin API"
                );
                if let Some(notifier) = state.notifier.as_ref().filter(|_| paused) {
                    notifier.send(crate::notify::Event::group_paused(one, by, reason));
                }
                changed.push(one.clone());
            }
            Ok(false) => {}
            Err(error) => {
                let (status, outcome) = if error.outcome_unknown() {
                    (StatusCode::GATEWAY_TIMEOUT, "unknown")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "failed")
                };
                return json(
                    status,
                    json!({
                        "outcome": outcome,
                        "error": format!("cannot turn the pause of group {one}: {}", error.with_causes()),
                        "turned": changed,
                    }),
                );
            }
        }
    }
    if form {
        return (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    }
    json(
        StatusCode::OK,
        json!({
            "group": group,
            "groups": groups,
            "paused": paused,
            "changed": !changed.is_empty(),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn bodies_are_read_by_content_type_and_unknown_fields_refused() {
        let form = headers(&[(header::CONTENT_TYPE, "application/x-www-form-urlencoded")]);
        let turn = parse(&form, b"reason=incident+42&by=&token=t").unwrap();
        assert_eq!(
            turn,
            Turn {
                reason: Some("incident 42".into()),
                by: None,
                group: None,
                token: Some("t".into()),
                form: true,
            }
        );
        assert!(parse(&form, b"why=x").is_err());
        // `curl -d '{…}'` sends JSON labelled as a form.
        let curl = parse(&form, br#"{"reason":"r"}"#).unwrap();
        assert_eq!((curl.reason.as_deref(), curl.form), (Some("r"), false));
        let none = HeaderMap::new();
        assert_eq!(parse(&none, b"").unwrap(), Turn::default());
        let turn = parse(&none, br#"{"reason":"deploy","by":"ana"}"#).unwrap();
        assert_eq!(
            (turn.reason.as_deref(), turn.by.as_deref()),
            (Some("deploy"), Some("ana"))
        );
        assert!(parse(&none, br#"{"token":"t"}"#).is_err());
        assert!(parse(&none, b"not json").is_err());
    }

    #[test]
    fn a_form_from_another_origin_is_cross_site() {
        let host = (header::HOST, "127.0.0.1:9730");
        assert!(!cross_site(&headers(std::slice::from_ref(&host))));
        assert!(!cross_site(&headers(&[
            host.clone(),
            (header::ORIGIN, "http://127.0.0.1:9730"),
        ])));
        assert!(cross_site(&headers(&[
            host,
            (header::ORIGIN, "https://evil.example"),
        ])));
    }
}
