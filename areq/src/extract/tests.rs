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
    let from_header = extract_links(latin1, Some("iso-8859-1"), &page, ExtractOptions::default())
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
