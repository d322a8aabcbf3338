//! Link extraction: HTML bytes in, absolute fragment-free links out.
//!
//! The tokenizer is `lol_html`'s streaming one, which understands quoting,
//! raw-text elements (`<script>`, `<style>`) and comments like a browser,
//! without building a DOM. Attribute values are entity-decoded with the
//! HTML standard's attribute rules (`htmlize`), and the body is decoded from
//! its charset (BOM, then HTTP header, then `<meta>`, then UTF-8).

use std::borrow::Cow;
use std::cell::RefCell;

use encoding_rs::{Encoding, UTF_8};
use lol_html::{HtmlRewriter, Settings, element};
use url::Url;

use crate::scope::normalize;

/// What to extract.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtractOptions {
    /// Every `href` attribute, not only `a[href]` and `area[href]`.
    pub all_hrefs: bool,
    /// Keep links of every scheme, not only http and https.
    pub keep_schemes: bool,
}

/// Why a page could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error("html tokenizer failed: {0}")]
pub struct ExtractError(String);

impl ExtractError {
    /// The tokenizer panicked on the blocking pool.
    pub fn from_panic(error: &tokio::task::JoinError) -> Self {
        Self(format!("tokenizer task failed: {error}"))
    }
}

/// Returns the distinct links of an HTML page, in document order.
///
/// `charset` is the `charset` parameter of the response's Content-Type, if
/// any; `page_url` is the URL the page was finally served from (after
/// redirects), against which relative links and `<base href>` resolve.
pub fn extract_links(
    body: &[u8],
    charset: Option<&str>,
    page_url: &Url,
    options: ExtractOptions,
) -> Result<Vec<Url>, ExtractError> {
    let (encoding, bom_length) = detect_encoding(body, charset);
    let (text, _) = encoding.decode_without_bom_handling(&body[bom_length..]);

    let base_href = RefCell::new(None::<String>);
    let hrefs = RefCell::new(Vec::<String>::new());
    let collect = |el: &mut lol_html::html_content::Element| {
        if let Some(href) = el.get_attribute("href") {
            hrefs.borrow_mut().push(href);
        }
        Ok(())
    };
    let mut settings = Settings::new()
        .with_strict(false)
        .append_element_content_handler(element!("base[href]", |el| {
            let mut base = base_href.borrow_mut();
            if base.is_none() {
                *base = el.get_attribute("href");
            }
            Ok(())
        }));
    if options.all_hrefs {
        settings = settings.append_element_content_handler(element!("[href]", collect));
    } else {
        settings = settings
            .append_element_content_handler(element!("a[href]", collect))
            .append_element_content_handler(element!("area[href]", collect));
    }
    let mut rewriter = HtmlRewriter::new(settings, |_: &[u8]| {});
    rewriter
        .write(text.as_bytes())
        .map_err(|error| ExtractError(error.to_string()))?;
    rewriter
        .end()
        .map_err(|error| ExtractError(error.to_string()))?;

    // The URL standard encodes queries in the document's encoding, except
    // that UTF-16 documents use UTF-8.
    let query_encoding = encoding.output_encoding();
    let encode_query: &dyn Fn(&str) -> Cow<'_, [u8]> = &|input| query_encoding.encode(input).0;
    let parse = |base: Option<&Url>, href: &str| -> Option<Url> {
        let decoded = htmlize::unescape_attribute(href);
        let options = Url::options().base_url(base);
        let options = if query_encoding == UTF_8 {
            options
        } else {
            options.encoding_override(Some(encode_query))
        };
        options.parse(&decoded).ok()
    };

    // The document base URL is the first <base href> wherever it appears,
    // resolved against the page URL; data: and javascript: bases are ignored.
    let base = base_href
        .into_inner()
        .and_then(|href| parse(Some(page_url), &href))
        .filter(|base| !matches!(base.scheme(), "data" | "javascript"))
        .unwrap_or_else(|| page_url.clone());

    let mut seen = foldhash::HashSet::default();
    let links = hrefs
        .into_inner()
        .iter()
        .filter_map(|href| parse(Some(&base), href))
        .map(normalize)
        .filter(|link| options.keep_schemes || matches!(link.scheme(), "http" | "https"))
        .filter(|link| seen.insert(link.as_str().to_owned()))
        .collect();
    Ok(links)
}

/// Whether a response with this Content-Type (or none) is worth parsing.
///
/// A missing Content-Type falls back to sniffing the first bytes.
pub fn is_html(content_type: Option<&str>, first_bytes: &[u8]) -> bool {
    match content_type {
        Some(value) => {
            let essence = value.split(';').next().unwrap_or_default().trim();
            essence.eq_ignore_ascii_case("text/html")
                || essence.eq_ignore_ascii_case("application/xhtml+xml")
        }
        None => {
            let start = first_bytes.trim_ascii_start();
            let head = &start[..start.len().min(16)];
            let head = head.to_ascii_lowercase();
            head.starts_with(b"<!doctype html") || head.starts_with(b"<html")
        }
    }
}

/// The `charset` parameter of a Content-Type value.
pub fn charset_of(content_type: &str) -> Option<&str> {
    content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches(['"', '\'']))
    })
}

/// Picks the encoding per the HTML standard's order, much simplified:
/// byte-order mark, then the HTTP charset, then a `<meta>` charset in the
/// first 1024 bytes, then UTF-8 (the web's overwhelming default today).
fn detect_encoding(body: &[u8], http_charset: Option<&str>) -> (&'static Encoding, usize) {
    if let Some((encoding, bom_length)) = Encoding::for_bom(body) {
        return (encoding, bom_length);
    }
    let declared = http_charset
        .and_then(|label| Encoding::for_label(label.as_bytes()))
        .or_else(|| meta_charset(&body[..body.len().min(1024)]));
    (declared.unwrap_or(UTF_8), 0)
}

/// Finds `charset=...` inside a `<meta ...>` tag, covering both
/// `<meta charset="x">` and `<meta http-equiv content="...; charset=x">`.
/// A `<meta>` cannot declare UTF-16 (the bytes would not be ASCII), so such
/// a declaration means UTF-8, as the standard says.
fn meta_charset(prefix: &[u8]) -> Option<&'static Encoding> {
    let lower = prefix.to_ascii_lowercase();
    let mut rest = lower.as_slice();
    while let Some(start) = find(rest, b"<meta") {
        let tag = &rest[start..];
        let end = tag.iter().position(|&b| b == b'>').unwrap_or(tag.len());
        let tag = &tag[..end];
        if let Some(at) = find(tag, b"charset") {
            let value = tag[at + b"charset".len()..]
                .trim_ascii_start()
                .strip_prefix(b"=")
                .map(|v| v.trim_ascii_start())
                .map(|v| v.strip_prefix(b"\"").or(v.strip_prefix(b"'")).unwrap_or(v));
            if let Some(value) = value {
                let label_end = value
                    .iter()
                    .position(|&b| {
                        matches!(b, b'"' | b'\'' | b';' | b'/') || b.is_ascii_whitespace()
                    })
                    .unwrap_or(value.len());
                if let Some(encoding) = Encoding::for_label(&value[..label_end]) {
                    let is_utf16 =
                        encoding == encoding_rs::UTF_16LE || encoding == encoding_rs::UTF_16BE;
                    return Some(if is_utf16 { UTF_8 } else { encoding });
                }
            }
        }
        rest = &rest[start + end..];
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "http://site.test/dir/page.html";

    fn links(html: &str, options: ExtractOptions) -> Vec<String> {
        let page = Url::parse(PAGE).expect("PAGE is a valid URL");
        extract_links(html.as_bytes(), None, &page, options)
            .expect("test pages parse")
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn links_are_extracted_and_resolved_per_the_standards() {
        let defaults = ExtractOptions::default();
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "relative path",
                r#"<a href="other.html">"#,
                &["http://site.test/dir/other.html"],
            ),
            (
                "parent path",
                r#"<a href="../up.html">"#,
                &["http://site.test/up.html"],
            ),
            (
                "absolute path",
                r#"<a href="/root">"#,
                &["http://site.test/root"],
            ),
            (
                "scheme-relative",
                r#"<a href="//cdn.test/x">"#,
                &["http://cdn.test/x"],
            ),
            (
                "absolute URL",
                r#"<a href="https://other.test/">"#,
                &["https://other.test/"],
            ),
            (
                "single quotes",
                "<a href='single.html'>",
                &["http://site.test/dir/single.html"],
            ),
            (
                "unquoted",
                "<a href=unquoted.html>",
                &["http://site.test/dir/unquoted.html"],
            ),
            (
                "uppercase tag and attribute",
                r#"<A HREF="upper.html">"#,
                &["http://site.test/dir/upper.html"],
            ),
            (
                "named entity",
                r#"<a href="q?a=1&amp;b=2">"#,
                &["http://site.test/dir/q?a=1&b=2"],
            ),
            (
                "numeric entities",
                r#"<a href="&#x2F;hex&#47;dec">"#,
                &["http://site.test/hex/dec"],
            ),
            (
                "legacy entity without semicolon",
                r#"<a href="q?a=1&copy=2">"#,
                &["http://site.test/dir/q?a=1&copy=2"],
            ),
            (
                "whitespace trimmed",
                "<a href=\"  spaced.html\n\">",
                &["http://site.test/dir/spaced.html"],
            ),
            (
                "fragment removed",
                r##"<a href="f.html#section">"##,
                &["http://site.test/dir/f.html"],
            ),
            (
                "fragment-only link is the page",
                r##"<a href="#top">"##,
                &["http://site.test/dir/page.html"],
            ),
            (
                "area element",
                r#"<map><area href="/map-target"></map>"#,
                &["http://site.test/map-target"],
            ),
            (
                "duplicates kept once",
                r#"<a href="/d"><a href="/d#x"><a href="/d">"#,
                &["http://site.test/d"],
            ),
            (
                "mailto dropped",
                r#"<a href="mailto:a@b.test"><a href="/ok">"#,
                &["http://site.test/ok"],
            ),
            (
                "javascript dropped",
                r#"<a href="javascript:void(0)">"#,
                &[],
            ),
            (
                "link element ignored",
                r#"<link href="/style.css"><a href="/a">"#,
                &["http://site.test/a"],
            ),
            ("anchor without href ignored", r#"<a name="x">"#, &[]),
            (
                "inside script ignored",
                r#"<script>var s = '<a href="/fake">';</script><a href="/real">"#,
                &["http://site.test/real"],
            ),
            (
                "inside comment ignored",
                r#"<!-- <a href="/commented"> --><a href="/real">"#,
                &["http://site.test/real"],
            ),
            (
                "base href",
                r#"<head><base href="http://base.test/b/"></head><a href="x">"#,
                &["http://base.test/b/x"],
            ),
            (
                "relative base href",
                r#"<base href="/sub/"><a href="x">"#,
                &["http://site.test/sub/x"],
            ),
            (
                "base after the link still applies",
                r#"<a href="x"><base href="/late/">"#,
                &["http://site.test/late/x"],
            ),
            (
                "only the first base counts",
                r#"<base href="/one/"><base href="/two/"><a href="x">"#,
                &["http://site.test/one/x"],
            ),
            (
                "javascript base ignored",
                r#"<base href="javascript:x"><a href="y">"#,
                &["http://site.test/dir/y"],
            ),
            (
                "invalid link skipped",
                r#"<a href="http://[bad"><a href="/fine">"#,
                &["http://site.test/fine"],
            ),
            (
                "non-ASCII path percent-encoded",
                r#"<a href="/café">"#,
                &["http://site.test/caf%C3%A9"],
            ),
        ];
        for (name, html, expected) in cases {
            assert_eq!(links(html, defaults), *expected, "case: {name}");
        }
    }

    #[test]
    fn all_hrefs_takes_every_href_attribute() {
        let html = r#"<link href="/style.css"><div href="/div"></div><a href="/a">"#;
        let options = ExtractOptions {
            all_hrefs: true,
            ..Default::default()
        };
        assert_eq!(
            links(html, options),
            [
                "http://site.test/style.css",
                "http://site.test/div",
                "http://site.test/a"
            ]
        );
    }

    #[test]
    fn keep_schemes_keeps_mailto_and_friends() {
        let html = r#"<a href="mailto:a@b.test"><a href="ftp://f.test/x"><a href="/a">"#;
        let options = ExtractOptions {
            keep_schemes: true,
            ..Default::default()
        };
        assert_eq!(
            links(html, options),
            ["mailto:a@b.test", "ftp://f.test/x", "http://site.test/a"]
        );
    }

    #[test]
    fn charset_from_header_meta_and_bom_decodes_the_page() {
        let page = Url::parse(PAGE).expect("PAGE is a valid URL");
        // "é" in windows-1252 is the single byte 0xE9.
        let latin1 = b"<a href=\"/caf\xe9\">";
        let from_header =
            extract_links(latin1, Some("iso-8859-1"), &page, ExtractOptions::default())
                .expect("parses");
        assert_eq!(from_header[0].as_str(), "http://site.test/caf%C3%A9");

        let with_meta = b"<meta charset=\"windows-1252\"><a href=\"/caf\xe9?q=\xe9\">";
        let from_meta =
            extract_links(with_meta, None, &page, ExtractOptions::default()).expect("parses");
        // The path is always UTF-8; the query uses the document's encoding.
        assert_eq!(from_meta[0].as_str(), "http://site.test/caf%C3%A9?q=%E9");

        let mut utf16 = vec![0xFF, 0xFE];
        for unit in "<a href=\"/wide\">".encode_utf16() {
            utf16.extend_from_slice(&unit.to_le_bytes());
        }
        let from_bom = extract_links(&utf16, Some("iso-8859-1"), &page, ExtractOptions::default())
            .expect("parses");
        assert_eq!(from_bom[0].as_str(), "http://site.test/wide");
    }

    #[test]
    fn html_is_recognised_by_content_type_or_sniffing() {
        assert!(is_html(Some("text/html; charset=utf-8"), b""));
        assert!(is_html(Some("application/xhtml+xml"), b""));
        assert!(!is_html(Some("application/pdf"), b"<html>"));
        assert!(!is_html(Some("image/png"), b""));
        assert!(is_html(None, b"  <!DOCTYPE html><html>"));
        assert!(!is_html(None, b"%PDF-1.7"));
    }

    #[test]
    fn charset_parameter_is_read_from_content_type() {
        assert_eq!(
            charset_of("text/html; charset=\"ISO-8859-1\""),
            Some("ISO-8859-1")
        );
        assert_eq!(charset_of("text/html;Charset=utf-8"), Some("utf-8"));
        assert_eq!(charset_of("text/html"), None);
    }
}
