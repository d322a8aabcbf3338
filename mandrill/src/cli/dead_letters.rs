//! `mandrill dead-letters` and `requeue`, on any broker that implements
//! [`DeadLetterAdmin`].

use super::*;

/// The dead-letter administration `broker.url` names, refusing a queue
/// that has none here and a SQLite file that does not exist.
pub(super) async fn open_dead_letter_admin(
    config: &Config,
) -> anyhow::Result<Arc<dyn DeadLetterAdmin>> {
    let url = &config.broker.url;
    if let BrokerUrl::Sqlite { url } = queue_url(config)?
        && let Some(path) = missing_sqlite_file(&url)
    {
        bail!("no database at {path}: nothing was ever queued there (broker.url {url:?})");
    }
    match service::open_dead_letter_admin(config).await? {
        Some(admin) => Ok(admin),
        None => Err(BadInput(format!(
            "broker.url {:?} is not supported here: use sqlite:PATH",
            redact_url(url)
        ))
        .into()),
    }
}

pub(super) async fn dead_letters(config: Config, args: &DeadLettersArgs) -> anyhow::Result<()> {
    let admin = open_dead_letter_admin(&config).await?;
    let entries = admin.dead_letters().await;
    admin.close().await;
    let entries = entries.context("cannot read the dead letters")?;
    let mut out = std::io::stdout().lock();
    if !admin.keeps_records() {
        // Pub/Sub: what the dead-letter subscription holds (it stays there).
        for e in &entries {
            let payload = String::from_utf8_lossy(&e.payload);
            if args.json {
                let line = serde_json::json!({
                    "id": e.id,
                    "reason": e.reason,
                    "payload": payload,
                });
                serde_json::to_writer(&mut out, &line)?;
                writeln!(out)?;
            } else {
                let payload: String = payload.chars().take(80).collect();
                writeln!(
                    out,
                    "{:>20}  {:<50}  {}",
                    e.id.to_string(),
                    e.reason,
                    payload.escape_debug()
                )?;
            }
        }
        return Ok(());
    }
    let record = |e: &DeadLetterEntry| {
        e.record.unwrap_or(DeadLetterRecord {
            deliveries: 0,
            published_at: 0,
            dead_at: 0,
            payload_size: 0,
        })
    };
    if args.json {
        for entry in &entries {
            let r = record(entry);
            let line = serde_json::json!({
                "id": entry.id,
                "reason": entry.reason,
                "deliveries": r.deliveries,
                "published_at": Timestamp::from_millis(r.published_at),
                "dead_at": Timestamp::from_millis(r.dead_at),
                "payload": String::from_utf8_lossy(&entry.payload),
            });
            serde_json::to_writer(&mut out, &line)?;
            writeln!(out)?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:>6}  {:<24}  {:>10}  {:<50}  PAYLOAD",
        "ID", "DEAD_AT", "DELIVERIES", "REASON"
    )?;
    for e in &entries {
        let r = record(e);
        let payload: String = String::from_utf8_lossy(&e.payload)
            .chars()
            .take(80)
            .collect();
        writeln!(
            out,
            "{:>6}  {:<24}  {:>10}  {:<50}  {}",
            e.id.to_string(),
            Timestamp::from_millis(r.dead_at).to_string(),
            r.deliveries,
            e.reason,
            payload.escape_debug(),
        )?;
    }
    Ok(())
}

pub(super) async fn requeue(config: Config, args: &RequeueArgs) -> anyhow::Result<()> {
    let admin = open_dead_letter_admin(&config).await?;
    let ids: Vec<String> = args.ids.iter().map(i64::to_string).collect();
    let requeued = admin.requeue((!args.all).then_some(ids.as_slice())).await;
    admin.close().await;
    let requeued = requeued.context("cannot requeue")?;
    println!("requeued {} dead letters", requeued.len());
    Ok(())
}
