//! The reference in `docs/` that is generated from the code, so that it
//! cannot drift: every setting from its field doc ([`settings`]), every
//! command from clap ([`commands`]), every metric from the exposition
//! ([`metrics`]). `tests/reference.rs` checks that `docs/` holds the current
//! text; `MANDRILL_BLESS=1 cargo test -p mandrill --test reference` rewrites
//! it.

use clap::CommandFactory;

pub use crate::config::settings_reference as settings;

/// docs/cli.md's command reference: each subcommand's usage, what it does,
/// and its arguments with their help, walked from the clap definition.
pub fn commands() -> String {
    let mut cli = crate::cli::Cli::command();
    // Building sets each subcommand's full name (`mandrill policy check`)
    // and the arguments' value counts.
    cli.build();
    let mut text = String::new();
    for command in cli.get_subcommands() {
        write_command(&mut text, command, 3);
    }
    text
}

fn write_command(text: &mut String, command: &clap::Command, level: usize) {
    if command.is_hide_set() || command.get_name() == "help" {
        return;
    }
    let name = command.get_bin_name().unwrap_or(command.get_name());
    text.push_str(&format!("\n{} `{name}`\n\n", "#".repeat(level)));
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        text.push_str(&about.to_string());
        text.push_str("\n\n");
    }
    let usage = command.clone().render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage);
    text.push_str(&format!("Usage: `{usage}`\n"));
    let arguments: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && !["help", "version"].contains(&arg.get_id().as_str()))
        .collect();
    if !arguments.is_empty() {
        text.push_str("\n| argument | meaning |\n|---|---|\n");
    }
    for arg in arguments {
        text.push_str(&format!(
            "| `{}` | {} |\n",
            argument_name(arg),
            argument_help(arg)
        ));
    }
    for subcommand in command.get_subcommands() {
        write_command(text, subcommand, level + 1);
    }
}

/// `--broker <URL>`, `--unleash`, `--simulate [<RATE>]`, `<ID>...`.
fn argument_name(arg: &clap::Arg) -> String {
    let values = arg.get_num_args().unwrap_or_default();
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map_or_else(|| arg.get_id().as_str().to_uppercase(), ToString::to_string);
    let value = match (values.min_values(), values.max_values()) {
        (_, 0) => String::new(),
        (0, _) if !arg.is_positional() => format!("[<{value}>]"),
        (_, 1) => format!("<{value}>"),
        _ => format!("<{value}>..."),
    };
    let flag = match (arg.get_short(), arg.get_long()) {
        (Some(short), Some(long)) => format!("-{short}, --{long}"),
        (None, Some(long)) => format!("--{long}"),
        (Some(short), None) => format!("-{short}"),
        (None, None) => return value,
    };
    match value.as_str() {
        "" => flag,
        value => format!("{flag} {value}"),
    }
}

/// The argument's whole help, with its default, choices and variable.
fn argument_help(arg: &clap::Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let mut help = paragraphs(&help);
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|value| value.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && !arg.is_hide_default_value_set() && arg.get_action().takes_values() {
        help.push_str(&format!(" [default: {}]", defaults.join(", ")));
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| value.get_name().to_owned())
        .collect();
    if !choices.is_empty() && !arg.is_hide_possible_values_set() && arg.get_action().takes_values()
    {
        help.push_str(&format!(" [possible values: {}]", choices.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        help.push_str(&format!(" [env: {}]", env.to_string_lossy()));
    }
    help
}

/// A doc for a table cell: lines joined, paragraphs separated by `<br>`.
pub(crate) fn paragraphs(doc: &str) -> String {
    let mut cell = Vec::new();
    let mut paragraph = Vec::new();
    for line in doc.lines().map(str::trim).chain([""]) {
        if line.is_empty() {
            if !paragraph.is_empty() {
                cell.push(markdown_cell(&paragraph.join(" ")));
                paragraph.clear();
            }
        } else {
            paragraph.push(line);
        }
    }
    cell.join("<br>")
}

/// Text for a Markdown table cell: `|` escaped, and `<` too outside code
/// spans, so that `<unix>` is not taken for an HTML tag.
fn markdown_cell(text: &str) -> String {
    let mut cell = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => in_code = !in_code,
            '|' => cell.push('\\'),
            '<' if !in_code => {
                cell.push_str("&lt;");
                continue;
            }
            _ => {}
        }
        cell.push(c);
    }
    cell
}

/// Labels whose values are the operator's or the build's (a group's name,
/// the version), not a fixed set to list.
const OPEN_LABELS: &[&str] = &["group", "version"];

/// docs/operating.md's list of metrics: each family's name, type, labels
/// and help, read from what `/metrics` renders for an idle service.
pub fn metrics() -> String {
    struct Family {
        name: String,
        kind: String,
        help: String,
        labels: Vec<(String, Vec<String>)>,
    }
    let exposition = crate::admin::metrics::exposition_sample();
    let mut families: Vec<Family> = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(Family {
                name: name.to_owned(),
                kind: String::new(),
                help: help.to_owned(),
                labels: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some(family) = families.iter_mut().find(|f| f.name == name) {
                family.kind = kind.to_owned();
            }
        } else if let Some((name, labels)) = line.split_once('{') {
            // A histogram's `_bucket` lines have no family of that name:
            // their `le` goes without saying.
            let Some(family) = families.iter_mut().find(|f| f.name == name) else {
                continue;
            };
            let labels = labels.rsplit_once('}').map_or(labels, |(labels, _)| labels);
            for pair in labels.split(',') {
                let (label, value) = pair.split_once('=').unwrap_or((pair, ""));
                let value = value.trim_matches('"').to_owned();
                match family.labels.iter_mut().find(|(known, _)| known == label) {
                    Some((_, values)) => values.push(value),
                    None => family.labels.push((label.to_owned(), vec![value])),
                }
            }
        }
    }
    // The exporter renders in no fixed order.
    families.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    let mut text = String::from("| metric | type | labels | meaning |\n|---|---|---|---|\n");
    for mut family in families {
        for (_, values) in &mut family.labels {
            values.sort();
        }
        let labels: Vec<String> = family
            .labels
            .iter()
            .map(
                |(label, values)| match OPEN_LABELS.contains(&label.as_str()) {
                    true => format!("`{label}`"),
                    false => format!("`{label}`: {}", values.join(", ")),
                },
            )
            .collect();
        text.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            family.name,
            family.kind,
            labels.join("; "),
            markdown_cell(&family.help)
        ));
    }
    text
}
