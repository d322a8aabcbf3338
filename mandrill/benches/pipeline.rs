//! The pipeline benchmark's entry point: the benchmark is the crate's
//! `bench` module (`cargo bench -p mandrill --features bench --bench
//! pipeline -- --help` for its options).

/// The same allocator as the `mandrill` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    mandrill::bench_main();
}
