//! URL normalisation and the decision whether recursion follows a link.

use std::collections::HashSet;

use regex::Regex;
use url::{Host, Url};

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
    /// Registrable domains (or IP addresses) of the seeds, for [`Scope::Domain`].
    sites: HashSet<String>,
    include: Vec<Regex>,
    exclude: Vec<Regex>,
}

impl ScopeFilter {
    /// Builds the filter from the seeds and the `--include`/`--exclude` regexes.
    pub fn new(mode: Scope, seeds: &[Url], include: Vec<Regex>, exclude: Vec<Regex>) -> Self {
        let mut filter = Self {
            mode,
            authorities: HashSet::new(),
            sites: HashSet::new(),
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
        if let Some(site) = site(seed) {
            self.sites.insert(site);
        }
    }

    /// Whether a link may be fetched by recursion: in scope, and passing
    /// `--include` and `--exclude`.
    pub fn allows(&self, url: &Url) -> bool {
        self.contains(url)
            && (self.include.is_empty() || self.include.iter().any(|re| re.is_match(url.as_str())))
            && !self.exclude.iter().any(|re| re.is_match(url.as_str()))
    }

    /// Whether a URL is within `--scope` (regexes aside): the test a
    /// redirect target must pass to be followed during recursion.
    pub fn contains(&self, url: &Url) -> bool {
        if !matches!(url.scheme(), "http" | "https") {
            return false;
        }
        match self.mode {
            Scope::Any => true,
            Scope::Host => authority(url).is_some_and(|a| self.authorities.contains(&a)),
            Scope::Domain => site(url).is_some_and(|site| self.sites.contains(&site)),
        }
    }
}

/// The site a URL belongs to for [`Scope::Domain`]: its registrable domain
/// per the public-suffix list (`a.example.co.uk` -> `example.co.uk`), or
/// the host itself when it has none (an IP address, `localhost`, a public
/// suffix such as `co.uk`, which then swallows none of its registrants).
fn site(url: &Url) -> Option<String> {
    match url.host()? {
        Host::Domain(host) => Some(psl::domain_str(host).unwrap_or(host).to_owned()),
        Host::Ipv4(address) => Some(address.to_string()),
        Host::Ipv6(address) => Some(address.to_string()),
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
            (Scope::Domain, "http://127.0.0.2:8080/a", false),
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
    fn domain_scope_follows_the_public_suffix_list() {
        let seeds = [
            url("https://a.example.co.uk/"),
            url("https://co.uk/"),
            url("https://me.github.io/"),
            url("http://localhost:3000/"),
        ];
        let f = ScopeFilter::new(Scope::Domain, &seeds, Vec::new(), Vec::new());
        let cases = [
            ("https://b.example.co.uk/x", true, "a sibling subdomain"),
            (
                "https://example.co.uk/",
                true,
                "the registrable domain itself",
            ),
            ("https://deep.a.example.co.uk/", true, "a deeper subdomain"),
            (
                "https://other.co.uk/",
                false,
                "a seed on a public suffix swallows nothing",
            ),
            ("https://co.uk/about", true, "that seed's own host"),
            ("https://example.com/", false, "another registrable domain"),
            (
                "https://me.github.io/blog",
                true,
                "a private-section suffix",
            ),
            (
                "https://you.github.io/",
                false,
                "another site under github.io",
            ),
            (
                "http://localhost:4000/",
                true,
                "a host without a public suffix",
            ),
        ];
        for (link, expected, why) in cases {
            assert_eq!(f.allows(&url(link)), expected, "{link}: {why}");
        }
    }

    #[test]
    fn redirect_targets_are_checked_against_the_scope_only() {
        let f = filter(Scope::Host, &["/docs/"], &[]);
        let target = url("http://www.example.com/elsewhere");
        assert!(f.contains(&target), "regexes do not apply to redirects");
        assert!(!f.allows(&target));
        assert!(!f.contains(&url("http://blog.example.com/docs/")));
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
