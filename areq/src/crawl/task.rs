//! The crawl's tasks: fetching (and parsing) one page, fetching one
//! robots.txt. Each reports an [`Outcome`] back to the loop in `crawl.rs`,
//! which alone owns the frontier and the summary.

use std::sync::Arc;
use std::time::Duration;

use tracing::warn;
use url::Url;

use crate::extract::{ExtractError, ExtractOptions, charset_of, extract_links, is_html};
use crate::fetch::{BodyWanted, FetchError, Fetcher};
use crate::frontier::Job;
use crate::report::ErrorKind;
use crate::robots::RobotsRules;
use crate::scope::ScopeFilter;

/// Bodies larger than this are parsed on the blocking pool, so that one
/// huge page does not stall the async workers.
const INLINE_PARSE_LIMIT: usize = 256 * 1024;

/// What a finished task reports back to the loop.
#[derive(Debug)]
pub(super) enum Outcome {
    Page {
        job: Job,
        /// Boxed: two URLs and more, against a few words for robots.txt.
        result: Result<Box<Fetched>, PageError>,
    },
    Robots {
        host: String,
        rules: RobotsRules,
        /// The file as served, kept for `--state`.
        body: Option<Vec<u8>>,
    },
}

/// A page fetched with a status below 400.
#[derive(Debug)]
pub(super) struct Fetched {
    pub(super) final_url: Url,
    pub(super) status: u16,
    pub(super) content_type: Option<String>,
    /// `None` when the page is not HTML.
    pub(super) links: Option<Vec<Url>>,
    /// A redirect out of the scope, reported and not followed.
    pub(super) redirect_to: Option<Url>,
}

/// Why one page failed. Counted and logged, never fatal.
#[derive(Debug, thiserror::Error)]
pub(super) enum PageError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Extract(#[from] ExtractError),
}

impl PageError {
    pub(super) fn kind(&self) -> ErrorKind {
        match self {
            Self::Fetch(FetchError::Status { status, .. }) => ErrorKind::Http(*status),
            Self::Fetch(FetchError::Timeout) => ErrorKind::Timeout,
            Self::Fetch(FetchError::Connect(_)) => ErrorKind::Connect,
            Self::Fetch(FetchError::TooManyRedirects) => ErrorKind::TooManyRedirects,
            Self::Fetch(FetchError::BodyTooLarge { .. }) => ErrorKind::BodyTooLarge,
            Self::Fetch(FetchError::Body(_)) => ErrorKind::Body,
            Self::Fetch(FetchError::Request(_)) => ErrorKind::Request,
            Self::Extract(_) => ErrorKind::Parse,
        }
    }

    /// The server's Retry-After when it asked us to come back (429, 503).
    pub(super) fn retry_after(&self) -> Option<Option<Duration>> {
        match self {
            Self::Fetch(FetchError::Status {
                status: 429 | 503,
                retry_after,
            }) => Some(*retry_after),
            _ => None,
        }
    }
}

/// Fetches and parses one page; with a `redirect_scope`, redirects are
/// followed only within it.
pub(super) async fn fetch_page(
    fetcher: Fetcher,
    job: Job,
    options: ExtractOptions,
    redirect_scope: Option<Arc<ScopeFilter>>,
) -> Outcome {
    let result = fetch_and_extract(&fetcher, &job.url, options, redirect_scope.as_deref())
        .await
        .map(Box::new);
    Outcome::Page { job, result }
}

async fn fetch_and_extract(
    fetcher: &Fetcher,
    url: &Url,
    options: ExtractOptions,
    redirect_scope: Option<&ScopeFilter>,
) -> Result<Fetched, PageError> {
    let follow = |target: &Url| redirect_scope.is_none_or(|scope| scope.contains(target));
    let response = fetcher.get(url, BodyWanted::HtmlOnly, follow).await?;
    let content_type = response.content_type;
    let html_body = response
        .body
        .filter(|body| is_html(content_type.as_deref(), body));
    let links = match html_body {
        None => None,
        Some(body) => {
            let charset = content_type
                .as_deref()
                .and_then(charset_of)
                .map(str::to_owned);
            let page_url = response.final_url.clone();
            let links = if body.len() <= INLINE_PARSE_LIMIT {
                extract_links(&body, charset.as_deref(), &page_url, options)?
            } else {
                tokio::task::spawn_blocking(move || {
                    extract_links(&body, charset.as_deref(), &page_url, options)
                })
                .await
                .map_err(|error| ExtractError::from_panic(&error))??
            };
            Some(links)
        }
    };
    Ok(Fetched {
        final_url: response.final_url,
        status: response.status,
        content_type,
        links,
        redirect_to: response.redirect_to,
    })
}

/// Fetches robots.txt. Per RFC 9309 a 4xx means no rules and a 5xx means
/// the whole site is off limits; an unreachable server gets no rules, so
/// that its pages fail with the real reason instead of a silent skip.
pub(super) async fn fetch_robots(fetcher: Fetcher, host: String, url: Url) -> Outcome {
    let (rules, body) = match fetcher.get(&url, BodyWanted::Always, |_| true).await {
        Ok(response) => {
            let body = response.body.unwrap_or_default();
            (RobotsRules::parse(&body), Some(body))
        }
        Err(FetchError::Status { status, .. }) if status >= 500 => {
            warn!("fetching {url} failed with status {status}: treating {host} as disallowed");
            (RobotsRules::DisallowAll, None)
        }
        Err(_) => (RobotsRules::AllowAll, None),
    };
    Outcome::Robots { host, rules, body }
}
