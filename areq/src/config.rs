//! The command line: one `clap` struct, also used by tests to configure runs.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use regex::Regex;

/// Collect the links of web pages, concurrently and politely.
///
/// Reads URLS_FILE (one URL per line, `#` comments and blank lines ignored),
/// fetches every page and writes one line per (page, link) edge.
#[derive(Debug, Clone, Parser)]
#[command(name = "areq", version)]
pub struct Config {
    /// File with one URL per line (`-` reads standard input)
    pub urls_file: PathBuf,

    /// Where to write the edges (`-` for standard output)
    #[arg(short, long, default_value = "foundurls.txt")]
    pub output: PathBuf,

    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Tsv)]
    pub format: Format,

    /// Follow links up to this many hops from the seeds (0: fetch the seeds only)
    #[arg(long, default_value_t = 0)]
    pub depth: u32,

    /// Which links recursion may follow
    #[arg(long, value_enum, default_value_t = Scope::Host)]
    pub scope: Scope,

    /// During recursion, follow redirects wherever they go (by default a
    /// redirect leaving the scope is reported as an edge and not followed)
    #[arg(long)]
    pub follow_redirects_anywhere: bool,

    /// Only follow links whose URL matches one of these regexes
    #[arg(long, value_name = "REGEX")]
    pub include: Vec<Regex>,

    /// Never follow links whose URL matches one of these regexes
    #[arg(long, value_name = "REGEX")]
    pub exclude: Vec<Regex>,

    /// Extract every `href` attribute, not only those of `<a>` and `<area>`
    #[arg(long)]
    pub all_hrefs: bool,

    /// Keep links of every scheme (mailto:, ftp:, ...), not only http and https
    #[arg(long)]
    pub keep_schemes: bool,

    /// Maximum number of requests in flight overall
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// Maximum number of requests in flight to one host (scheme, host and port)
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub per_host: u32,

    /// Timeout of one request, from connecting to the end of the body
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// Timeout of connecting to a host
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,

    /// Maximum number of redirects followed for one URL
    #[arg(long, default_value_t = 10)]
    pub max_redirects: usize,

    /// Largest body read, in bytes; larger pages are reported as errors
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    pub max_body: u64,

    /// robots.txt, Crawl-delay and --min-delay; `auto` is on when --depth > 0
    #[arg(long, value_enum, default_value_t = Politeness::Auto)]
    pub politeness: Politeness,

    /// Minimum time between two requests to one host when polite
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    pub min_delay: Duration,

    /// Retries of a URL answered with 429 or 503
    #[arg(long, default_value_t = 3)]
    pub retries: u32,

    /// First retry delay, doubled at each retry (Retry-After wins when longer)
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub retry_base: Duration,

    /// Longest Retry-After honoured; a longer one makes the URL fail
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub max_retry_wait: Duration,

    /// User-Agent header (robots.txt rules are matched against `areq`)
    #[arg(long, default_value = concat!("areq/", env!("CARGO_PKG_VERSION"), " (link collector)"))]
    pub user_agent: String,

    /// Write a broken-link report here (`-` for standard output): every
    /// failed URL, why, and the pages linking to it, grouped by reason
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,

    /// Exit with code 3 when any URL failed (for CI)
    #[arg(long)]
    pub fail_on_broken: bool,

    /// Keep the crawl's state in this SQLite file and resume from it: the
    /// same command after Ctrl-C, a crash or kill -9 goes on where it
    /// stopped, appending to the output (which must be a file)
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,

    /// Progress display on standard error
    #[arg(long, value_enum, default_value_t = Progress::Auto)]
    pub progress: Progress,
}

/// How edges are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `source_url<TAB>parsed_url` lines after a header, as the original areq.py
    Tsv,
    /// One JSON object per edge, with status, depth and content type
    Jsonl,
    /// A Graphviz digraph of the links
    Dot,
}

/// Which links recursion may follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// The seeds' hosts (host and port)
    Host,
    /// The seeds' registrable domains (per the public-suffix list) and
    /// their subdomains: `a.example.co.uk` keeps `b.example.co.uk`
    Domain,
    /// Any http or https URL
    Any,
}

/// Whether to be polite (robots.txt, delays between requests to one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Politeness {
    /// Polite when recursive (--depth > 0), not for a plain list of URLs
    Auto,
    /// Always polite
    On,
    /// Never polite (benchmarks, your own servers)
    Off,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Progress {
    /// A bar when standard error is a terminal, log lines otherwise
    Auto,
    /// Always a bar
    Bar,
    /// Periodic log lines
    Log,
    /// Nothing but errors and the summary
    Never,
}

impl Config {
    /// Whether robots.txt and per-host delays apply to this run.
    pub fn is_polite(&self) -> bool {
        match self.politeness {
            Politeness::Auto => self.depth > 0,
            Politeness::On => true,
            Politeness::Off => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Config::command().debug_assert();
    }

    #[test]
    fn politeness_auto_is_on_only_when_recursive() {
        let flat = Config::parse_from(["areq", "urls.txt"]);
        assert!(!flat.is_polite());
        let recursive = Config::parse_from(["areq", "urls.txt", "--depth", "1"]);
        assert!(recursive.is_polite());
        let off = Config::parse_from(["areq", "urls.txt", "--depth", "1", "--politeness", "off"]);
        assert!(!off.is_polite());
    }
}
