//! `strata commit`: commit a directory as the next generation of a set,
//! with a progress line on a terminal and a summary (or `--json`).

use super::args::CommitArgs;
use super::render::{self, print_json};
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use strata::commit::{CommitOptions, CommitSummary, Progress, Scope};
use strata::error::{Error, Result};
use strata::spill::SortBudget;
use strata::store::Store;

pub(crate) fn commit(store: &Store, a: CommitArgs) -> Result<i32> {
    let mut opts = CommitOptions::new(&a.set, &a.dir);
    opts.scope = scope(&a)?;
    opts.message = a.message.clone();
    opts.force_base = a.base;
    opts.wait = a.wait;
    opts.skip_unreadable = a.skip_unreadable;
    opts.resume = !a.no_resume;
    opts.listed = a.paths_from.is_some();
    opts.budget = sort_budget(a.sort_memory, a.sort_fan_in);
    let progress = Arc::new(Progress::default());
    let bar =
        (!a.json && std::io::stderr().is_terminal()).then(|| spawn_progress(progress.clone()));
    let result = strata::commit::commit(store, &opts, progress);
    if let Some((stop, handle)) = bar {
        stop.store(true, Relaxed);
        let _ = handle.join();
    }
    let summary = result?;
    if a.json {
        return print_json(&summary);
    }
    print_commit(&summary);
    Ok(0)
}

/// The paths of `--paths-from`: NUL-separated if the file holds a NUL,
/// else one per line; empty entries are skipped.
fn read_paths_file(path: &PathBuf) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("read", path, e))?;
    let sep = if bytes.contains(&0) { 0 } else { b'\n' };
    Ok(bytes
        .split(|&b| b == sep)
        .filter(|l| !l.is_empty())
        .map(|l| l.to_vec())
        .collect())
}

fn scope(a: &CommitArgs) -> Result<Scope> {
    if a.prefix.is_empty() && a.paths_from.is_none() {
        return Ok(Scope::Whole);
    }
    let mut paths: Vec<Vec<u8>> = a.prefix.iter().map(|p| p.as_bytes().to_vec()).collect();
    if let Some(f) = &a.paths_from {
        paths.extend(read_paths_file(f)?);
    }
    if paths.is_empty() {
        return Err(Error::Invalid("--paths-from lists no path".into()));
    }
    Scope::from_paths(&paths)
}

/// The sort budget of the `--sort-memory` and `--sort-fan-in` flags of
/// `commit` and `sweep` (the library refuses one it cannot use).
pub(crate) fn sort_budget(memory: Option<u64>, fan_in: Option<usize>) -> SortBudget {
    let d = SortBudget::default();
    SortBudget {
        memory_bytes: memory.map_or(d.memory_bytes, |m| usize::try_from(m).unwrap_or(usize::MAX)),
        fan_in: fan_in.unwrap_or(d.fan_in),
    }
}

type ProgressHandle = (Arc<AtomicBool>, std::thread::JoinHandle<()>);

fn spawn_progress(p: Arc<Progress>) -> ProgressHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let handle = std::thread::spawn(move || {
        let bar = indicatif::ProgressBar::new_spinner();
        while !s.load(Relaxed) {
            bar.set_message(format!(
                "walked {} entries, hashed {} files ({})",
                p.walked.load(Relaxed),
                p.hashed_files.load(Relaxed),
                render::bytes(p.hashed_bytes.load(Relaxed))
            ));
            bar.tick();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bar.finish_and_clear();
    });
    (stop, handle)
}

fn print_commit(s: &CommitSummary) {
    let secs = s.duration_ms as f64 / 1000.0;
    match s.generation {
        Some(g) => println!(
            "set {}: generation {g} committed as {} in {secs:.2} s",
            s.set,
            s.representation.as_deref().unwrap_or("?")
        ),
        None => println!(
            "set {}: no changes since generation {}; nothing published ({secs:.2} s)",
            s.set,
            s.parent.map_or("-".into(), |p| p.to_string())
        ),
    }
    if let Some(token) = &s.resumed_from {
        println!(
            "  resumed the interrupted commit {token}: {} file(s) taken from its journal unread",
            s.resumed_files
        );
    }
    if let Some(why) = &s.not_resumed {
        println!("  started fresh, not resumed: {why}");
    }
    let c = &s.changes;
    println!(
        "  added {}, changed {}, removed {}, unchanged {}",
        c.added, c.changed, c.removed, c.unchanged
    );
    println!(
        "  walked {} entries, hashed {} files ({}), stored {} new",
        s.walked,
        s.hashed_files,
        render::bytes(s.hashed_bytes),
        render::bytes(s.new_bytes)
    );
    if s.repaired_objects > 0 {
        eprintln!(
            "strata: warning: replaced {} stored object(s) that failed their check (see `strata verify`)",
            s.repaired_objects
        );
    }
    for w in &s.warnings {
        eprintln!("strata: warning: {w}");
    }
    for p in &s.skipped_unreadable {
        eprintln!("strata: warning: skipped unreadable: {p}");
    }
}
