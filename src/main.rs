//! The `quantscope` binary: everything lives in the library; this only reports errors.

fn main() -> std::process::ExitCode {
    match quantscope::cli::main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
