//! `strata status`: per set (latest, generations, base and delta sizes and
//! the delta ratio, pins, open tasks), space by category from the last
//! sweep, and each running daemon (through its control socket) with its
//! cache hit rate; a table, or `--json`.

use super::{print_json, render, JsonArg};
use serde::Serialize;
use std::path::Path;
use strata::compose::load_manifest;
use strata::control;
use strata::error::Result;
use strata::format::manifest::Manifest;
use strata::format::record::State;
use strata::index::GenIndex;
use strata::pin::{PinInfo, PinState};
use strata::store::Store;
use strata::task::TaskRecord;

/// One set as `status` shows it.
#[derive(Serialize)]
struct SetStatus {
    set: String,
    latest: Option<u64>,
    /// Committed (retained) generations.
    generations: u64,
    /// Rows and segment bytes of latest's base, and of its delta if any.
    base_rows: u64,
    base_bytes: u64,
    delta_rows: u64,
    delta_bytes: u64,
    /// Delta rows per base row: what materialization policy looks at.
    delta_ratio: f64,
    held_pins: usize,
    /// Materialization tasks not yet ended (planned, claimed, waiting...).
    open_tasks: usize,
}

fn segment_bytes(m: &Manifest) -> u64 {
    m.segments.iter().map(|s| s.size).sum()
}

fn set_status(
    store: &Store,
    set: &str,
    pins: &[PinInfo],
    tasks: &[TaskRecord],
) -> Result<SetStatus> {
    let all = GenIndex::new(store, set).all()?;
    let committed: Vec<_> = all
        .values()
        .filter(|r| r.state == State::Committed)
        .collect();
    let latest = committed.last().map(|r| r.generation);
    let mut s = SetStatus {
        set: set.to_string(),
        latest,
        generations: committed.len() as u64,
        base_rows: 0,
        base_bytes: 0,
        delta_rows: 0,
        delta_bytes: 0,
        delta_ratio: 0.0,
        held_pins: pins
            .iter()
            .filter(|p| p.set == set && p.state == PinState::Held)
            .count(),
        open_tasks: tasks
            .iter()
            .filter(|t| t.set == set && !t.state.is_final())
            .count(),
    };
    if let Some(rep) = committed.last().and_then(|r| r.read_rep()) {
        let top = load_manifest(store, &rep.manifest)?;
        let base = match &top.base {
            Some(b) => {
                (s.delta_rows, s.delta_bytes) = (top.counts.rows, segment_bytes(&top));
                load_manifest(store, &b.manifest)?
            }
            None => top,
        };
        (s.base_rows, s.base_bytes) = (base.counts.rows, segment_bytes(&base));
        s.delta_ratio = s.delta_rows as f64 / s.base_rows.max(1) as f64;
    }
    Ok(s)
}

pub(crate) fn status(store: &Store, root: &Path, a: JsonArg) -> Result<i32> {
    let mut daemons = Vec::new();
    for socket in control::sockets(root) {
        if let Some(v) = control::ask(&socket, &control::Command::Status)? {
            daemons.push(serde_json::json!({ "socket": socket, "status": v }));
        }
    }
    let pins = strata::pin::list(store)?;
    let tasks = strata::task::Tasks::new(store).list()?;
    let sets = store
        .sets()?
        .iter()
        .map(|s| set_status(store, s, &pins, &tasks))
        .collect::<Result<Vec<_>>>()?;
    let held = pins.iter().filter(|p| p.state == PinState::Held).count();
    let sweep = strata::sweep::last_report(store).unwrap_or_else(|e| {
        eprintln!(
            "strata: warning: last sweep report unreadable: {}",
            strata::cli_chain(&e)
        );
        None
    });
    if a.json {
        let last = sweep.as_ref().map(|r| {
            serde_json::json!({ "epoch": r.epoch,
            "at_ns": r.started_ns, "deleted": r.deleted, "deferred": r.deferred })
        });
        let space = sweep.as_ref().map(|r| &r.space);
        return print_json(
            &serde_json::json!({ "store": root, "sets": sets, "pins": { "held": held, "total": pins.len() },
                "space": space, "last_sweep": last, "daemons": daemons }),
        );
    }
    println!(
        "store {}: {} set(s), {held} held pin(s) of {}",
        root.display(),
        sets.len(),
        pins.len()
    );
    print_sets(&sets);
    match &sweep {
        Some(r) => print_space(r),
        None => println!("space: unknown until the first sweep (`strata sweep --dry-run`)"),
    }
    if daemons.is_empty() {
        println!("no mount daemon is serving this store");
    }
    for d in &daemons {
        print_daemon(d);
    }
    Ok(0)
}

fn print_sets(sets: &[SetStatus]) {
    let rows: Vec<Vec<String>> = sets
        .iter()
        .map(|s| {
            vec![
                s.set.clone(),
                s.latest.map_or("-".into(), |g| g.to_string()),
                s.generations.to_string(),
                rows_and_bytes(s.base_rows, s.base_bytes),
                rows_and_bytes(s.delta_rows, s.delta_bytes),
                format!("{:.3}", s.delta_ratio),
                s.held_pins.to_string(),
                s.open_tasks.to_string(),
            ]
        })
        .collect();
    let headers = [
        "SET", "LATEST", "GENS", "BASE", "DELTA", "RATIO", "PINS", "TASKS",
    ];
    println!("{}", render::table(&headers, &rows));
}

fn rows_and_bytes(rows: u64, bytes: u64) -> String {
    let plural = if rows == 1 { "" } else { "s" };
    format!("{rows} row{plural}, {}", render::bytes(bytes))
}

fn print_space(r: &strata::sweep::SweepReport) {
    let t =
        |t: strata::sweep::Tally| format!("{} in {} object(s)", render::bytes(t.bytes), t.count);
    let s = &r.space;
    println!(
        "space at sweep epoch {} ({} UTC):",
        r.epoch,
        render::time(r.started_ns)
    );
    println!("  live base   {}", t(s.live_base));
    println!("  live delta  {}", t(s.live_delta));
    println!(
        "  packs       {} live, {} dead",
        render::bytes(s.packs_live_bytes),
        render::bytes(s.packs_dead_bytes)
    );
    println!("  condemned   {}", t(s.condemned));
    println!("  staging     {}", t(s.staging));
}

fn print_daemon(d: &serde_json::Value) {
    let s = &d["status"];
    println!(
        "daemon pid {} at {}: up {} s, {} pinned generation(s), {} inode(s), {} open handle(s), RSS {}\n  control socket {}",
        s["pid"],
        s["mountpoint"].as_str().unwrap_or("?"),
        s["uptime_s"],
        s["pinned_generations"],
        s["inodes"],
        s["open_handles"],
        render::bytes(s["rss_bytes"].as_u64().unwrap_or(0)),
        d["socket"].as_str().unwrap_or("?"),
    );
    let remote = &s["remote_requests"];
    if let (Some(hits), Some(fills)) = (
        remote["cache_hits"].as_u64(),
        remote["cache_fills"].as_u64(),
    ) {
        let rate = hits as f64 / (hits + fills).max(1) as f64 * 100.0;
        println!(
            "  cache: {rate:.1}% hits ({hits} hits, {fills} fills), {} held",
            render::bytes(remote["cache_bytes"].as_u64().unwrap_or(0))
        );
    }
}
