//! The `strata` command line: parse the arguments (`args.rs`), run the
//! command (one file per command or small family), and map error kinds to
//! exit codes. Commands only parse, call the library and print.

mod args;
mod budget;
mod cat;
mod commit;
mod copy;
mod diff;
mod export;
mod gc;
mod generate;
mod history;
mod init;
mod lineage;
mod log;
mod ls;
mod manifest;
mod materialize;
mod metrics;
mod mount;
mod pins;
mod render;
mod restore;
mod sets;
mod status;
mod tag;
mod verify;

use args::{Cli, Cmd};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use strata::error::{ErrorKind, Result};
use strata::failpoint::FailPoints;
use strata::storage::StoreArgs;
use strata::store::Store;

/// Exit codes (docs/CLI in README): 0 ok, 1 verify found problems,
/// 2 invalid input, 3 corrupt data, 4 conflict/busy, 5 unavailable, 70 internal.
fn exit_code(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::InvalidInput => 2,
        ErrorKind::Corrupt => 3,
        ErrorKind::Conflict => 4,
        ErrorKind::Unavailable => 5,
        ErrorKind::Internal => 70,
    }
}

pub(crate) fn run() -> i32 {
    let cli = Cli::parse();
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {}", strata::cli_chain(&e));
            exit_code(e.kind())
        }
    };
    print_request_counts();
    code
}

/// The stores opened by this command, kept when `STRATA_REQUEST_STATS` is
/// set so their request counts can be printed at exit (for the benchmarks).
static OPENED: std::sync::Mutex<Vec<Arc<dyn strata::storage::Storage>>> =
    std::sync::Mutex::new(Vec::new());

/// Keep `storage` for [`print_request_counts`] when `STRATA_REQUEST_STATS` is set.
pub(crate) fn count_requests(storage: &Arc<dyn strata::storage::Storage>) {
    if std::env::var_os("STRATA_REQUEST_STATS").is_some() {
        let mut opened = OPENED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        opened.push(storage.clone());
    }
}

fn print_request_counts() {
    let opened = OPENED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for s in opened.iter() {
        if let Some(counts) = s.request_counts() {
            let line: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
            eprintln!("strata: requests: {} ({})", line.join(" "), s.describe());
        }
    }
}

fn failpoints() -> Result<FailPoints> {
    match std::env::var("STRATA_FAILPOINTS") {
        Ok(spec) => FailPoints::parse(&spec),
        Err(_) => Ok(FailPoints::none()),
    }
}

/// The local directory of the store (the store itself, or a remote store's
/// cache directory): control sockets and logs live under it.
fn store_path(cli_store: &StoreArgs) -> Result<PathBuf> {
    Ok(cli_store.location()?.local_dir().to_path_buf())
}

fn open(cli_store: &StoreArgs) -> Result<Store> {
    let storage = cli_store.location()?.open()?;
    count_requests(&storage);
    Ok(Store::open(storage)?.with_failpoints(failpoints()?))
}

fn dispatch(cli: Cli) -> Result<i32> {
    let s = &cli.store;
    match cli.cmd {
        Cmd::Init => init::init(s),
        Cmd::Commit(a) => commit::commit(&open(s)?, a),
        Cmd::Log(a) => log::log(&open(s)?, a),
        Cmd::Ls(a) => ls::ls(&open(s)?, a),
        Cmd::Cat(a) => cat::cat(&open(s)?, a),
        Cmd::Diff(a) => diff::diff(&open(s)?, a),
        Cmd::Restore(a) => restore::restore(&open(s)?, a),
        Cmd::Export(a) => export::export(&open(s)?, a),
        Cmd::Copy(a) => copy::copy(&open(s)?, s, a),
        Cmd::History(a) => history::history(&open(s)?, a),
        Cmd::Verify(a) => verify::verify(&open(s)?, a),
        Cmd::Lineage(a) => lineage::lineage(&open(s)?, a),
        Cmd::Manifest(a) => manifest::manifest(&open(s)?, a),
        Cmd::Sets(a) => sets::sets(&open(s)?, a),
        Cmd::Pins(a) => pins::pins(&open(s)?, a),
        Cmd::Tag(a) => tag::tag(&open(s)?, a),
        Cmd::Untag(a) => tag::untag(&open(s)?, a),
        Cmd::Tags(a) => tag::tags(&open(s)?, a),
        Cmd::Materialize(a) => materialize::materialize(&open(s)?, &store_path(s)?, a),
        Cmd::Tasks(a) => materialize::tasks(&open(s)?, a),
        Cmd::Retain(a) => gc::retain(&open(s)?, a),
        Cmd::Sweep(a) => gc::sweep(&open(s)?, &store_path(s)?, a),
        Cmd::Leases(a) => gc::leases(&open(s)?, a),
        Cmd::Status(a) => status::status(&open(s)?, &store_path(s)?, a),
        Cmd::Metrics => metrics::metrics(&store_path(s)?),
        Cmd::Budget(a) => budget::budget(&open(s)?, &store_path(s)?, a),
        Cmd::Completions { shell } => generate::completions(shell),
        Cmd::Manpages { dir } => generate::manpages(&dir),
        Cmd::Mount(a) => {
            open(s)?;
            mount::mount_cmd(s, &a)
        }
        Cmd::Unmount(a) => mount::unmount(&a.mountpoint, a.lazy),
    }
}
