//! Captured output, bounded: a command may print without end, the record
//! and the log keep a prefix. (The command backend needs the same; the lead
//! may fold the two.)

use tokio::io::{AsyncRead, AsyncReadExt};

/// The first bytes of one stream and how many it held in all.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Captured {
    /// Up to the limit, as read.
    pub head: Vec<u8>,
    /// Every byte the stream held, kept or not.
    pub total: usize,
}

/// Reads `stream` to its end, keeping the first `limit` bytes and
/// discarding the rest (so that the writer never blocks on a full pipe). A
/// read error ends the stream: what was read is kept.
#[cfg(test)]
pub(crate) async fn read_bounded<R: AsyncRead + Unpin>(
    stream: Option<R>,
    limit: usize,
) -> Captured {
    let mut captured = Captured::default();
    capture(stream, &mut captured, limit).await;
    captured
}

/// Reads `stream` to its end into `into`, as [`read_bounded`] does; what
/// was read stays in `into` if the read is cut short.
pub(super) async fn capture<R: AsyncRead + Unpin>(
    stream: Option<R>,
    into: &mut Captured,
    limit: usize,
) {
    let Some(mut stream) = stream else {
        return;
    };
    let mut buffer = [0u8; 8192];
    while let Ok(read) = stream.read(&mut buffer).await {
        if read == 0 {
            return;
        }
        into.push(&buffer[..read], limit);
    }
}

impl Captured {
    /// Appends `bytes`, keeping the first `limit` bytes in all.
    pub(super) fn push(&mut self, bytes: &[u8], limit: usize) {
        let room = limit.saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..room]);
        self.total += bytes.len();
    }

    /// stdout then stderr, as text, at most `limit` bytes plus a note of
    /// what was cut; `None` when both were empty.
    pub(crate) fn describe(stdout: &Captured, stderr: &Captured, limit: usize) -> Option<String> {
        if stdout.total == 0 && stderr.total == 0 {
            return None;
        }
        let mut text = String::from_utf8_lossy(&stdout.head).into_owned();
        if stderr.total > 0 {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&String::from_utf8_lossy(&stderr.head));
        }
        let total = stdout.total + stderr.total;
        let mut end = text.len().min(limit);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        let kept = text.len();
        if total > kept {
            text.push_str(&format!("… ({} more bytes)", total - kept));
        }
        Some(text)
    }
}

/// `output` appended to a reason, after a colon, if there is any.
pub(super) fn suffix(output: Option<&str>) -> String {
    match output {
        Some(output) => format!(": {}", output.trim_end()),
        None => String::new(),
    }
}

/// At most 200 characters of `text`, for a log line.
pub(super) fn excerpt(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_is_bounded_and_says_what_was_cut() {
        let long = vec![b'x'; 10_000];
        let stdout = read_bounded(Some(&long[..]), 100).await;
        assert_eq!((stdout.head.len(), stdout.total), (100, 10_000));
        let stderr = read_bounded(Some(&b"oops\n"[..]), 100).await;
        let text = Captured::describe(&stdout, &stderr, 104).unwrap();
        assert!(text.starts_with(&"x".repeat(100)), "{text}");
        assert!(text.ends_with("… (9901 more bytes)"), "{text}");
        let empty = Captured::default();
        assert_eq!(Captured::describe(&empty, &empty, 10), None);
        let both = Captured::describe(
            &read_bounded(Some(&b"out"[..]), 10).await,
            &read_bounded(Some(&b"err"[..]), 10).await,
            100,
        );
        assert_eq!(both.as_deref(), Some("out\nerr"));
        assert_eq!(excerpt(&"é".repeat(300)).chars().count(), 201);
    }
}
