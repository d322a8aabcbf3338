//! URL normalisation and the decision whether recursion follows a link.

use std::collections::HashSet;

use regex::Regex;
use url::Url;

use crate::config::Scope;

/// Normalises a URL for deduplication and output.
///
/// Parsing with the URL standard already lower-cases scheme and host,
/// removes default ports, resolves `.`/`..` segments and percent-encodes
/// what needs it; the only thing left is dropping the fragment, which never
/// reaches the server.
pub fn normalize(mut url: Url) -> Url {
    url.set_fragment(None);
    url
}

/// The key under which per-host limits, delays and robots.txt apply:
/// scheme, host and port (the URL's origin).
pub fn host_key(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// Decides which links recursion may follow.
#[derive(Debug, Clone)]
pub struct ScopeFilter {
    mode: Scope,
    /// `host:port` of every seed, for [`Scope::Host`].
    authorities: HashSet<String>,
    /// Seed hosts without a leading `www.`, for [`Scope::Domain`].
    domains: Vec<String>,
    include: Vec<Regex>,
    exclude: Vec<Regex>,
}

impl ScopeFilter {
    /// Builds the filter from the seeds and the `--include`/`--exclude` regexes.
    pub fn new(mode: Scope, seeds: &[Url], include: Vec<Regex>, exclude: Vec<Regex>) -> Self {
        let mut filter = Self {
            mode,
            authorities: HashSet::new(),
            domains: Vec::new(),
            include,
            exclude,
        };
        for seed in seeds {
            filter.add_seed(seed);
        }
        filter
    }

    /// Widens the scope to another seed: used for the URL a seed redirects
    /// to, so that `http://example.com` -> `https://www.example.com/` keeps
    /// the crawl on the site the user meant.
    pub fn add_seed(&mut self, seed: &Url) {
        if let Some(authority) = authority(seed) {
            self.authorities.insert(authority);
        }
        if let Some(host) = seed.host_str() {
            let domain = host.strip_prefix("www.").unwrap_or(host);
            if !self.domains.iter().any(|known| known == domain) {
                self.domains.push(domain.to_owned());
            }
        }
    }

    /// Whether a link may be fetched by recursion.
    pub fn allows(&self, url: &Url) -> bool {
        if !matches!(url.scheme(), "http" | "https") {
            return false;
        }
        let in_scope = match self.mode {
            Scope::Any => true,
            Scope::Host => authority(url).is_some_and(|a| self.authorities.contains(&a)),
            Scope::Domain => url.host_str().is_some_and(|host| {
                self.domains.iter().any(|domain| {
                    host == domain
                        || host
                            .strip_suffix(domain.as_str())
                            .is_some_and(|prefix| prefix.ends_with('.'))
                })
            }),
        };
        in_scope
            && (self.include.is_empty() || self.include.iter().any(|re| re.is_match(url.as_str())))
            && !self.exclude.iter().any(|re| re.is_match(url.as_str()))
    }
}

/// `host:port` with the scheme's default port filled in, so that an http
/// seed keeps its https pages in scope only when they share a port.
fn authority(url: &Url) -> Option<String> {
    Some(format!(
        "{}:{}",
        url.host_str()?,
        url.port_or_known_default()?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("test URLs are valid")
    }

    fn filter(mode: Scope, include: &[&str], exclude: &[&str]) -> ScopeFilter {
        let compile = |res: &[&str]| -> Vec<Regex> {
            res.iter()
                .map(|re| Regex::new(re).expect("test regexes are valid"))
                .collect()
        };
        ScopeFilter::new(
            mode,
            &[
                url("http://www.example.com/"),
                url("http://127.0.0.1:8080/"),
            ],
            compile(include),
            compile(exclude),
        )
    }

    #[test]
    fn scope_decisions() {
        let cases = [
            (Scope::Host, "http://www.example.com/a", true),
            (Scope::Host, "http://www.example.com:80/a", true),
            (Scope::Host, "http://blog.example.com/a", false),
            (Scope::Host, "http://127.0.0.1:8080/x", true),
            (Scope::Host, "http://127.0.0.1:8081/x", false),
            (Scope::Domain, "http://blog.example.com/a", true),
            (Scope::Domain, "http://example.com/a", true),
            (Scope::Domain, "http://notexample.com/a", false),
            (Scope::Domain, "http://127.0.0.1:9999/a", true),
            (Scope::Any, "https://anything.test/", true),
            (Scope::Any, "mailto:someone@example.com", false),
        ];
        for (mode, link, expected) in cases {
            assert_eq!(
                filter(mode, &[], &[]).allows(&url(link)),
                expected,
                "{mode:?} {link}"
            );
        }
    }

    #[test]
    fn a_seed_redirect_target_joins_the_scope() {
        let mut f = filter(Scope::Host, &[], &[]);
        let target = url("https://www.example.com/home");
        assert!(!f.allows(&target));
        f.add_seed(&target);
        assert!(f.allows(&url("https://www.example.com/about")));
    }

    #[test]
    fn include_and_exclude_regexes_filter_followed_links() {
        let f = filter(Scope::Any, &["/docs/"], &[r"\.pdf$"]);
        assert!(f.allows(&url("http://www.example.com/docs/a.html")));
        assert!(!f.allows(&url("http://www.example.com/blog/a.html")));
        assert!(!f.allows(&url("http://www.example.com/docs/a.pdf")));
    }

    #[test]
    fn normalisation_drops_fragments_and_default_ports() {
        let normal = normalize(url("HTTP://Example.COM:80/a/../b?q=1#top"));
        assert_eq!(normal.as_str(), "http://example.com/b?q=1");
    }
}
