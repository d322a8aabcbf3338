//! Temporary: extraction speed of each tokenizer on the benchmark's page.
use std::time::Instant;

use areq::extract::{ExtractOptions, Tokenizer, extract_links_with};

fn page(index: usize) -> Vec<u8> {
    let row = "<div class=\"row\"><span class=\"label\">Item</span> <p>Lorem ipsum dolor sit amet, \
               consectetur &amp; adipiscing elit, sed do <em>eiusmod</em> tempor incididunt ut labore \
               et dolore magna aliqua.</p><img src=\"/img/x.png\" alt=\"\"></div>\n";
    let filler = row.repeat((30_000 - 50 * 48) / row.len() + 1);
    let mut html = Vec::new();
    html.extend_from_slice(b"<!doctype html><html><head><meta charset=\"utf-8\"><title>page</title></head><body><ul>\n");
    for k in 0..50 {
        let target = (index * 10 + k * 7919) % 20_000;
        html.extend_from_slice(
            format!("<li><a href=\"/p/{target}\">page {target}</a></li>\n").as_bytes(),
        );
    }
    html.extend_from_slice(b"</ul>\n");
    html.extend_from_slice(filler.as_bytes());
    html.extend_from_slice(b"</body></html>\n");
    html
}

fn main() {
    let pages: Vec<Vec<u8>> = (0..200).map(page).collect();
    let url = url::Url::parse("http://127.0.0.1:8080/p/1").unwrap();
    for round in 0..3 {
        for (name, tokenizer) in [
            ("lol_html", Tokenizer::LolHtml),
            ("html5gum", Tokenizer::Html5gum),
            ("lol_lean", Tokenizer::LolHtmlLean),
        ] {
            let started = Instant::now();
            let mut links = 0;
            for _ in 0..10 {
                for body in &pages {
                    links += extract_links_with(
                        body,
                        Some("utf-8"),
                        &url,
                        ExtractOptions::default(),
                        tokenizer,
                    )
                    .unwrap()
                    .len();
                }
            }
            let per_page = started.elapsed().as_secs_f64() / 2000.0 * 1e6;
            println!("round {round} {name}: {per_page:.1} us/page ({links} links)");
        }
    }
}
