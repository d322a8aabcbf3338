//! `mandrill publish`: requests made and checked first (as the service
//! that reads the same configuration will parse them: `check.rs`), then
//! published in transactions where the broker has them, or at a rate.
//! Standard output lists what was published, one request a line
//! (`<message id> <host>`, or a JSON object with `--json`), each printed
//! once the broker confirmed it; the count goes to standard error.

use std::io::BufWriter;

use rand::rngs::ThreadRng;

use super::*;

mod check;

use check::{Checks, Sent};

/// At most this many invalid lines are listed; the rest are counted.
pub(super) const MAX_LISTED_ERRORS: usize = 20;

/// Most requests published in one SQLite transaction: `--random N` is
/// generated and published this many at a time, never all in memory.
pub(super) const PUBLISH_BATCH: usize = 10_000;

/// A request ready to go: its bytes, and what is printed once it went.
type Outgoing = (Bytes, Sent);

/// Reads, makes and checks every request first, then publishes them in
/// transactions of up to [`PUBLISH_BATCH`] (or, with `--rate`, one due group
/// at a time), printing each once published.
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
    let checks = Checks::new(&config, args.config.config.is_some(), args.unchecked)?;
    let maker = Maker {
        signing: signing_key(&config, &args.as_requester, &args.key_file)?,
        rules: config.parse_rules(),
        ttl: args.ttl,
        reply_to: args.reply_to.clone(),
    };
    let mut rng = rand::rng();
    let mut outgoing: Vec<Outgoing> = Vec::new();
    let mut errors = Vec::new();
    // Every request made from an instance name is made alike: the first
    // one made (and where it came from) is checked for all (see `Maker`).
    let mut first_made: Option<(usize, String)> = None;
    for (index, name) in args.names.iter().enumerate() {
        let at = format!("argument {}", index + 1);
        match InstanceName::parse(name) {
            Ok(name) => {
                first_made.get_or_insert((outgoing.len(), at));
                outgoing.push(maker.make(name, &mut rng));
            }
            Err(why) => errors.push(format!("{at}: instance name {name:?} {why}")),
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
            let is_signed = crate::domain::signed::is_compact_jws(line.as_bytes());
            if !is_signed && !line.starts_with('{') {
                match InstanceName::parse(line) {
                    Ok(name) => {
                        first_made.get_or_insert((outgoing.len(), at));
                        outgoing.push(maker.make(name, &mut rng));
                    }
                    Err(why) => errors.push(format!("{at}: instance name {line:?} {why}")),
                }
                continue;
            }
            if args.reply_to.is_some() {
                errors.push(format!(
                    "{at}: --reply-to applies to the requests made from instance names; \
                     a JSON or signed line says its own reply_to"
                ));
                continue;
            }
            let payload = if is_signed {
                // Already signed: published unchanged, once it reads as the
                // service will read it.
                Bytes::copy_from_slice(line.as_bytes())
            } else {
                // Published as written, so that fields this version does not
                // know travel on; validated as the worker will validate it.
                // With --as, its known fields are signed instead.
                match RestartRequest::parse(line.as_bytes(), &maker.rules) {
                    Ok(request) if maker.signing.is_some() => maker.encode(&request),
                    Ok(_) => Bytes::copy_from_slice(line.as_bytes()),
                    Err(rejection) => {
                        errors.push(format!("{at}: {rejection}"));
                        continue;
                    }
                }
            };
            match checks.examine(&payload, &maker.rules) {
                Ok(sent) => outgoing.push((payload, sent)),
                Err(why) => errors.push(format!("{at}: {why}")),
            }
        }
    }
    // Random requests are made as they are published, not all up front;
    // one is made now to be checked if no other was made from a name.
    let mut random = args.random.unwrap_or(0);
    if random > 0 && first_made.is_none() {
        first_made = Some((outgoing.len(), "--random".into()));
        outgoing.push(maker.make(random_instance_name(&mut rng), &mut rng));
        random -= 1;
    }
    if let Some((index, at)) = first_made
        && let Err(why) = checks.examine(&outgoing[index].0, &maker.rules)
    {
        errors.push(format!(
            "the requests made from instance names ({at} on): {why}"
        ));
    }
    refuse_any(&errors)?;
    if outgoing.is_empty() {
        return Err(BadInput(
            "nothing to publish: give instance names, --file PATH or --random N".into(),
        )
        .into());
    }
    if checks.signed_unverified() && outgoing.iter().any(|(_, sent)| sent.signed) {
        eprintln!(
            "mandrill: signed requests not verified here: no configuration file (--config) \
             names their requesters; the service verifies them"
        );
    }
    let outgoing = outgoing
        .into_iter()
        .chain((0..random).map(move |_| maker.make(random_instance_name(&mut rng), &mut rng)));
    let mut printer = Printer::new(args.json);
    let published = if let BrokerUrl::Sqlite { .. } = url {
        let broker = service::open_sqlite_broker(&config.broker).await?;
        let published = match args.rate {
            None => publish_batches(&broker, outgoing, &mut printer).await,
            Some(rate) => publish_at_rate(&broker, outgoing, rate, &mut printer).await,
        };
        broker.close().await;
        published
    } else if let (BrokerUrl::PubSub { .. }, None) = (&url, args.rate) {
        // Up to 1000 messages per call, never all in memory.
        let broker = service::open_pubsub_publisher(&config).await?;
        let published = publish_batches(&broker, outgoing, &mut printer).await;
        broker.close().await;
        published
    } else {
        // Other brokers have no multi-message transaction: every request was
        // checked above, and they are published one by one.
        let broker = service::open_publisher(&config).await?;
        let published = publish_one_by_one(&*broker, outgoing, args.rate, &mut printer).await;
        broker.close().await;
        published
    };
    let published = published.context("cannot publish")?;
    eprintln!("published {}", requests(published));
    Ok(())
}

/// "1 request", "2 requests".
pub(super) fn requests(count: usize) -> String {
    crate::settings::duration::count(count as u64, "request")
}

/// Exit 2 listing what is wrong, if anything is: nothing was published.
fn refuse_any(errors: &[String]) -> Result<(), BadInput> {
    if errors.is_empty() {
        return Ok(());
    }
    let mut message = format!(
        "nothing was published ({}):",
        crate::settings::duration::count(errors.len() as u64, "refusal")
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
    Err(BadInput(message))
}

/// Makes the requests publish sends for instance names: each alike but for
/// its instance and id, so that checking one checks how all are made.
struct Maker {
    /// `--as` and its key, if signing.
    signing: Option<(String, crate::domain::SigningKey)>,
    rules: crate::domain::ParseRules,
    ttl: Duration,
    reply_to: Option<String>,
}

impl Maker {
    /// A request for `name`, encoded, and what is printed for it.
    fn make(&self, name: InstanceName, rng: &mut ThreadRng) -> Outgoing {
        let now = std::time::SystemTime::now();
        let request = RestartRequest {
            message_id: crate::domain::new_message_id(now, rng),
            hostname: Hostname::new(&name, &self.rules.domain),
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
            reply_to: self.reply_to.clone(),
        };
        let payload = self.encode(&request);
        let mut sent = Sent::of(&request, self.signing.is_some());
        sent.requester = self.signing.as_ref().map(|(name, _)| name.clone());
        (payload, sent)
    }

    /// The payload of a request: signed with --as, else its JSON.
    fn encode(&self, request: &RestartRequest) -> Bytes {
        match &self.signing {
            None => Bytes::from(request.to_wire()),
            Some((name, key)) => {
                let mut wire = request.to_wire_request();
                // The verified requester replaces it anyway.
                wire.requested_by = None;
                let token = key
                    .sign(&wire, name, std::time::SystemTime::now(), self.ttl)
                    // The key signed a probe when it was read, and the claims
                    // are a struct of strings and numbers.
                    .expect("a key that signed its probe signs a request");
                Bytes::from(token)
            }
        }
    }
}

/// Prints each request once published: `<message id> <host>` lines, or
/// JSON objects; flushed after each confirmed batch, so that what stdout
/// holds was published even if a later batch fails.
struct Printer {
    json: bool,
    out: BufWriter<std::io::Stdout>,
}

impl Printer {
    fn new(json: bool) -> Self {
        Self {
            json,
            out: BufWriter::new(std::io::stdout()),
        }
    }
}

impl Published<Sent> for Printer {
    fn published(&mut self, sent: &[Sent]) {
        for sent in sent {
            let line = if self.json {
                // A struct of strings and a uuid serialises.
                serde_json::to_string(sent).expect("a Sent serialises")
            } else {
                sent.line()
            };
            // A closed stdout (a pipe's reader gone) must not stop the
            // publishing half-way: what was sent is sent.
            let _ = writeln!(self.out, "{line}");
        }
        let _ = self.out.flush();
    }
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
/// transaction each); how many were published.
pub(super) async fn publish_in_batches(
    broker: &dyn Publisher,
    payloads: impl Iterator<Item = Bytes>,
) -> Result<usize, BrokerError> {
    publish_batches(broker, payloads.map(|payload| (payload, ())), &mut Untold).await
}

/// Publishes one by one, at `rate` per second if given; how many were
/// published.
pub(super) async fn publish_each(
    broker: &dyn Publisher,
    payloads: impl Iterator<Item = Bytes>,
    rate: Option<f64>,
) -> Result<usize, BrokerError> {
    publish_one_by_one(
        broker,
        payloads.map(|payload| (payload, ())),
        rate,
        &mut Untold,
    )
    .await
}

/// What is told of each request once the broker confirmed it.
trait Published<T> {
    fn published(&mut self, sent: &[T]);
}

/// Tells nothing (a campaign prints its own).
struct Untold;

impl<T> Published<T> for Untold {
    fn published(&mut self, _: &[T]) {}
}

/// As [`publish_in_batches`], telling `told` of each batch once published.
async fn publish_batches<T>(
    broker: &dyn Publisher,
    outgoing: impl Iterator<Item = (Bytes, T)>,
    told: &mut impl Published<T>,
) -> Result<usize, BrokerError> {
    let mut outgoing = outgoing.peekable();
    let mut published = 0usize;
    while outgoing.peek().is_some() {
        let (batch, sent): (Vec<Bytes>, Vec<T>) = outgoing.by_ref().take(PUBLISH_BATCH).unzip();
        if let Err(error) = broker.publish_all(batch).await {
            if published > 0 {
                eprintln!("mandrill: published {} before failing", requests(published));
            }
            return Err(error);
        }
        told.published(&sent);
        published += sent.len();
    }
    Ok(published)
}

/// As [`publish_each`], telling `told` of each request once published.
async fn publish_one_by_one<T>(
    broker: &dyn Publisher,
    outgoing: impl Iterator<Item = (Bytes, T)>,
    rate: Option<f64>,
    told: &mut impl Published<T>,
) -> Result<usize, BrokerError> {
    let started = tokio::time::Instant::now();
    let mut count = 0;
    for (published, (payload, sent)) in outgoing.enumerate() {
        if let Some(rate) = rate {
            // Bounded: a far-off due time must not overflow the clock.
            let offset = Duration::try_from_secs_f64(published as f64 / rate)
                .unwrap_or(config::limits::MAX_DURATION)
                .min(config::limits::MAX_DURATION);
            let due = started + offset;
            tokio::time::sleep_until(due).await;
        }
        if let Err(error) = broker.publish(payload).await {
            eprintln!("mandrill: published {} before failing", requests(published));
            return Err(error);
        }
        told.published(std::slice::from_ref(&sent));
        count = published + 1;
    }
    Ok(count)
}

/// Publishes `rate` requests per second: every tick, the ones due so far,
/// in one transaction, each told once its transaction committed.
async fn publish_at_rate(
    broker: &SqliteBroker,
    outgoing: impl Iterator<Item = Outgoing>,
    rate: f64,
    told: &mut Printer,
) -> Result<usize, BrokerError> {
    const TICK: Duration = Duration::from_millis(10);
    let started = tokio::time::Instant::now();
    let mut pending = outgoing.peekable();
    let mut published = 0usize;
    while pending.peek().is_some() {
        // At least one each round, so that a slow rate still starts at once.
        let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).saturating_sub(published);
        let (group, sent): (Vec<Bytes>, Vec<Sent>) =
            pending.by_ref().take(due.min(PUBLISH_BATCH)).unzip();
        if let Err(error) = broker.publish_all(group).await {
            if published > 0 {
                eprintln!("mandrill: published {} before failing", requests(published));
            }
            return Err(error);
        }
        told.published(&sent);
        published += sent.len();
        if pending.peek().is_some() {
            tokio::time::sleep(TICK).await;
        }
    }
    Ok(published)
}
