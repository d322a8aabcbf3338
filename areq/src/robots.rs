//! robots.txt rules for one origin.

use std::time::Duration;

use url::Url;

/// The product token matched against `User-agent:` lines.
pub const ROBOTS_AGENT: &str = "areq";

/// The longest Crawl-delay honoured; a site asking for more gets this.
const MAX_CRAWL_DELAY: Duration = Duration::from_secs(60);

/// What robots.txt says for one origin.
#[derive(Debug)]
pub enum RobotsRules {
    /// No robots.txt (4xx), an unreachable server, or politeness is off.
    AllowAll,
    /// The robots.txt request failed with a server error: per RFC 9309 the
    /// whole site is treated as disallowed.
    DisallowAll,
    /// A parsed robots.txt.
    Parsed(Box<texting_robots::Robot>),
}

impl RobotsRules {
    /// Parses a robots.txt body; one that cannot be parsed allows everything.
    pub fn parse(body: &[u8]) -> Self {
        match texting_robots::Robot::new(ROBOTS_AGENT, body) {
            Ok(robot) => Self::Parsed(Box::new(robot)),
            Err(_) => Self::AllowAll,
        }
    }

    /// Whether a URL of this origin may be fetched.
    pub fn allows(&self, url: &Url) -> bool {
        match self {
            Self::AllowAll => true,
            Self::DisallowAll => false,
            Self::Parsed(robot) => robot.allowed(url.as_str()),
        }
    }

    /// The Crawl-delay asked for, capped at a minute.
    pub fn crawl_delay(&self) -> Option<Duration> {
        match self {
            Self::Parsed(robot) => robot
                .delay
                .filter(|seconds| seconds.is_finite() && *seconds > 0.0)
                // Capped before the conversion, which panics past u64::MAX
                // seconds: a site's `Crawl-delay: 1e20` must not end the
                // crawl.
                .map(|seconds| Duration::from_secs_f32(seconds.min(MAX_CRAWL_DELAY.as_secs_f32()))),
            _ => None,
        }
    }
}

/// The robots.txt URL of a page's origin.
pub fn robots_url(page: &Url) -> Url {
    let mut url = page.clone();
    url.set_path("/robots.txt");
    url.set_query(None);
    url.set_fragment(None);
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("test URLs are valid")
    }

    #[test]
    fn rules_for_our_agent_and_crawl_delay_are_applied() {
        let rules = RobotsRules::parse(
            b"User-agent: *\nDisallow: /\n\nUser-agent: areq\nDisallow: /private\nCrawl-delay: 2\n",
        );
        assert!(rules.allows(&url("http://s.test/public")));
        assert!(!rules.allows(&url("http://s.test/private/x")));
        assert_eq!(rules.crawl_delay(), Some(Duration::from_secs(2)));
    }

    /// A delay no duration can hold is the longest honoured, never a panic
    /// on the crawl loop.
    #[test]
    fn a_huge_crawl_delay_is_capped_not_a_panic() {
        for huge in ["1e20", "100000000000000000000", "3.4e38"] {
            let text = format!("User-agent: *\nCrawl-delay: {huge}\n");
            let rules = RobotsRules::parse(text.as_bytes());
            assert_eq!(rules.crawl_delay(), Some(MAX_CRAWL_DELAY), "{huge}");
        }
    }

    #[test]
    fn server_errors_disallow_and_missing_files_allow() {
        assert!(!RobotsRules::DisallowAll.allows(&url("http://s.test/")));
        assert!(RobotsRules::AllowAll.allows(&url("http://s.test/")));
        assert_eq!(RobotsRules::AllowAll.crawl_delay(), None);
    }

    #[test]
    fn robots_url_is_at_the_origin_root() {
        assert_eq!(
            robots_url(&url("https://s.test:8443/a/b?c#d")).as_str(),
            "https://s.test:8443/robots.txt"
        );
    }
}
