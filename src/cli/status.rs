//! `strata status`: per set (latest, generations, base and delta sizes and
//! the delta ratio, pins, open tasks: `strata::status`), space by category
//! from the last sweep with the dedup ratio, and each running daemon (through its control
//! socket) with its cache hit rate; a table, or `--json`.

use super::args::JsonArg;
use super::render::{self, print_json};
use std::path::Path;
use strata::control;
use strata::error::Result;
use strata::status::SetStatus;
use strata::store::Store;

pub(crate) fn status(store: &Store, root: &Path, a: JsonArg) -> Result<i32> {
    let mut daemons = Vec::new();
    for socket in control::sockets(root) {
        if let Some(v) = control::ask(&socket, &control::Command::Status)? {
            daemons.push(serde_json::json!({ "socket": socket, "status": v }));
        }
    }
    let status = strata::status::status(store)?;
    let (sets, held) = (&status.sets, status.held_pins);
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
        let dedup = space.and_then(|s| strata::status::dedup_ratio(sets, s));
        return print_json(
            &serde_json::json!({ "store": root, "sets": sets, "pins": { "held": held, "total": status.pins },
                "space": space, "dedup_ratio": dedup, "last_sweep": last, "daemons": daemons,
                "corrupt_tasks": status.corrupt_tasks,
                "resumable_journals": status.resumable_journals }),
        );
    }
    println!(
        "store {}: {} set(s), {held} held pin(s) of {}",
        root.display(),
        sets.len(),
        status.pins
    );
    print_sets(sets);
    for c in &status.corrupt_tasks {
        println!(
            "corrupt task record: key={} (see `strata tasks --quarantine {}`): {}",
            c.key, c.id, c.error
        );
    }
    for j in &status.resumable_journals {
        println!(
            "resumable commit: set {} generation {} (journal {}), kept {} h more; \
             the next `strata commit --set {}` resumes it, `--no-resume` starts fresh",
            j.set,
            j.generation,
            j.token,
            j.expires_in_s.div_ceil(3600),
            j.set
        );
    }
    match &sweep {
        Some(r) => print_space(r, sets),
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

fn print_space(r: &strata::sweep::SweepReport, sets: &[SetStatus]) {
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
        "  pack frames {} live, {} dead",
        render::bytes(s.packs_live_bytes),
        render::bytes(s.packs_dead_bytes)
    );
    println!("  condemned   {}", t(s.condemned));
    println!("  staging     {}", t(s.staging));
    if !s.reachable.is_empty() {
        println!("  reachable objects by category:");
    }
    for (category, tally) in &s.reachable {
        println!("    {category:<11} {}", t(*tally));
    }
    if let Some(ratio) = strata::status::dedup_ratio(sets, s) {
        let logical: u64 = sets.iter().map(|s| s.logical_bytes).sum();
        println!(
            "  dedup       {ratio:.2}x: {} in every committed generation, {} of content stored",
            render::bytes(logical),
            render::bytes(strata::status::content_bytes(s))
        );
    }
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
