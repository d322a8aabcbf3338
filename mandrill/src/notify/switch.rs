//! `paused` and `resumed`, whoever turns the switch: `mandrill pause` and
//! `resume` (another process), the pause file, another instance's admin API
//! or a host that did not come back there, as well as this instance.
//!
//! The switch lives in the store, so [`watch`] reads it every
//! `safety.poll_interval` and notifies each change it sees, as recorded
//! (`by`, `reason`, and `since` as the event's `at`). Turns made here (the
//! admin API, `pause_on_unrecovered`) are notified at once by their maker
//! through [`Notifier::switch_turned_here`], so that two turns in quick
//! succession are both told; the watch then recognises them and stays
//! silent. [`Turns`] is that bookkeeping, pure: a turn made here is the
//! store's state of the same content stamped inside the window its write
//! took (the store stamps it with this process's clock), so nothing else
//! is mistaken for it.
//!
//! Every instance watches: each notifies every change it sees, so N
//! instances sharing a store send N notifications of a change made outside
//! them, each with the same `at`, `by` and `detail` (a receiver can drop
//! the repeats). Changes closer together than the poll interval may be
//! seen as their last one only.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{Event, EventKind, Notifier};
use crate::domain::Timestamp;
use crate::store::{Store, Switch};

/// Turns remembered on each side: far more than can happen in a poll
/// interval.
const REMEMBERED: usize = 16;

/// How long the last read, at shutdown, may wait for the store.
const LAST_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A turn made here and already notified.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Turned {
    paused: bool,
    by: String,
    reason: String,
    /// The write's window in milliseconds: just before it was asked for,
    /// and once it returned.
    from: i64,
    until: i64,
}

impl Turned {
    fn is(&self, switch: &Switch) -> bool {
        let since = switch.since.map_or(i64::MIN, Timestamp::as_millis);
        self.paused == switch.paused
            && switch.by.as_deref() == Some(self.by.as_str())
            && switch.reason.as_deref() == Some(self.reason.as_str())
            && (self.from..=self.until).contains(&since)
    }
}

/// The turns notified lately, from here and from the watch, so that each
/// is told once.
#[derive(Debug, Default)]
pub(super) struct Turns {
    here: VecDeque<Turned>,
    seen: VecDeque<Switch>,
}

impl Turns {
    /// Whether a turn made here is still to be told: not if the watch saw
    /// (and told) it first.
    fn turned_here(&mut self, turned: Turned) -> bool {
        if let Some(at) = self.seen.iter().position(|switch| turned.is(switch)) {
            self.seen.remove(at);
            return false;
        }
        remember(&mut self.here, turned);
        true
    }

    /// Whether a change the watch saw is still to be told: not if it was a
    /// turn made here.
    fn seen(&mut self, switch: &Switch) -> bool {
        if let Some(at) = self.here.iter().position(|turned| turned.is(switch)) {
            self.here.remove(at);
            return false;
        }
        remember(&mut self.seen, switch.clone());
        true
    }
}

fn remember<T>(list: &mut VecDeque<T>, item: T) {
    if list.len() == REMEMBERED {
        list.pop_front();
    }
    list.push_back(item);
}

impl Event {
    /// The switch as the store recorded its last turn.
    pub(crate) fn switch_recorded(switch: &Switch) -> Self {
        let mut event = Self::switch(
            switch.paused,
            switch.by.as_deref().unwrap_or("someone"),
            switch.reason.as_deref().unwrap_or("no reason given"),
        );
        if let Some(since) = switch.since {
            event.at = since;
        }
        event
    }
}

impl Notifier {
    /// Whether `paused` or `resumed` is wanted: else the switch needs no
    /// watching.
    pub(crate) fn wants_switch(&self) -> bool {
        self.wants(EventKind::Paused) || self.wants(EventKind::Resumed)
    }

    /// Notifies a turn this instance made: `from` just before the store
    /// was asked, `until` once it answered. The watch will not tell it
    /// again.
    pub(crate) fn switch_turned_here(
        &self,
        paused: bool,
        by: &str,
        reason: &str,
        from: Timestamp,
        until: Timestamp,
    ) {
        let turned = Turned {
            paused,
            by: by.to_owned(),
            reason: reason.to_owned(),
            from: from.as_millis(),
            until: until.as_millis(),
        };
        if self.turns().turned_here(turned) {
            self.send(Event::switch(paused, by, reason));
        }
    }

    /// Notifies a change the watch saw, unless it was made here.
    fn switch_seen(&self, switch: &Switch) {
        if self.turns().seen(switch) {
            self.send(Event::switch_recorded(switch));
        }
    }

    fn turns(&self) -> std::sync::MutexGuard<'_, Turns> {
        // Poisoned only by a panic inside `Turns`, which has no panicking
        // code; the bookkeeping is still whole then.
        self.switch_turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Reads the switch every `every` until `stop`, and once more then (a turn
/// made during the drain is told too), notifying each change. A change
/// recorded after `started` is one even at the first read: the pause file,
/// say, that this instance applied at start-up.
pub(crate) async fn watch(
    notifier: Arc<Notifier>,
    store: Arc<dyn Store>,
    every: Duration,
    started: Timestamp,
    stop: CancellationToken,
) {
    let every = every.max(Duration::from_millis(100));
    let mut last: Option<Switch> = None;
    let mut look = |switch: Switch| {
        let changed = match &last {
            None => switch.since.is_some_and(|since| since > started),
            Some(last) => !last.same_turn(&switch),
        };
        if changed {
            notifier.switch_seen(&switch);
        }
        last = Some(switch);
    };
    loop {
        // Bounded as the next read is due: a store that hangs delays the
        // notification, never the loop's stop.
        let read = tokio::select! {
            read = tokio::time::timeout(every.max(LAST_READ_TIMEOUT), store.switch()) => read,
            () = stop.cancelled() => break,
        };
        match read {
            Ok(Ok(switch)) => look(switch),
            Ok(Err(error)) => {
                debug!(error = %error.with_causes(), "could not read the kill switch to notify its changes")
            }
            Err(_) => debug!("the store did not answer for the kill switch"),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => break,
        }
    }
    if let Ok(Ok(switch)) = tokio::time::timeout(LAST_READ_TIMEOUT, store.switch()).await {
        look(switch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(paused: bool, by: &str, reason: &str, since: i64) -> Switch {
        Switch {
            paused,
            by: Some(by.into()),
            reason: Some(reason.into()),
            since: Some(Timestamp::from_millis(since)),
            leash: None,
        }
    }

    fn turned(paused: bool, by: &str, reason: &str, from: i64, until: i64) -> Turned {
        Turned {
            paused,
            by: by.into(),
            reason: reason.into(),
            from,
            until,
        }
    }

    #[test]
    fn each_turn_is_told_once_whether_made_here_or_seen_in_the_store() {
        let mut turns = Turns::default();
        // Made here, then seen: told once, by its maker.
        assert!(turns.turned_here(turned(true, "ana", "game day", 100, 105)));
        assert!(!turns.seen(&switch(true, "ana", "game day", 103)));
        // Seen first (the watch read it before the maker was answered).
        assert!(turns.seen(&switch(false, "ana", "done", 200)));
        assert!(!turns.turned_here(turned(false, "ana", "done", 199, 201)));
        // The same words from elsewhere, stamped outside the window, are
        // someone else's turn: told.
        assert!(turns.turned_here(turned(true, "admin-api", "no reason given", 300, 302)));
        assert!(turns.seen(&switch(true, "admin-api", "no reason given", 400)));
        // Others' turns: told each.
        assert!(turns.seen(&switch(false, "bob", "cli", 500)));
        assert!(turns.seen(&switch(true, "pause-file@h:/p", "exists", 600)));
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let mut turns = Turns::default();
        for i in 0..100 {
            assert!(turns.seen(&switch(i % 2 == 0, "bob", "x", i)));
            assert!(turns.turned_here(turned(i % 2 == 0, "ana", "y", 1000 + i, 1000 + i)));
        }
        assert_eq!(
            (turns.seen.len(), turns.here.len()),
            (REMEMBERED, REMEMBERED)
        );
    }
}
