//! The `mandrill` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    mandrill::cli::main()
}
