//! The `quantscope` binary: everything lives in the library, which also chooses the exit code
//! (see `quantscope --help`).

fn main() -> std::process::ExitCode {
    quantscope::cli::main()
}
