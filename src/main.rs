//! The `strata` command line: parses arguments, renders results for people
//! (tables) or scripts (`--json`), and maps error kinds to exit codes.

mod cli;

fn main() {
    std::process::exit(cli::run());
}
