use super::*;

fn job(url: &str) -> Job {
    Job {
        url: Url::parse(url).expect("test URLs are valid"),
        depth: 0,
        attempt: 0,
    }
}

fn frontier(per_host: usize, min_delay: Duration, check_robots: bool) -> Frontier {
    Frontier::new(FrontierSettings {
        per_host,
        min_delay,
        check_robots,
    })
}

fn fetched_path(dispatch: Option<Dispatch>) -> String {
    match dispatch {
        Some(Dispatch::Fetch(job)) => job.url.path().to_owned(),
        other => panic!("expected a fetch, got {other:?}"),
    }
}

#[test]
fn a_url_is_queued_only_once() {
    let mut f = frontier(4, Duration::ZERO, false);
    assert!(f.enqueue(job("http://a.test/x")));
    assert!(!f.enqueue(job("http://a.test/x")));
    f.mark_seen(&Url::parse("http://a.test/y").expect("valid"));
    assert!(!f.enqueue(job("http://a.test/y")));
    assert_eq!(f.queued(), 1);
}

#[test]
fn per_host_limit_holds_until_a_fetch_finishes() {
    let now = Instant::now();
    let mut f = frontier(2, Duration::ZERO, false);
    for path in ["/1", "/2", "/3"] {
        f.enqueue(job(&format!("http://a.test{path}")));
    }
    f.enqueue(job("http://b.test/1"));
    let first_two = [
        fetched_path(f.next_ready(now)),
        fetched_path(f.next_ready(now)),
    ];
    assert_eq!(
        first_two,
        ["/1", "/1"],
        "round-robin serves both hosts first"
    );
    assert_eq!(fetched_path(f.next_ready(now)), "/2");
    assert_eq!(f.next_ready(now), None, "a.test has 2 in flight");
    f.finished(&Url::parse("http://a.test/1").expect("valid"));
    assert_eq!(fetched_path(f.next_ready(now)), "/3");
}

#[test]
fn min_delay_spaces_request_starts_to_one_host() {
    let now = Instant::now();
    let second = Duration::from_secs(1);
    let mut f = frontier(8, second, false);
    f.enqueue(job("http://a.test/1"));
    f.enqueue(job("http://a.test/2"));
    assert_eq!(fetched_path(f.next_ready(now)), "/1");
    assert_eq!(f.next_ready(now), None);
    assert_eq!(f.next_wakeup(now), Some(now + second));
    assert_eq!(fetched_path(f.next_ready(now + second)), "/2");
}

#[test]
fn robots_are_fetched_first_and_then_honoured_with_crawl_delay() {
    let now = Instant::now();
    let mut f = frontier(8, Duration::ZERO, true);
    f.enqueue(job("http://a.test/private/x"));
    f.enqueue(job("http://a.test/public"));
    let Some(Dispatch::FetchRobots { host, url }) = f.next_ready(now) else {
        panic!("robots.txt comes first");
    };
    assert_eq!(url.as_str(), "http://a.test/robots.txt");
    assert_eq!(f.next_ready(now), None, "pages wait for robots.txt");
    f.set_robots(
        &host,
        RobotsRules::parse(b"User-agent: *\nDisallow: /private\nCrawl-delay: 5\n"),
    );
    assert!(
        matches!(f.next_ready(now), Some(Dispatch::Disallowed(j)) if j.url.path() == "/private/x")
    );
    assert_eq!(fetched_path(f.next_ready(now)), "/public");
    f.enqueue(job("http://a.test/later"));
    assert_eq!(f.next_ready(now), None);
    assert_eq!(f.next_wakeup(now), Some(now + Duration::from_secs(5)));
}

#[test]
fn preset_robots_rules_are_used_without_fetching_robots_txt() {
    let now = Instant::now();
    let mut f = frontier(8, Duration::ZERO, true);
    f.preset_robots(
        "http://a.test",
        RobotsRules::parse(b"User-agent: *\nDisallow: /private\n"),
    );
    f.enqueue(job("http://a.test/private/x"));
    f.enqueue(job("http://a.test/public"));
    assert!(
        matches!(f.next_ready(now), Some(Dispatch::Disallowed(j)) if j.url.path() == "/private/x")
    );
    assert_eq!(fetched_path(f.next_ready(now)), "/public");
}

#[test]
fn a_retry_goes_first_and_holds_the_host_until_its_time() {
    let now = Instant::now();
    let mut f = frontier(8, Duration::ZERO, false);
    f.enqueue(job("http://a.test/1"));
    f.enqueue(job("http://a.test/2"));
    let Some(Dispatch::Fetch(first)) = f.next_ready(now) else {
        panic!("expected a fetch");
    };
    f.finished(&first.url);
    let later = now + Duration::from_secs(3);
    f.retry(
        Job {
            attempt: 1,
            ..first
        },
        later,
    );
    assert_eq!(f.next_ready(now), None);
    assert_eq!(f.next_wakeup(now), Some(later));
    assert_eq!(fetched_path(f.next_ready(later)), "/1");
    assert_eq!(fetched_path(f.next_ready(later)), "/2");
    assert_eq!(f.queued(), 0);
}
