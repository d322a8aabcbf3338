//! Debug mode's per-message step timings: a tracing layer that notes when
//! each step of a `message` span was logged (`pulled`, `saved`,
//! `restarted`, `acked`, …) and, when the span closes, logs them all at
//! debug level relative to the first, on one line:
//!
//! ```text
//! DEBUG message step timings message_id=… steps="pulled +0.0ms, saved +51.2ms, restarted +102.9ms, acked +103.4ms"
//! ```
//!
//! A layer rather than timers in the handler: installed only in debug mode,
//! it costs the pipeline nothing otherwise, and every handler task stays
//! the size it was.

use std::fmt::Write as _;
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StepTimings;

/// The handler's span, whose steps are timed.
const SPAN: &str = "message";

/// What one message span has seen so far.
struct Steps {
    started: Instant,
    message_id: Option<String>,
    /// Each step's message and when it was logged, in µs since `started`.
    steps: Vec<(String, u64)>,
}

/// Picks one field's value out of an event or a span record.
struct Pick {
    name: &'static str,
    value: Option<String>,
}

impl Visit for Pick {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == self.name {
            self.value = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == self.name {
            self.value = Some(format!("{value:?}"));
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for StepTimings {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != SPAN {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Steps {
                started: Instant::now(),
                message_id: None,
                steps: Vec::new(),
            });
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut pick = Pick {
            name: "message_id",
            value: None,
        };
        values.record(&mut pick);
        if let (Some(value), Some(steps)) = (pick.value, span.extensions_mut().get_mut::<Steps>()) {
            steps.message_id = Some(value);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // The steps are the handler's info (and louder) lines.
        if *event.metadata().level() > Level::INFO {
            return;
        }
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let Some(span) = scope.into_iter().find(|span| span.name() == SPAN) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        let Some(steps) = extensions.get_mut::<Steps>() else {
            return;
        };
        let mut pick = Pick {
            name: "message",
            value: None,
        };
        event.record(&mut pick);
        let at = u64::try_from(steps.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        steps.steps.push((pick.value.unwrap_or_default(), at));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        // Taken out first: the line below is dispatched to this layer too.
        let Some(steps) = span.extensions_mut().remove::<Steps>() else {
            return;
        };
        drop(span);
        let mut line = String::new();
        for (i, (step, at)) in steps.steps.iter().enumerate() {
            let separator = if i == 0 { "" } else { ", " };
            // Writing to a String cannot fail.
            let _ = write!(line, "{separator}{step} +{:.1}ms", *at as f64 / 1000.0);
        }
        tracing::debug!(
            target: "mandrill::diagnostics::steps",
            message_id = %steps.message_id.as_deref().unwrap_or("-"),
            steps = %line,
            "message step timings"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::{info, info_span};
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// Collects the `steps` field of every timing line.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Lines {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let mut pick = Pick {
                name: "steps",
                value: None,
            };
            event.record(&mut pick);
            if let Some(steps) = pick.value {
                self.0.lock().unwrap().push(steps);
            }
        }
    }

    #[test]
    fn each_message_span_logs_its_steps_in_order_when_it_closes() {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry()
            .with(StepTimings)
            .with(lines.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = info_span!("message", message_id = tracing::field::Empty);
            span.in_scope(|| {
                info!("pulled");
                tracing::Span::current().record("message_id", "m-1");
                tracing::debug!("not a step");
                info!("saved");
                let _inner = info_span!("restart").entered();
                info!("restarted");
            });
            drop(span);
            // Outside any message span: not timed.
            info!("elsewhere");
        });
        let lines = lines.0.lock().unwrap();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let steps: Vec<&str> = lines[0]
            .split(", ")
            .map(|step| step.split(" +").next().unwrap())
            .collect();
        assert_eq!(steps, ["pulled", "saved", "restarted"], "{lines:?}");
        assert!(lines[0].ends_with("ms"));
    }
}
