//! Allocations counted: the benchmark's global allocator counts calls and
//! bytes while a run switches it on, so that the pipeline's cost per message
//! is a count, the same on every machine, where a timing is not. CI runs a
//! short workload with `--budget` and fails when a path allocates more per
//! message than `mandrill/bench/budget.toml` allows (the way rustc's perf
//! suite counts instructions rather than seconds).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Wraps the real allocator. Switched off (the default), it costs one
/// relaxed load per call: the timed runs are not slowed by counting.
pub struct CountingAllocator<A>(pub A);

static COUNTING: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

fn count(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to the wrapped allocator unchanged; counting
// touches only atomics and never allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    /// A reallocation is counted as an allocation of the new size: it may
    /// move, and growing a buffer in steps is the cost worth seeing.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// What was allocated while counting was on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Allocated {
    pub calls: u64,
    pub bytes: u64,
}

/// Starts counting from zero.
pub(super) fn start() {
    CALLS.store(0, Ordering::Relaxed);
    BYTES.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
}

/// Stops counting and says what was counted since `start`.
pub(super) fn stop() -> Allocated {
    COUNTING.store(false, Ordering::Relaxed);
    Allocated {
        calls: CALLS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

/// The paths a budget names: the run's broker and store, when both are in
/// memory or both on SQLite.
pub(super) fn path_name(broker: &str, db: &str) -> Option<&'static str> {
    match (broker, db) {
        ("memory", "memory") => Some("memory"),
        (broker, db) if broker.starts_with("sqlite") && db.starts_with("sqlite") => Some("sqlite"),
        _ => None,
    }
}

/// One path's budget in `mandrill/bench/budget.toml`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Limit {
    allocations_per_message: f64,
    bytes_allocated_per_message: f64,
}

/// Checks what a path allocated per message against `budget` (the file's
/// text, read from `file`): an error names the path, the figure and its
/// limit.
pub(super) fn check(
    budget: &str,
    file: &std::path::Path,
    path: &str,
    allocations: f64,
    bytes: f64,
) -> Result<(), String> {
    let file = file.display();
    let mut budget: std::collections::BTreeMap<String, Limit> =
        toml::from_str(budget).map_err(|error| format!("{file}: {error}"))?;
    let limit = budget
        .remove(path)
        .ok_or_else(|| format!("{file} has no budget for the {path} path ([{path}])"))?;
    let mut over = Vec::new();
    if allocations > limit.allocations_per_message {
        over.push(format!(
            "{allocations} allocations per message, over its budget of {}",
            limit.allocations_per_message
        ));
    }
    if bytes > limit.bytes_allocated_per_message {
        over.push(format!(
            "{bytes} bytes allocated per message, over its budget of {}",
            limit.bytes_allocated_per_message
        ));
    }
    match over.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "the {path} path allocates more than {file} allows: {} (raise the budget only in a reviewed commit that says why)",
            over.join("; ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: &str =
        "[memory]\nallocations_per_message = 40\nbytes_allocated_per_message = 4000\n";

    #[test]
    fn a_path_within_its_budget_passes_and_one_over_it_is_named_with_both_figures() {
        let file = std::path::Path::new("bench/budget.toml");
        assert_eq!(check(BUDGET, file, "memory", 40.0, 3999.0), Ok(()));
        let error = check(BUDGET, file, "memory", 41.5, 3999.0).unwrap_err();
        assert!(
            error.contains("the memory path")
                && error.contains("41.5 allocations per message, over its budget of 40"),
            "{error}"
        );
        let error = check(BUDGET, file, "sqlite", 1.0, 1.0).unwrap_err();
        assert!(error.contains("no budget for the sqlite path"), "{error}");
    }

    #[test]
    fn only_memory_and_sqlite_runs_have_a_budget() {
        assert_eq!(path_name("memory", "memory"), Some("memory"));
        assert_eq!(path_name("sqlite", "sqlite:/tmp/x.db"), Some("sqlite"));
        assert_eq!(path_name("nats://127.0.0.1:4222", "postgres://x"), None);
    }
}
