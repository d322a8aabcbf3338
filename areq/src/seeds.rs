//! Parsing the list of seed URLs: one URL per line, `#` comments and blank
//! lines ignored, bad lines reported with their line number and skipped.

use url::Url;

use crate::scope::normalize;

/// The outcome of parsing a URL list.
#[derive(Debug, Default, PartialEq)]
pub struct Seeds {
    /// Valid http(s) URLs, normalised, in file order.
    pub urls: Vec<Url>,
    /// Lines that were neither blank, a comment nor a valid URL.
    pub rejected: Vec<RejectedLine>,
}

/// A line of the URL list that could not be used.
#[derive(Debug, PartialEq)]
pub struct RejectedLine {
    /// 1-based line number in the input.
    pub line: usize,
    /// The line's text, trimmed.
    pub text: String,
    /// Why it was rejected.
    pub reason: String,
}

/// Parses a URL list. Never fails: bad lines end up in [`Seeds::rejected`].
pub fn parse_seeds(text: &str) -> Seeds {
    let mut seeds = Seeds::default();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let reject = |reason: String| RejectedLine {
            line: index + 1,
            text: line.to_owned(),
            reason,
        };
        match Url::parse(line) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => seeds.urls.push(normalize(url)),
            Ok(url) => seeds
                .rejected
                .push(reject(format!("unsupported scheme `{}`", url.scheme()))),
            Err(error) => seeds.rejected.push(reject(error.to_string())),
        }
    }
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_lines_and_comments_are_ignored_and_bad_lines_keep_their_number() {
        let seeds = parse_seeds(
            "# a comment\n\nhttp://a.example/x#frag\n   \nnot a url\nftp://b.example/\n  https://c.example  \n",
        );
        let urls: Vec<&str> = seeds.urls.iter().map(Url::as_str).collect();
        assert_eq!(urls, ["http://a.example/x", "https://c.example/"]);
        let rejected: Vec<(usize, &str)> = seeds
            .rejected
            .iter()
            .map(|r| (r.line, r.text.as_str()))
            .collect();
        assert_eq!(rejected, [(5, "not a url"), (6, "ftp://b.example/")]);
        assert_eq!(seeds.rejected[0].reason, "relative URL without a base");
        assert_eq!(seeds.rejected[1].reason, "unsupported scheme `ftp`");
    }
}
