//! `strata retain`, `strata sweep` and `strata leases`: retention policy,
//! garbage collection and the residue report.

use super::args::{JsonArg, RetainArgs, SweepArgs};
use super::render::{self, print_json};
use std::io::{BufRead, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::time::Duration;
use strata::control;
use strata::control::sweep_helper::{SweepAnswer, SweepJob};
use strata::error::{Error, Result};
use strata::retain::Policy;
use strata::sweep::residue::LeaseInfo;
use strata::sweep::{SweepOptions, SweepReport};
use strata::Store;

/// `strata retain`: store the set's policy (unless `--dry-run`) and retire
/// what it does not keep.
pub(crate) fn retain(store: &Store, a: RetainArgs) -> Result<i32> {
    strata::store::check_set_name(&a.set)?;
    let changes = a.keep_last.is_some() || a.keep_within.is_some() || a.keep_all;
    let policy = Policy {
        keep_last: a.keep_last,
        keep_within_s: a.keep_within.map(|d| d.as_secs()),
    };
    if changes && !a.dry_run {
        strata::retain::set_policy(store, &a.set, policy)?;
    }
    let now = strata::token::now_ns();
    let plan = match changes {
        true => strata::retain::plan_with(store, &a.set, Some(policy), now)?,
        false => strata::retain::plan(store, &a.set, now)?,
    };
    let retired = match a.dry_run {
        true => Vec::new(),
        false => strata::retain::apply(store, &plan, "retain")?,
    };
    if a.json {
        return print_json(&serde_json::json!({ "plan": plan, "retired": retired }));
    }
    print_plan(&plan, &retired, a.dry_run);
    Ok(0)
}

fn print_plan(plan: &strata::retain::Plan, retired: &[u64], dry_run: bool) {
    let policy = match plan.policy {
        Some(p) if p.keep_last.is_some() || p.keep_within_s.is_some() => format!(
            "keep latest, tagged{}{}",
            p.keep_last
                .map_or(String::new(), |n| format!(", the last {n}")),
            p.keep_within_s
                .map_or(String::new(), |s| format!(", those within {s} s"))
        ),
        _ => "keep everything (no policy)".to_string(),
    };
    println!("set {}: {policy}", plan.set);
    let kept: Vec<String> = plan.keep.keys().map(u64::to_string).collect();
    println!("  kept: {}", list_or_none(&kept));
    let verb = if dry_run { "would retire" } else { "retired" };
    let gone: Vec<String> = match dry_run {
        true => plan.retire.iter().map(u64::to_string).collect(),
        false => retired.iter().map(u64::to_string).collect(),
    };
    println!("  {verb}: {}", list_or_none(&gone));
}

fn list_or_none(items: &[String]) -> String {
    match items.is_empty() {
        true => "none".into(),
        false => items.join(" "),
    }
}

pub(crate) fn sweep(store: &Store, root: &Path, a: SweepArgs) -> Result<i32> {
    if a.serve {
        return serve(store);
    }
    let grace = a.grace.unwrap_or(strata::sweep::DEFAULT_GRACE);
    let report = run_sweep(store, root, grace, &a)?;
    if a.json {
        return print_json(&report);
    }
    print_report(&report);
    Ok(0)
}

fn run_sweep(store: &Store, root: &Path, grace: Duration, a: &SweepArgs) -> Result<SweepReport> {
    let budgeted = a.sort_memory.is_some() || a.sort_fan_in.is_some() || a.upload_age.is_some();
    if !a.in_process && !budgeted {
        let request = control::Command::Sweep {
            grace_ms: Some(u64::try_from(grace.as_millis()).unwrap_or(u64::MAX)),
            dry_run: a.dry_run,
            recount: a.recount,
        };
        for socket in control::sockets(root) {
            if let Some(report) = control::ask_as(&socket, &request, None)? {
                return Ok(report);
            }
        }
    }
    let opts = SweepOptions {
        grace,
        dry_run: a.dry_run,
        holder: format!("strata sweep pid={}", std::process::id()),
        recount: a.recount,
        budget: super::commit::sort_budget(a.sort_memory, a.sort_fan_in),
        upload_age: a.upload_age.unwrap_or(strata::sweep::DEFAULT_UPLOAD_AGE),
    };
    if a.background {
        strata::os::background_process();
    }
    strata::os::yield_cpu();
    strata::sweep::sweep(store, &opts)
}

/// Serve the mount daemon's sweeps, one per request line, each on the
/// store as a fresh process opens it, so that one process does the work
/// a process per sweep did without starting one every time (a process
/// start per sweep, back to back, cost the mount's cat p99 more than the
/// sweeps themselves: docs/BENCHMARKS.md, "Sweep"). Ends when stdin closes,
/// as it does when the daemon goes.
fn serve(store: &Store) -> Result<i32> {
    strata::os::background_process();
    strata::os::yield_cpu();
    let holder = format!("strata sweep --serve pid={}", std::process::id());
    let stdin = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("read sweep requests", "stdin", e))?;
    let mut input = std::io::BufReader::new(std::fs::File::from(stdin));
    let mut out = std::io::stdout().lock();
    loop {
        if !request_within(&input, IDLE_BEFORE_TRIM) {
            give_back_memory();
        }
        let mut line = String::new();
        if input
            .read_line(&mut line)
            .map_err(|e| Error::io("read a sweep request", "stdin", e))?
            == 0
        {
            return Ok(0);
        }
        let answer = match SweepJob::parse(&line) {
            Ok(job) => serve_one(store, &holder, job),
            Err(e) => SweepAnswer::Failed(format!("unreadable sweep request: {e}")),
        };
        writeln!(out, "{}", answer.to_line())
            .and_then(|()| out.flush())
            .map_err(|e| Error::io("answer a sweep request", "stdout", e))?;
    }
}

/// How long the helper waits for another request before it returns the
/// memory its last sweep freed: a full sweep of a 1M-row store leaves
/// about 23 MiB with the allocator, which a daemon sweeping hourly should
/// not hold in between; sweeps back to back keep it.
const IDLE_BEFORE_TRIM: Duration = Duration::from_secs(1);

/// Whether a request is buffered or arrives (or stdin closes) within `wait`.
fn request_within(input: &std::io::BufReader<std::fs::File>, wait: Duration) -> bool {
    if !input.buffer().is_empty() {
        return true;
    }
    let mut fd = libc::pollfd {
        fd: input.get_ref().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, alive for the call.
    unsafe { libc::poll(&mut fd, 1, wait.as_millis() as libc::c_int) != 0 }
}

/// Return the heap's free pages to the system (glibc keeps them).
fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn serve_one(store: &Store, holder: &str, job: SweepJob) -> SweepAnswer {
    let opts = SweepOptions {
        grace: job.grace(),
        dry_run: job.dry_run,
        holder: holder.to_string(),
        recount: job.recount,
        budget: strata::spill::SortBudget::default(),
        upload_age: strata::sweep::DEFAULT_UPLOAD_AGE,
    };
    match strata::sweep::sweep(&store.reopened(), &opts) {
        Ok(report) => SweepAnswer::Report(Box::new(report)),
        Err(e) => SweepAnswer::Failed(strata::cli_chain(&e)),
    }
}

fn tally(t: strata::sweep::Tally) -> String {
    format!("{} object(s), {}", t.count, render::bytes(t.bytes))
}

fn print_report(r: &SweepReport) {
    let what = if r.dry_run { "sweep plan" } else { "sweep" };
    println!(
        "{what} epoch {}: {} object(s) listed, {} reachable (mark {} ms, total {} ms)",
        r.epoch, r.objects, r.marked, r.mark_ms, r.duration_ms
    );
    if r.unchanged {
        println!("  nothing changed since epoch {}: nothing written", r.epoch);
    }
    println!(
        "  roots: {} generation(s), {} representation(s), {} pin(s), {} task(s)",
        r.roots.generations, r.roots.representations, r.roots.pins, r.roots.tasks
    );
    let retired: Vec<String> = r.retired.iter().map(|(s, g)| format!("{s}@{g}")).collect();
    let verb = if r.dry_run { "would retire" } else { "retired" };
    println!("  {verb}: {}", list_or_none(&retired));
    println!("  live base: {}", tally(r.space.live_base));
    println!("  live delta: {}", tally(r.space.live_delta));
    println!(
        "  packs: {} live, {} dead; {} pack(s) under {:.0}% live",
        render::bytes(r.space.packs_live_bytes),
        render::bytes(r.space.packs_dead_bytes),
        r.sparse_packs.len(),
        strata::liveness::REPACK_BELOW * 100.0
    );
    println!(
        "  condemned: {} (new: {})",
        tally(r.condemned),
        tally(r.newly_condemned)
    );
    let del = if r.dry_run {
        "deletable now"
    } else {
        "deleted"
    };
    let done = if r.dry_run { r.deletable } else { r.deleted };
    println!(
        "  {del}: {} (grace {} s)",
        tally(done),
        r.grace_ms as f64 / 1000.0
    );
    if let Some(why) = &r.deferred {
        println!("  deferred: {why}");
    }
    let reclaim = if r.dry_run {
        "would reclaim"
    } else {
        "reclaimed"
    };
    for i in &r.reclaimed {
        println!("  {reclaim} {} {} ({})", i.kind, i.key, i.detail);
    }
    let abort = if r.dry_run { "would abort" } else { "aborted" };
    for key in &r.uploads_aborted {
        println!("  {abort} the incomplete upload of {key}");
    }
    for h in &r.roots.held_back {
        println!("  held back: {h}");
    }
    if r.task_records_removed > 0 {
        println!(
            "  finished task records removed: {}",
            r.task_records_removed
        );
    }
    for i in &r.invalid {
        eprintln!(
            "strata: warning: invalid {} kept for an operator: {} ({})",
            i.kind, i.key, i.detail
        );
    }
}

pub(crate) fn leases(store: &Store, a: JsonArg) -> Result<i32> {
    let items = strata::sweep::residue::scan_all(store)?;
    if a.json {
        return print_json(&items);
    }
    println!(
        "{}",
        render::table(
            &["KIND", "VERDICT", "KEY", "HOLDER", "DETAIL", "ACTION"],
            &rows(&items)
        )
    );
    Ok(0)
}

fn rows(items: &[LeaseInfo]) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|i| {
            let verdict = serde_json::to_value(i.verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            vec![
                i.kind.clone(),
                verdict,
                i.key.clone(),
                i.holder.clone(),
                i.detail.clone(),
                i.action.clone(),
            ]
        })
        .collect()
}
