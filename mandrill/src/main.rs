//! The `mandrill` binary; everything lives in the library.

/// mimalloc rather than glibc's malloc: under the worker's load (many small
/// allocations freed on another thread) glibc's per-thread arenas contended
/// on their locks and grew memory; measured in the pipeline benchmark.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mandrill::main()
}
