//! Writing edges as they arrive: tsv, jsonl or dot.
//!
//! The crawl loop sends one [`PageRecord`] per parsed page over a bounded
//! channel; a blocking thread formats and writes them, flushing whenever the
//! channel runs dry, so output is streamed and memory stays flat. Dropping
//! the sender (end of crawl or Ctrl-C) makes the thread write the footer,
//! flush and return.
//!
//! With `--state`, each message also carries the state changes that go with
//! its edges; after each batch the writer flushes the output and then
//! commits the changes together with the output's length (see
//! [`crate::state`]).

use std::io::{self, BufWriter, Write};

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use url::Url;

use crate::config::Format;
use crate::state::{Change, State};

/// The header line of the tsv format, as in the original areq.py.
pub const TSV_HEADER: &str = "source_url\tparsed_url";

/// The links found on one page.
#[derive(Debug, Clone)]
pub struct PageRecord {
    /// The URL that was requested.
    pub source: Url,
    /// The URL the page was served from, after redirects.
    pub final_url: Url,
    /// The HTTP status of the final response.
    pub status: u16,
    /// Hops from the seed.
    pub depth: u32,
    /// The Content-Type header, if any.
    pub content_type: Option<String>,
    /// The distinct links, in document order.
    pub links: Vec<Url>,
}

#[derive(Serialize)]
struct JsonEdge<'a> {
    source_url: &'a str,
    parsed_url: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    final_url: Option<&'a str>,
    status: u16,
    depth: u32,
    content_type: Option<&'a str>,
}

/// One page's worth of progress: its edges, if any, and the state changes
/// committed with them.
#[derive(Debug, Default)]
pub struct Step {
    /// The edges to write.
    pub record: Option<PageRecord>,
    /// Changes to the crawl state; empty without `--state`.
    pub changes: Vec<Change>,
}

/// The state file and where its output stands, for a resumable crawl.
#[derive(Debug)]
pub struct Persist {
    /// The open state.
    pub state: State,
    /// Bytes already in the output (committed by an earlier run); the sink
    /// is positioned there, and the header is written only when it is 0.
    pub output_len: u64,
}

/// Most messages in one state transaction; the writer commits sooner
/// whenever the channel runs dry.
const MAX_BATCH: usize = 1024;

/// The writer thread has stopped, on a write error.
#[derive(Debug, thiserror::Error)]
#[error("the output writer has stopped")]
pub struct OutputClosed;

/// The sending side of the output; see the module documentation.
#[derive(Debug)]
pub struct Output {
    sender: mpsc::Sender<Step>,
    writer: JoinHandle<io::Result<u64>>,
}

impl Output {
    /// Starts the writer thread; the header is written at once (unless a
    /// resumed output already has it).
    pub fn spawn(format: Format, sink: Box<dyn Write + Send>, persist: Option<Persist>) -> Self {
        let (sender, receiver) = mpsc::channel(256);
        let writer =
            tokio::task::spawn_blocking(move || write_all(format, sink, receiver, persist));
        Self { sender, writer }
    }

    /// Queues a page's edges; fails when the writer has stopped on an error
    /// (which [`Output::finish`] then returns).
    pub async fn send(&self, record: PageRecord) -> Result<(), OutputClosed> {
        self.send_step(Step {
            record: Some(record),
            changes: Vec::new(),
        })
        .await
    }

    /// Queues edges and state changes to be committed together.
    pub async fn send_step(&self, step: Step) -> Result<(), OutputClosed> {
        self.sender.send(step).await.map_err(|_| OutputClosed)
    }

    /// Closes the output and waits for everything to be written and
    /// flushed; returns the number of edges written.
    pub async fn finish(self) -> io::Result<u64> {
        drop(self.sender);
        self.writer
            .await
            .map_err(|error| io::Error::other(format!("output writer thread failed: {error}")))?
    }
}

/// Counts the bytes that reach the sink, so that the committed output
/// length is exact.
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.written += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn write_all(
    format: Format,
    sink: Box<dyn Write + Send>,
    mut receiver: mpsc::Receiver<Step>,
    mut persist: Option<Persist>,
) -> io::Result<u64> {
    let already = persist.as_ref().map_or(0, |p| p.output_len);
    let counting = Counting {
        inner: sink,
        written: already,
    };
    let mut out = BufWriter::with_capacity(64 * 1024, counting);
    if already == 0 {
        match format {
            Format::Tsv => writeln!(out, "{TSV_HEADER}")?,
            Format::Jsonl => {}
            Format::Dot => writeln!(out, "digraph links {{")?,
        }
    }
    out.flush()?;
    let mut edges = 0;
    let mut changes = Vec::new();
    let mut batched = 0;
    while let Some(step) = receiver.blocking_recv() {
        if let Some(record) = &step.record {
            write_record(format, &mut out, record)?;
            edges += record.links.len() as u64;
        }
        batched += 1;
        if persist.is_some() {
            changes.extend(step.changes);
        }
        if receiver.is_empty() || batched >= MAX_BATCH {
            out.flush()?;
            if let Some(persist) = &mut persist {
                // After the flush: the committed length never exceeds the file's.
                persist
                    .state
                    .commit(&changes, out.get_ref().written)
                    .map_err(io::Error::other)?;
                changes.clear();
            }
            batched = 0;
        }
    }
    out.flush()?;
    if let Some(persist) = &mut persist {
        persist
            .state
            .commit(&changes, out.get_ref().written)
            .map_err(io::Error::other)?;
    }
    // The footer is outside the committed length: a resumed run cuts it
    // off and writes it again at its end.
    if format == Format::Dot {
        writeln!(out, "}}")?;
    }
    out.flush()?;
    Ok(edges)
}

fn write_record(format: Format, out: &mut impl Write, record: &PageRecord) -> io::Result<()> {
    let source = record.source.as_str();
    match format {
        Format::Tsv => {
            for link in &record.links {
                writeln!(out, "{source}\t{}", link.as_str())?;
            }
        }
        Format::Jsonl => {
            let final_url =
                (record.final_url != record.source).then_some(record.final_url.as_str());
            for link in &record.links {
                let edge = JsonEdge {
                    source_url: source,
                    parsed_url: link.as_str(),
                    final_url,
                    status: record.status,
                    depth: record.depth,
                    content_type: record.content_type.as_deref(),
                };
                serde_json::to_writer(&mut *out, &edge)?;
                out.write_all(b"\n")?;
            }
        }
        Format::Dot => {
            let source = dot_quote(source);
            for link in &record.links {
                writeln!(out, "  {source} -> {};", dot_quote(link.as_str()))?;
            }
        }
    }
    Ok(())
}

fn dot_quote(id: &str) -> String {
    format!("\"{}\"", id.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> PageRecord {
        let url = |s: &str| Url::parse(s).expect("test URLs are valid");
        PageRecord {
            source: url("http://a.test/"),
            final_url: url("http://a.test/home"),
            status: 200,
            depth: 1,
            content_type: Some("text/html".into()),
            links: vec![url("http://a.test/x"), url("http://b.test/\"q\"")],
        }
    }

    fn render(format: Format) -> String {
        let mut out = Vec::new();
        write_record(format, &mut out, &record()).expect("writing to a Vec cannot fail");
        String::from_utf8(out).expect("output is UTF-8")
    }

    #[test]
    fn tsv_is_one_line_per_edge() {
        assert_eq!(
            render(Format::Tsv),
            "http://a.test/\thttp://a.test/x\nhttp://a.test/\thttp://b.test/%22q%22\n"
        );
    }

    #[test]
    fn jsonl_carries_status_depth_and_content_type() {
        let first = render(Format::Jsonl)
            .lines()
            .next()
            .map(str::to_owned)
            .unwrap_or_default();
        assert_eq!(
            first,
            r#"{"source_url":"http://a.test/","parsed_url":"http://a.test/x","final_url":"http://a.test/home","status":200,"depth":1,"content_type":"text/html"}"#
        );
    }

    #[test]
    fn dot_edges_are_quoted() {
        assert_eq!(
            render(Format::Dot),
            "  \"http://a.test/\" -> \"http://a.test/x\";\n  \"http://a.test/\" -> \"http://b.test/%22q%22\";\n"
        );
        assert_eq!(dot_quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
