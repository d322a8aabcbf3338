//! The dashboard at `/`: the console an operator runs a game day from.
//! One server-rendered page, no external assets (the machines may have no
//! internet) and no build step: it shows what `mandrill status` and
//! `campaign status` show, read by the same functions, and a small inline
//! script (`console.js`) turns the pauses and stops a campaign with the
//! admin token the operator pastes, which it keeps in the page's memory
//! only.
//!
//! This file gathers the facts (`serve`); `page.rs` lays the page out and
//! each section's file renders one part of it.

mod campaigns;
mod groups;
mod page;
mod planned;
mod requests;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State as Shared;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse as _, Response};

use page::Page;
pub(crate) use page::escape;

use super::State;
use super::auth::authorized;
use crate::domain::Timestamp;

/// How far back campaigns are looked for: a campaign's targets are due
/// within its spread, at most `safety.max_defer`, and each is decided
/// within `safety.max_defer` after, so one started earlier is decided.
fn campaigns_lookback(max_defer: Duration) -> Duration {
    max_defer.saturating_mul(2)
}

/// Most campaigns shown (each of its targets is read from the store).
const CAMPAIGNS_SHOWN: usize = 5;

/// `GET /`: the page, with what `admin.token` keeps (the history, the
/// schedules' victims, the campaigns' targets: host names) only for a
/// reader who sent it (the page's script does, once it is pasted) or when
/// none is set.
pub(super) async fn serve(Shared(state): Shared<Arc<State>>, headers: HeaderMap) -> Response {
    let authorized = authorized(state.token.as_ref(), &headers);
    let stats = state.stats.snapshot();
    let policy = state.policy.current();
    let now = Timestamp::now();
    let hidden = "admin.token is set; paste it above to see";
    let history = async {
        if !authorized {
            return Err(hidden);
        }
        let read = state.store.history(super::routes::MAX_LIMIT);
        match tokio::time::timeout(super::STORE_TIMEOUT, read).await {
            Ok(Ok(history)) => Ok(history),
            Ok(Err(_)) | Err(_) => Err("the store did not answer"),
        }
    };
    let campaigns = async {
        if !authorized {
            return Err(hidden.to_owned());
        }
        let lookback = campaigns_lookback(policy.guards.max_defer).as_millis();
        let lookback = i64::try_from(lookback).unwrap_or(i64::MAX);
        let since = Timestamp::from_millis(now.as_millis().saturating_sub(lookback));
        let read = crate::campaign::recent(&*state.store, since, CAMPAIGNS_SHOWN);
        match tokio::time::timeout(super::STORE_TIMEOUT, read).await {
            Ok(Ok(campaigns)) => Ok(campaigns),
            Ok(Err(error)) => Err(format!("{error:#}")),
            Err(_) => Err("the store did not answer".to_owned()),
        }
    };
    let instances = async {
        match &state.instances_dir {
            Some(dir) => super::instance_modes(dir).await,
            None => Vec::new(),
        }
    };
    // Asked together, so that a store that hangs holds the page for one
    // bound, not one per read.
    let (history, switch, ready, groups, usage, campaigns, instances) = tokio::join!(
        history,
        super::switch::read(&state),
        super::routes::not_ready(&state),
        super::switch::read_groups(&state),
        super::switch::read_usage(&state),
        campaigns,
        instances,
    );
    let schedules = super::routes::planned(&state, authorized);
    let groups = groups.and_then(|(pauses, judged)| {
        let known = groups::known(&policy, schedules.as_deref().unwrap_or_default());
        Ok(groups::rows(known, pauses, judged, usage?, |group| {
            policy.limits(group).ok().and_then(|limits| limits.budget)
        }))
    });
    let page = Page {
        now,
        own_mode: state.policy.leash().into(),
        instances: &instances,
        ready: ready.map_or(Ok(()), Err),
        stats: &stats,
        switch: switch.as_ref().map_err(|why| *why),
        groups: groups.as_deref().map_err(|why| *why),
        window: policy.guards.counting.window(),
        calendar: policy.guards.calendar.as_ref().map(|calendar| {
            (
                calendar.describe(),
                calendar.now_in_words(jiff::Timestamp::now()),
            )
        }),
        schedules: schedules.as_deref().map_err(|why| *why),
        campaigns: campaigns.as_deref().map_err(String::as_str),
        campaigns_lookback: campaigns_lookback(policy.guards.max_defer),
        history: history.as_deref().map_err(|why| *why),
    };
    let mut response = (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page::render(&page),
    )
        .into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(&page::content_security_policy())
            // Made of base64 and ASCII words.
            .expect("a content security policy is a header value"),
    );
    response
}
