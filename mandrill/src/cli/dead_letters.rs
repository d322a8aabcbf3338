//! `mandrill dead-letters` and `requeue`, on every broker's
//! [`DeadLetterAdmin`], with one listing format for all of them.

use super::*;

/// The dead-letter administration `broker.url` names, refusing the
/// in-memory queue and a SQLite file that does not exist.
pub(super) async fn open_dead_letter_admin(
    config: &Config,
) -> anyhow::Result<Arc<dyn DeadLetterAdmin>> {
    if let BrokerUrl::Sqlite { url } = queue_url(config)?
        && let Some(path) = missing_sqlite_file(&url)
    {
        bail!("no database at {path}: nothing was ever queued there (broker.url {url:?})");
    }
    service::open_dead_letter_admin(config).await
}

pub(super) async fn dead_letters(config: Config, args: &DeadLettersArgs) -> anyhow::Result<()> {
    let admin = open_dead_letter_admin(&config).await?;
    let entries = admin.dead_letters().await;
    admin.close().await;
    let entries = entries.context("cannot read the dead letters")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        for entry in &entries {
            serde_json::to_writer(&mut out, &as_json(entry))?;
            writeln!(out)?;
        }
        return Ok(());
    }
    write!(out, "{}", table(&entries))?;
    Ok(())
}

pub(super) async fn requeue(config: Config, args: &RequeueArgs) -> anyhow::Result<()> {
    let admin = open_dead_letter_admin(&config).await?;
    let requeued = admin
        .requeue((!args.all).then_some(args.ids.as_slice()))
        .await;
    admin.close().await;
    let requeued = requeued.context("cannot requeue")?;
    println!("requeued {} dead letters", requeued.len());
    Ok(())
}

/// Most characters of a payload a table shows.
const PAYLOAD_SHOWN: usize = 80;

/// A dead letter as one JSON object: what is unknown (a broker that does
/// not keep it) is `null`.
fn as_json(entry: &DeadLetterEntry) -> serde_json::Value {
    serde_json::json!({
        "id": entry.id,
        "reason": entry.reason,
        "message_id": entry.message_id,
        "dead_at": entry.dead_at,
        "published_at": entry.published_at,
        "deliveries": entry.deliveries,
        "payload": String::from_utf8_lossy(&entry.payload),
        "payload_size": entry.payload_size,
        "truncated": entry.truncated,
    })
}

/// The dead letters as a table, a header line first; `-` where a broker
/// does not keep a column. Text from payloads is shown with control
/// characters escaped, so that nothing a publisher wrote drives the
/// terminal.
fn table(entries: &[DeadLetterEntry]) -> String {
    let id_width = entries
        .iter()
        .map(|e| e.id.to_string().len())
        .max()
        .unwrap_or(0)
        .max(2);
    let mut text = format!(
        "{:>id_width$}  {:<24}  {:>10}  {:<36}  {:<50}  PAYLOAD\n",
        "ID", "DEAD_AT", "DELIVERIES", "MESSAGE_ID", "REASON"
    );
    for e in entries {
        let deliveries = e.deliveries.map_or("-".to_owned(), |n| n.to_string());
        let payload: String = String::from_utf8_lossy(&e.payload)
            .chars()
            .take(PAYLOAD_SHOWN)
            .collect();
        text += &format!(
            "{:>id_width$}  {:<24}  {:>10}  {:<36}  {:<50}  {}\n",
            e.id.to_string(),
            e.dead_at.to_string(),
            deliveries,
            printable(e.message_id.as_deref().unwrap_or("-")),
            printable(&e.reason),
            printable(&payload),
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::broker::DeadLetterId;
    use crate::domain::Timestamp;

    fn entry(id: DeadLetterId, deliveries: Option<u64>) -> DeadLetterEntry {
        DeadLetterEntry {
            id,
            reason: "payload is not JSON\u{1b}[2J".into(),
            message_id: None,
            dead_at: Timestamp::from_millis(0),
            published_at: None,
            deliveries,
            payload: Bytes::from_static(b"\x1b]0;owned\x07{"),
            payload_size: 13,
            truncated: false,
        }
    }

    #[test]
    fn one_table_for_every_broker_with_dashes_for_what_it_does_not_keep() {
        let shown = table(&[
            entry(DeadLetterId::Number(7), Some(3)),
            entry(DeadLetterId::Message("12345678901234".into()), None),
        ]);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 3, "{shown}");
        assert!(lines[0].trim_start().starts_with("ID  DEAD_AT"), "{shown}");
        assert!(
            lines[1]
                .trim_start()
                .starts_with("7  1970-01-01T00:00:00.000Z")
        );
        let columns: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            columns[..4],
            ["12345678901234", "1970-01-01T00:00:00.000Z", "-", "-"]
        );
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
            "{shown:?}"
        );
        assert!(shown.contains("\\u{1b}]0;owned\\u{7}{"), "{shown}");
        let json = as_json(&entry(DeadLetterId::Number(7), None));
        assert_eq!(json["id"], 7);
        assert_eq!(json["deliveries"], serde_json::Value::Null);
        assert_eq!(json["message_id"], serde_json::Value::Null);
    }
}
