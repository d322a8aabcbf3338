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
mod tests;
