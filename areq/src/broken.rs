//! The broken-link report: every URL the crawl failed to fetch, why, and
//! the pages that link to it, grouped by reason. Pure: the crawl loop tells
//! it what it queues, finds and fetches; [`BrokenLinks::write`] renders it.
//!
//! Only URLs the crawl fetched (or robots.txt forbade) are checked; a link
//! not followed (out of scope, beyond `--depth`) is neither good nor broken.
//! To name every referrer without keeping every edge, referrers are kept
//! only for URLs still queued or in flight, and for those that failed.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::sync::Arc;

use url::Url;

/// One failed URL.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Broken {
    /// The failure, as logged (`http status 404`, `connection failed: ...`).
    pub detail: String,
    /// Pages linking to it, in the order they were found; empty for a seed.
    pub referrers: Vec<Arc<str>>,
}

/// What the report knows; see the module documentation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BrokenLinks {
    /// Referrers of URLs queued or in flight, by URL.
    pending: HashMap<String, Vec<Arc<str>>>,
    /// Failed URLs by reason, then by URL (sorted, for a stable report).
    broken: BTreeMap<String, BTreeMap<String, Broken>>,
    /// Where each failed URL sits in `broken`: its reason.
    reason_of: HashMap<String, String>,
}

impl BrokenLinks {
    /// A URL was queued, from `referrer` (`None` for a seed).
    pub fn queued(&mut self, url: &Url, referrer: Option<&Arc<str>>) {
        self.pending
            .entry(url.as_str().to_owned())
            .or_default()
            .extend(referrer.cloned());
    }

    /// `referrer` links to a URL that was not queued from it (seen before,
    /// or not followed); remembered only if that URL is pending or broken.
    pub fn linked(&mut self, url: &Url, referrer: &Arc<str>) {
        if let Some(referrers) = self.pending.get_mut(url.as_str()) {
            referrers.push(referrer.clone());
        } else if let Some(reason) = self.reason_of.get(url.as_str())
            && let Some(broken) = self
                .broken
                .get_mut(reason)
                .and_then(|urls| urls.get_mut(url.as_str()))
        {
            broken.referrers.push(referrer.clone());
        }
    }

    /// A URL was fetched: it is not broken, and its referrers are dropped.
    pub fn succeeded(&mut self, url: &Url) {
        self.pending.remove(url.as_str());
    }

    /// A URL failed for `reason` (the group it is listed under).
    pub fn failed(&mut self, url: &Url, reason: String, detail: String) {
        let referrers = self.pending.remove(url.as_str()).unwrap_or_default();
        self.reason_of
            .insert(url.as_str().to_owned(), reason.clone());
        self.broken
            .entry(reason)
            .or_default()
            .insert(url.as_str().to_owned(), Broken { detail, referrers });
    }

    /// Failed URLs so far.
    pub fn count(&self) -> usize {
        self.reason_of.len()
    }

    /// Failed URLs by reason, then by URL.
    pub fn by_reason(&self) -> &BTreeMap<String, BTreeMap<String, Broken>> {
        &self.broken
    }

    /// Writes the report as plain text:
    ///
    /// ```text
    /// broken links: 2 urls
    ///
    /// http 404: 1 url
    ///   http://site.test/missing (http status 404)
    ///     linked from http://site.test/
    /// ```
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "broken links: {}", plural(self.count(), "url"))?;
        for (reason, urls) in &self.broken {
            writeln!(out, "\n{reason}: {}", plural(urls.len(), "url"))?;
            for (url, broken) in urls {
                writeln!(out, "  {url} ({})", broken.detail)?;
                if broken.referrers.is_empty() {
                    writeln!(out, "    listed in the input")?;
                }
                for referrer in &broken.referrers {
                    writeln!(out, "    linked from {referrer}")?;
                }
            }
        }
        Ok(())
    }
}

fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("test URLs are valid")
    }

    #[test]
    fn failures_are_grouped_by_reason_with_every_referrer() {
        let home: Arc<str> = "http://s.test/".into();
        let about: Arc<str> = "http://s.test/about".into();
        let mut report = BrokenLinks::default();
        report.queued(&url("http://s.test/"), None);
        report.queued(&url("http://down.test/"), None);
        report.succeeded(&url("http://s.test/"));
        report.queued(&url("http://s.test/missing"), Some(&home));
        report.queued(&url("http://s.test/about"), Some(&home));
        report.linked(&url("http://s.test/missing"), &about); // before the failure
        report.linked(&url("http://s.test/"), &about); // a good page: forgotten
        report.succeeded(&url("http://s.test/about"));
        report.failed(
            &url("http://s.test/missing"),
            "http 404".into(),
            "http status 404".into(),
        );
        let contact: Arc<str> = "http://s.test/contact".into();
        report.linked(&url("http://s.test/missing"), &contact); // after it
        report.failed(
            &url("http://down.test/"),
            "connect".into(),
            "connection failed: refused".into(),
        );

        let mut text = Vec::new();
        report
            .write(&mut text)
            .expect("writing to a Vec cannot fail");
        assert_eq!(
            String::from_utf8(text).expect("the report is UTF-8"),
            "broken links: 2 urls\n\
             \n\
             connect: 1 url\n  http://down.test/ (connection failed: refused)\n    listed in the input\n\
             \n\
             http 404: 1 url\n  http://s.test/missing (http status 404)\n    \
             linked from http://s.test/\n    linked from http://s.test/about\n    linked from http://s.test/contact\n"
        );
        assert_eq!(report.count(), 2);
        assert!(report.pending.is_empty(), "nothing is kept for good pages");
    }
}
