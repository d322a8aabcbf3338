//! The benchmark's command line.

use std::time::Duration;

pub(super) struct Options {
    pub messages: usize,
    pub work: Duration,
    pub fail_rate: f64,
    pub broker: String,
    pub pull: String,
    pub db: String,
    pub notify: Option<String>,
    pub writers: u32,
    /// `--no-ceilings`: the pipeline alone, for profiling it.
    pub ceilings: bool,
    /// `--ids random`: version 4 message ids (the default, `ordered`, is
    /// version 7, as mandrill's own publishers mint them).
    pub random_ids: bool,
    /// `--signed`: every payload a token signed by one requester (Ed25519),
    /// verified by the worker: the signed path's cost per message.
    pub signed: bool,
    /// `--allocations`: count the pipeline's allocations (module
    /// `allocations`); implied by `--budget`.
    pub count_allocations: bool,
    /// `--budget FILE`: fail when the pipeline allocates more per message
    /// than the file allows its path (CI's guard).
    pub budget: Option<std::path::PathBuf>,
}

pub(super) fn parse_options() -> Options {
    let mut options = Options {
        messages: 100_000,
        work: Duration::ZERO,
        fail_rate: 0.0,
        broker: "memory".into(),
        pull: "unary".into(),
        db: "memory".into(),
        notify: None,
        writers: crate::store::postgres::DEFAULT_WRITERS,
        ceilings: true,
        random_ids: false,
        signed: false,
        count_allocations: false,
        budget: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match arg.as_str() {
            "--messages" => options.messages = value("--messages").parse().expect("--messages N"),
            "--work-ms" => {
                options.work =
                    Duration::from_millis(value("--work-ms").parse().expect("--work-ms W"))
            }
            "--fail-rate" => {
                options.fail_rate = value("--fail-rate").parse().expect("--fail-rate F")
            }
            "--broker" => options.broker = value("--broker"),
            "--db" => options.db = value("--db"),
            "--pull" => options.pull = value("--pull"),
            "--notify" => options.notify = Some(value("--notify")),
            "--writers" => options.writers = value("--writers").parse().expect("--writers N"),
            "--no-ceilings" => options.ceilings = false,
            "--ids" => match value("--ids").as_str() {
                "ordered" => options.random_ids = false,
                "random" => options.random_ids = true,
                other => panic!("--ids {other:?}: expected ordered or random"),
            },
            "--signed" => options.signed = true,
            "--allocations" => options.count_allocations = true,
            "--budget" => {
                options.budget = Some(value("--budget").into());
                options.count_allocations = true;
            }
            // `cargo bench` passes --bench to harness-less benchmarks.
            "--bench" => {}
            other => {
                panic!(
                    "unknown argument {other:?}; expected --messages, --work-ms, --fail-rate, --broker, --pull, --db, --notify, --writers, --no-ceilings, --ids, --signed, --allocations, --budget"
                )
            }
        }
    }
    options
}
