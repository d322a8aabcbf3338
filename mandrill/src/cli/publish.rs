//! `mandrill publish`: requests validated first, then published in
//! transactions where the broker has them, or at a rate.

use super::*;

/// At most this many invalid lines are listed; the rest are counted.
pub(super) const MAX_LISTED_ERRORS: usize = 20;

/// Most requests published in one SQLite transaction: `--random N` is
/// generated and published this many at a time, never all in memory.
pub(super) const PUBLISH_BATCH: usize = 10_000;

/// Reads and validates every request first, then publishes them in
/// transactions of up to [`PUBLISH_BATCH`] (or, with `--rate`, one due group
/// at a time).
pub(super) async fn publish(config: Config, args: &PublishArgs) -> anyhow::Result<()> {
    let url = queue_url(&config)?;
    if let Some(rate) = args.rate
        && !(rate.is_finite() && (0.001..=config::limits::MAX_SIMULATE_RATE).contains(&rate))
    {
        return Err(BadInput(format!("--rate {rate} must be between 0.001 and 1000000")).into());
    }
    if args.ttl.is_zero() || args.ttl > crate::domain::signed::MAX_LIFETIME {
        return Err(BadInput(format!(
            "--ttl {} must be more than 0s and at most 24h",
            humantime::format_duration(args.ttl)
        ))
        .into());
    }
    let signing = signing_key(&config, &args.as_requester, &args.key_file)?;
    if let Ok(Some(calendar)) = config.calendar() {
        let lifetime = signing.as_ref().map(|_| args.ttl);
        if let Some(warning) = closed_calendar_warning(&calendar, jiff::Timestamp::now(), lifetime)
        {
            eprintln!("mandrill: warning: {warning}");
        }
    }
    let rules = config.parse_rules();
    let mut rng = rand::rng();
    // The payload of a request: signed with --as, else its JSON.
    let encode = move |request: &RestartRequest| match &signing {
        None => Bytes::from(request.to_wire()),
        Some((name, key)) => {
            let mut wire = request.to_wire_request();
            // The verified requester replaces it anyway.
            wire.requested_by = None;
            let token = key
                .sign(&wire, name, std::time::SystemTime::now(), args.ttl)
                // The key signed a probe when it was read, and the claims
                // are a struct of strings and numbers.
                .expect("a key that signed its probe signs a request");
            Bytes::from(token)
        }
    };
    let request = |name: InstanceName, rng: &mut rand::rngs::ThreadRng| {
        let now = std::time::SystemTime::now();
        encode(&RestartRequest {
            message_id: crate::domain::new_message_id(now, rng),
            hostname: Hostname::new(&name, &rules.domain),
            instance_name: name,
            requested_by: Some("mandrill-publish".into()),
            reason: None,
            published_at: Some(now),
            group: None,
            requested_group: None,
            zone: None,
            requester: None,
            signature: None,
            reach: None,
            machine: None,
            not_before: None,
            reply_to: None,
        })
    };
    let mut payloads = Vec::new();
    let mut errors = Vec::new();
    for (index, name) in args.names.iter().enumerate() {
        match InstanceName::parse(name) {
            Ok(name) => payloads.push(request(name, &mut rng)),
            Err(why) => errors.push(format!(
                "argument {}: instance name {name:?} {why}",
                index + 1
            )),
        }
    }
    if let Some(path) = &args.file {
        let (text, shown) = if path.as_os_str() == "-" {
            let text =
                std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?;
            (text, "stdin".to_owned())
        } else {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            (text, path.display().to_string())
        };
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("{shown}:{}", index + 1);
            if crate::domain::signed::is_compact_jws(line.as_bytes()) {
                // Already signed: published unchanged (the worker verifies it).
                payloads.push(Bytes::copy_from_slice(line.as_bytes()));
            } else if line.starts_with('{') {
                // Published as written, so that fields this version does not
                // know travel on; validated as the worker will validate it.
                // With --as, its known fields are signed instead.
                match RestartRequest::parse(line.as_bytes(), &rules) {
                    Ok(request) if args.as_requester.is_some() => payloads.push(encode(&request)),
                    Ok(_) => payloads.push(Bytes::copy_from_slice(line.as_bytes())),
                    Err(rejection) => errors.push(format!("{at}: {rejection}")),
                }
            } else {
                match InstanceName::parse(line) {
                    Ok(name) => payloads.push(request(name, &mut rng)),
                    Err(why) => errors.push(format!("{at}: instance name {line:?} {why}")),
                }
            }
        }
    }
    if !errors.is_empty() {
        let mut message = format!(
            "{} invalid request(s); nothing was published:",
            errors.len()
        );
        for error in errors.iter().take(MAX_LISTED_ERRORS) {
            message.push_str("\n  ");
            message.push_str(error);
        }
        if errors.len() > MAX_LISTED_ERRORS {
            message.push_str(&format!(
                "\n  … and {} more",
                errors.len() - MAX_LISTED_ERRORS
            ));
        }
        return Err(BadInput(message).into());
    }
    let random = args.random.unwrap_or(0);
    if payloads.is_empty() && random == 0 {
        return Err(BadInput(
            "nothing to publish: give instance names, --file PATH or --random N".into(),
        )
        .into());
    }
    // Random requests are made as they are published, not all up front.
    let payloads = payloads.into_iter().chain((0..random).map(move |_| {
        let name = random_instance_name(&mut rng);
        request(name, &mut rng)
    }));
    let published = if let BrokerUrl::Sqlite { .. } = url {
        let broker = service::open_sqlite_broker(&config.broker).await?;
        let published = match args.rate {
            None => publish_in_batches(&broker, payloads).await,
            Some(rate) => publish_at_rate(&broker, payloads, rate).await,
        };
        broker.close().await;
        published
    } else if let (BrokerUrl::PubSub { .. }, None) = (&url, args.rate) {
        // Up to 1000 messages per call, never all in memory.
        let broker = service::open_pubsub_publisher(&config).await?;
        let published = publish_in_batches(&broker, payloads).await;
        broker.close().await;
        published
    } else {
        // Other brokers have no multi-message transaction: every request was
        // validated above, and they are published one by one.
        let broker = service::open_publisher(&config).await?;
        let published = publish_each(&*broker, payloads, args.rate).await;
        broker.close().await;
        published
    };
    let published = published.context("cannot publish")?;
    println!("published {published} requests");
    Ok(())
}

/// What to tell whoever publishes while the calendar is closed: nothing
/// runs before it opens (the request waits for it; closed time does not
/// count against `safety.max_defer`), and a signed request whose token
/// (`lifetime`) ends before the opening is denied then, never restarted.
/// `None` while the calendar is open.
pub(super) fn closed_calendar_warning(
    calendar: &crate::safety::Calendar,
    now: jiff::Timestamp,
    lifetime: Option<Duration>,
) -> Option<String> {
    let (open, outlook) = calendar.outlook(now);
    if open {
        return None;
    }
    let mut warning = format!(
        "the calendar is {outlook}: nothing published now is restarted before then (it waits; \
         closed time does not count against safety.max_defer)"
    );
    let opens = calendar.next_open(now);
    if let (Some(lifetime), Some(opens)) = (lifetime, opens) {
        let ends = jiff::SignedDuration::try_from(lifetime)
            .ok()
            .and_then(|lifetime| now.checked_add(lifetime).ok());
        if ends.is_some_and(|ends| ends < opens) {
            warning.push_str(&format!(
                "; its signed token (--ttl {}) expires before the opening, so it will be denied \
                 then, not restarted",
                humantime::format_duration(lifetime)
            ));
        }
    }
    Some(warning)
}

/// `--as NAME --key-file FILE`, read and checked: the name and the key,
/// signing for `safety.audience`.
pub(super) fn signing_key(
    config: &Config,
    as_requester: &Option<String>,
    key_file: &Option<PathBuf>,
) -> anyhow::Result<Option<(String, crate::domain::SigningKey)>> {
    let (Some(name), Some(path)) = (as_requester, key_file) else {
        return Ok(None);
    };
    crate::safety::requesters::valid_name(name)
        .map_err(|why| BadInput(format!("--as: requester name {why}")))?;
    let pem = std::fs::read_to_string(path).map_err(|error| {
        BadInput(format!(
            "--key-file: cannot read {}: {error}",
            path.display()
        ))
    })?;
    let key = crate::domain::SigningKey::from_pem(&pem)
        .map_err(|why| BadInput(format!("--key-file {} {why}", path.display())))?
        .for_audience(config.safety.audience.clone());
    Ok(Some((name.clone(), key)))
}

/// Publishes in batches of up to [`PUBLISH_BATCH`] (on SQLite, a
/// transaction each).
pub(super) async fn publish_in_batches(
    broker: &dyn Publisher,
    payloads: impl Iterator<Item = Bytes>,
) -> Result<usize, BrokerError> {
    let mut payloads = payloads.peekable();
    let mut published = 0usize;
    while payloads.peek().is_some() {
        let batch: Vec<Bytes> = payloads.by_ref().take(PUBLISH_BATCH).collect();
        let size = batch.len();
        if let Err(error) = broker.publish_all(batch).await {
            if published > 0 {
                eprintln!("mandrill: published {published} requests before failing");
            }
            return Err(error);
        }
        published += size;
    }
    Ok(published)
}

/// Publishes one by one, at `rate` per second if given.
pub(super) async fn publish_each(
    broker: &dyn Publisher,
    payloads: impl Iterator<Item = Bytes>,
    rate: Option<f64>,
) -> Result<usize, BrokerError> {
    let started = tokio::time::Instant::now();
    let mut count = 0;
    for (published, payload) in payloads.enumerate() {
        if let Some(rate) = rate {
            // Bounded: a far-off due time must not overflow the clock.
            let offset = Duration::try_from_secs_f64(published as f64 / rate)
                .unwrap_or(config::limits::MAX_DURATION)
                .min(config::limits::MAX_DURATION);
            let due = started + offset;
            tokio::time::sleep_until(due).await;
        }
        if let Err(error) = broker.publish(payload).await {
            eprintln!("mandrill: published {published} requests before failing");
            return Err(error);
        }
        count = published + 1;
    }
    Ok(count)
}

/// Publishes `rate` payloads per second: every tick, the ones due so far, in
/// one transaction.
pub(super) async fn publish_at_rate(
    broker: &SqliteBroker,
    payloads: impl Iterator<Item = Bytes>,
    rate: f64,
) -> Result<usize, BrokerError> {
    const TICK: Duration = Duration::from_millis(10);
    let started = tokio::time::Instant::now();
    let mut pending = payloads.peekable();
    let mut published = 0usize;
    while pending.peek().is_some() {
        // At least one each round, so that a slow rate still starts at once.
        let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).saturating_sub(published);
        let group: Vec<Bytes> = pending.by_ref().take(due.min(PUBLISH_BATCH)).collect();
        published += group.len();
        broker.publish_all(group).await?;
        if pending.peek().is_some() {
            tokio::time::sleep(TICK).await;
        }
    }
    Ok(published)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37: `publish` said nothing on a Saturday. Closed now, it
    /// says when the calendar opens and that nothing runs before; with a
    /// token that ends before the opening, that it will be denied then.
    #[test]
    fn publishing_while_the_calendar_is_closed_warns_until_when_and_about_a_short_token() {
        let calendar = crate::safety::Calendar::chaos_monkey();
        let saturday: jiff::Timestamp = "2026-11-28T10:00:00Z".parse().unwrap();
        let warning = closed_calendar_warning(&calendar, saturday, None).unwrap();
        assert!(
            warning.starts_with(
                "the calendar is closed now (outside Mon–Fri 09:00–15:00 UTC); next opens \
                 2026-11-30 09:00 UTC: nothing published now is restarted before then"
            ),
            "{warning}"
        );
        assert!(!warning.contains("denied"), "{warning}");
        let short = closed_calendar_warning(&calendar, saturday, Some(Duration::from_secs(3600)));
        assert!(
            short
                .unwrap()
                .ends_with("its signed token (--ttl 1h) expires before the opening, so it will be denied then, not restarted"),
        );
        let monday: jiff::Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        assert_eq!(closed_calendar_warning(&calendar, monday, None), None);
    }
}
