//! The pipeline benchmark's entry point: the benchmark is the crate's
//! `bench` module (`cargo bench -p mandrill --features bench --bench
//! pipeline -- --help` for its options).

/// The same allocator as the `mandrill` binary, counted when a run asks
/// (`--allocations`, `--budget`).
#[global_allocator]
static ALLOCATOR: mandrill::CountingAllocator<mimalloc::MiMalloc> =
    mandrill::CountingAllocator(mimalloc::MiMalloc);

fn main() {
    mandrill::bench_main();
}
