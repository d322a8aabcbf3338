//! `mandrill publish`: requests made and checked first (as the service
//! that reads the same configuration will parse them: `check.rs`), then
//! published in transactions where the broker has them, or at a rate.
//! Standard output lists what was published, one request a line
//! (`<message id> <host>`, or a JSON object with `--json`), each printed
//! once the broker confirmed it; the count goes to standard error.

use rand::rngs::ThreadRng;

use super::*;

mod check;
mod send;

use check::{Checks, Sent};
use send::{Printer, publish_at_rate, publish_batches, publish_one_by_one};
pub(super) use send::{publish_each, publish_in_batches, requests};

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
    check_flags(args)?;
    let checks = Checks::new(&config, args.config.config.is_some(), args.unchecked)?;
    let maker = Maker {
        signing: signing_key(&config, &args.as_requester, &args.key_file)?,
        rules: config.parse_rules(),
        ttl: args.ttl,
        reply_to: args.reply_to.clone(),
    };
    let mut rng = rand::rng();
    let mut gathered = Gathered::default();
    for (index, name) in args.names.iter().enumerate() {
        gathered.name(format!("argument {}", index + 1), name, &maker, &mut rng);
    }
    if let Some(path) = &args.file {
        let (text, shown) = read_file(path)?;
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if !(line.is_empty() || line.starts_with('#')) {
                let at = format!("{shown}:{}", index + 1);
                gathered.line(at, line, &maker, &checks, &mut rng);
            }
        }
    }
    // Random requests are made as they are published, not all up front;
    // one is made now to be checked if no other was made from a name.
    let mut random = args.random.unwrap_or(0);
    if random > 0 && gathered.first_made.is_none() {
        gathered.name(
            "--random".into(),
            random_instance_name(&mut rng).as_str(),
            &maker,
            &mut rng,
        );
        random -= 1;
    }
    let outgoing = gathered.checked(&maker, &checks)?;
    if maker.signing.is_some()
        && let Some(rate) = args.rate
    {
        still_valid_when_sent(outgoing.len(), rate, args.ttl)?;
    }
    if let Ok(Some(calendar)) = config.calendar() {
        let lifetime = maker.signing.as_ref().map(|_| args.ttl);
        if let Some(warning) = closed_calendar_warning(&calendar, jiff::Timestamp::now(), lifetime)
        {
            eprintln!("mandrill: warning: {warning}");
        }
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

/// `--rate` and `--ttl` within their bounds.
fn check_flags(args: &PublishArgs) -> Result<(), BadInput> {
    if let Some(rate) = args.rate
        && !(rate.is_finite() && (0.001..=config::limits::MAX_SIMULATE_RATE).contains(&rate))
    {
        return Err(BadInput(format!(
            "--rate {rate} must be between 0.001 and 1000000"
        )));
    }
    if args.ttl.is_zero() || args.ttl > crate::domain::signed::MAX_LIFETIME {
        return Err(BadInput(format!(
            "--ttl {} must be more than 0s and at most 24h",
            humantime::format_duration(args.ttl)
        )));
    }
    Ok(())
}

/// The requests made from names and lines are signed now, and at `--rate`
/// the last of `count` is sent `(count - 1) / rate` later: refused if its
/// token (valid `--ttl`) would have expired by then, as the service would
/// refuse it, before anything is published.
fn still_valid_when_sent(count: usize, rate: f64, ttl: Duration) -> Result<(), BadInput> {
    let last_sent =
        Duration::try_from_secs_f64(count.saturating_sub(1) as f64 / rate).unwrap_or(Duration::MAX);
    if last_sent >= ttl {
        return Err(BadInput(format!(
            "--rate {rate} sends the last of {count} requests signed now after {}, and \
             --ttl {} has expired its token by then (the service would refuse it): raise \
             --ttl or --rate",
            humantime::format_duration(Duration::from_secs(last_sent.as_secs())),
            humantime::format_duration(ttl)
        )));
    }
    Ok(())
}

/// `--file`'s text and how its lines are named (`-`: standard input).
fn read_file(path: &std::path::Path) -> anyhow::Result<(String, String)> {
    if path.as_os_str() == "-" {
        let text =
            std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?;
        return Ok((text, "stdin".to_owned()));
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok((text, path.display().to_string()))
}

/// The requests read and made so far, and what is wrong with them, each
/// named by where it came from (`argument 2`, `requests.txt:7`).
#[derive(Default)]
struct Gathered {
    outgoing: Vec<Outgoing>,
    errors: Vec<String>,
    /// The first request made from an instance name, and where it came
    /// from: checked for all of them (see [`Maker`]).
    first_made: Option<(usize, String)>,
}

impl Gathered {
    /// A request made for instance name `raw`.
    fn name(&mut self, at: String, raw: &str, maker: &Maker, rng: &mut ThreadRng) {
        match InstanceName::parse(raw) {
            Ok(name) => {
                self.first_made.get_or_insert((self.outgoing.len(), at));
                self.outgoing.push(maker.make(name, rng));
            }
            Err(why) => self
                .errors
                .push(format!("{at}: instance name {raw:?} {why}")),
        }
    }

    /// A line of `--file`: an instance name, a JSON request or a signed one.
    fn line(
        &mut self,
        at: String,
        line: &str,
        maker: &Maker,
        checks: &Checks,
        rng: &mut ThreadRng,
    ) {
        let is_signed = crate::domain::signed::is_compact_jws(line.as_bytes());
        if !is_signed && !line.starts_with('{') {
            return self.name(at, line, maker, rng);
        }
        if maker.reply_to.is_some() {
            return self.errors.push(format!(
                "{at}: --reply-to applies to the requests made from instance names; \
                 a JSON or signed line says its own reply_to"
            ));
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
                Err(rejection) => return self.errors.push(format!("{at}: {rejection}")),
            }
        };
        match checks.examine(&payload, &maker.rules) {
            Ok(sent) => self.outgoing.push((payload, sent)),
            Err(why) => self.errors.push(format!("{at}: {why}")),
        }
    }

    /// What to publish, once the requests made from names are checked
    /// too; else exit 2 listing every refusal (nothing was published).
    fn checked(mut self, maker: &Maker, checks: &Checks) -> Result<Vec<Outgoing>, BadInput> {
        if let Some((index, at)) = &self.first_made
            && let Err(why) = checks.examine(&self.outgoing[*index].0, &maker.rules)
        {
            self.errors.push(format!(
                "{at} (and every other request made from an instance name): {why}"
            ));
        }
        refuse_any(&self.errors)?;
        if self.outgoing.is_empty() {
            return Err(BadInput(
                "nothing to publish: give instance names, --file PATH or --random N".into(),
            ));
        }
        if checks.signed_unverified() && self.outgoing.iter().any(|(_, sent)| sent.signed) {
            eprintln!(
                "mandrill: signed requests not verified here: no configuration file (--config) \
                 names their requesters; the service verifies them"
            );
        }
        Ok(self.outgoing)
    }
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
