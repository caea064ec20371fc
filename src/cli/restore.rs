//! `strata restore`: a generation into a directory, with a progress bar on
//! a terminal and a summary (or `--json`).

use super::args::RestoreArgs;
use super::render::{self, print_json};
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use strata::compose::GenView;
use strata::error::Result;
use strata::restore::{Progress, RestoreOptions, RestoreSummary};
use strata::store::Store;

pub(crate) fn restore(store: &Store, a: RestoreArgs) -> Result<i32> {
    let view = open_view(store, &a.set, a.gen, a.tag.as_deref(), "restore")?;
    let paths = normalized(&a.path)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let whole = paths.is_empty();
    let opts = RestoreOptions {
        paths,
        overwrite: a.overwrite,
        jobs: a.jobs.map_or(cores * 4, usize::from),
    };
    let total = view.top().manifest.counts.bytes;
    let progress = Arc::new(Progress::default());
    let bar = (!a.json && std::io::stderr().is_terminal())
        .then(|| spawn_progress(progress.clone(), whole.then_some(total)));
    let result = strata::restore::restore(store, &a.set, &view, &a.dest, &opts, &progress);
    if let Some((stop, handle)) = bar {
        stop.store(true, Relaxed);
        let _ = handle.join();
    }
    let summary = result?;
    if a.json {
        return print_json(&summary);
    }
    print_summary(&summary);
    Ok(0)
}

/// The generation `gen` or tagged `tag` (latest when neither), pinned.
pub(crate) fn open_view(
    store: &Store,
    set: &str,
    gen: Option<u64>,
    tag: Option<&str>,
    holder: &str,
) -> Result<GenView> {
    let generation = match tag {
        Some(t) => Some(strata::tag::load(store, set, t)?.generation),
        None => gen,
    };
    GenView::open(store, set, generation, holder)
}

/// `--path` arguments as stored paths.
pub(crate) fn normalized(paths: &[std::ffi::OsString]) -> Result<Vec<Vec<u8>>> {
    paths
        .iter()
        .map(|p| strata::row::normalize(p.as_bytes()))
        .collect()
}

type ProgressHandle = (Arc<AtomicBool>, std::thread::JoinHandle<()>);

fn spawn_progress(p: Arc<Progress>, total: Option<u64>) -> ProgressHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let handle = std::thread::spawn(move || {
        let bar = match total {
            Some(t) => indicatif::ProgressBar::new(t),
            None => indicatif::ProgressBar::new_spinner(),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {msg} ({eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        while !s.load(Relaxed) {
            bar.set_position(p.bytes.load(Relaxed));
            bar.set_message(format!("{} files", p.files.load(Relaxed)));
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bar.finish_and_clear();
    });
    (stop, handle)
}

fn print_summary(s: &RestoreSummary) {
    let secs = s.duration_ms as f64 / 1000.0;
    println!(
        "set {}: generation {} restored into {} in {secs:.2} s{}",
        s.set,
        s.generation,
        s.destination,
        if s.resumed { " (resumed)" } else { "" }
    );
    println!(
        "  {} file(s) written ({}), {} already identical; {} dir(s), {} symlink(s), {} hard link(s), {} special",
        s.files_written,
        render::bytes(s.bytes_written),
        s.files_skipped,
        s.dirs,
        s.symlinks,
        s.hard_links,
        s.special
    );
    if !s.owners {
        println!("  owners not set: only root may (files belong to the running user)");
    }
    for d in &s.devices_skipped {
        eprintln!("strata: warning: {d}: device node not made: only root may");
    }
}
