//! `mandrill history`: recorded requests and outcomes, newest first.

use super::*;
use crate::settings::Redactor;
use crate::store::{DecisionRecord, HistoryEntry};

pub(super) fn history(args: &HistoryArgs) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    command(sources, |config| async move {
        print_history(&config, args).await
    })
}

pub(super) async fn print_history(config: &Config, args: &HistoryArgs) -> anyhow::Result<()> {
    let url = &config.store.url;
    if url == "memory" {
        bail!("store.url is memory: an in-memory store keeps no history after its process");
    }
    if let Some(path) = missing_sqlite_file(url) {
        bail!("no database at {path}: nothing has been recorded there (store.url {url:?})");
    }
    let store = service::open_store(&config.store).await?;
    // A recorded error may quote a connection string.
    let redactor = config.redactor();
    // Stdout is line-buffered: a write per line is a system call per row.
    let mut out = std::io::BufWriter::new(std::io::stdout());
    if !args.json {
        writeln!(
            out,
            "{:<24}  {:<36}  {:<28}  {:<16}  {:<11}  {:>8}  {:<24}  {:>9}  ERROR",
            "RECEIVED",
            "MESSAGE_ID",
            "HOST",
            "REQUESTED_BY",
            "STATUS",
            "ATTEMPTS",
            "COMPLETED",
            "RECOVERED"
        )?;
    }
    // Each entry is written as it is read, so a whole record prints in
    // bounded memory; a failed write (a closed pipe) stops the read.
    let mut failed = None;
    let read = store
        .each_history(args.limit, args.json, &mut |entry, decided| {
            let written = match args.json {
                true => json_line(&mut out, &redactor, &entry, decided),
                false => table_line(&mut out, &redactor, &entry),
            };
            written.map_err(|error| failed = Some(error)).is_ok()
        })
        .await;
    store.close().await;
    read.context("cannot read history")?;
    match failed.map_or_else(|| out.flush().map_err(Into::into), Err) {
        // The reader has all it wanted (`history | head`).
        Err(error) if closed_pipe(&error) => Ok(()),
        written => written,
    }
}

/// Whether writing failed because the reader closed its end.
fn closed_pipe(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
}

/// One entry of `history --json`: the entry, and its decisions as
/// `explain` tells them when it is a request's own record.
fn json_line(
    out: &mut impl Write,
    redactor: &Redactor,
    entry: &HistoryEntry,
    decided: Vec<DecisionRecord>,
) -> anyhow::Result<()> {
    let mut line = serde_json::to_value(entry)?;
    if entry.message_id.is_some() {
        line["decisions"] = serde_json::to_value(decided)?;
    }
    writeln!(out, "{}", redactor.scrub(&line.to_string()))?;
    Ok(())
}

/// One entry of `history`'s table.
fn table_line(out: &mut impl Write, redactor: &Redactor, e: &HistoryEntry) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<24}  {:<36}  {:<28}  {:<16}  {:<11}  {:>8}  {:<24}  {:>9}  {}",
        e.received_at.to_string(),
        e.message_id
            .map_or_else(|| "-".to_owned(), |id| id.to_string()),
        // A rejected payload has no host: the instance it named.
        e.hostname
            .as_deref()
            .or(e.instance_name.as_deref())
            .unwrap_or("-"),
        // The verified requester of a signed request; free text marked,
        // its runs of spaces made one: columns are two spaces apart, and
        // free text must not line up a status of its own under STATUS.
        one_spaced(&printable(
            &redactor.scrub(e.requested_by_shown().as_deref().unwrap_or("-"))
        )),
        e.status.as_str(),
        e.attempts,
        e.completed_at
            .map_or_else(|| "-".to_owned(), |t| t.to_string()),
        e.recovered_after
            .map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64())),
        printable(&redactor.scrub(e.last_error.as_deref().unwrap_or(""))),
    )?;
    Ok(())
}

/// `text` with each run of spaces made one.
fn one_spaced(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("  ") {
        return text.into();
    }
    let mut shown = String::with_capacity(text.len());
    for word in text.split(' ').filter(|word| !word.is_empty()) {
        if !shown.is_empty() {
            shown.push(' ');
        }
        shown.push_str(word);
    }
    shown.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Free text in `requested_by` cannot line up a status, a completion
    /// time and a recovery of its own under the table's headers, pushing
    /// the real status aside.
    #[test]
    fn a_requesters_free_text_cannot_forge_the_tables_columns() {
        let forged = format!(
            "ops{}restarted{}1  2025-06-01T10:00:00.000Z{}4.2s",
            " ".repeat(15),
            " ".repeat(11),
            " ".repeat(7)
        );
        let entry = HistoryEntry {
            message_id: None,
            instance_name: Some("cattle-01".into()),
            hostname: Some("cattle-01.example.net".into()),
            status: crate::domain::Status::Denied,
            attempts: 0,
            requested_by: Some(forged),
            verified: false,
            reason: None,
            last_error: None,
            output: None,
            recovered_after: None,
            received_at: crate::domain::Timestamp::from_millis(1_795_000_000_000),
            updated_at: crate::domain::Timestamp::from_millis(1_795_000_000_000),
            completed_at: None,
        };
        let mut out = Vec::new();
        table_line(&mut out, &Redactor::default(), &entry).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert!(
            line.contains("ops restarted 1 2025-06-01T10:00:00.000Z 4.2s (unverified)  denied"),
            "{line}"
        );
    }
}
