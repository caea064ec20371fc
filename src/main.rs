//! The `strata` command line: parses arguments, renders results for people
//! (tables) or scripts (`--json`), and maps error kinds to exit codes.

mod cli;

fn main() {
    // Like other Unix tools, end quietly when a reader of our output (`| head`)
    // goes away, instead of failing to print.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    std::process::exit(cli::run());
}
