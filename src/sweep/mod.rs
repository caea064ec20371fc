//! Sweep: two-phase garbage collection that runs while mounts, commits and
//! materializations go on, and never deletes what a reader or writer can
//! still reach (invariants 4 and 5).
//!
//! One sweep, under the `sweep/SWEEPER.lease` (one sweeper at a time):
//! 1. **retire** — apply each set's retention policy (RETIRED index records);
//! 2. **residue** — probe pins and staging owners; reclaim the unheld ones
//!    and journals whose owner is gone; remove compacted task records older
//!    than [`crate::task::DONE_KEEP`];
//! 3. **mark** — from the index (every non-retired representation of every
//!    generation, COMMITTED or PREPARED, with the base manifests they bind),
//!    then held pins (read *after* the index: a pin taken later re-reads the
//!    index and fails on anything retired), then live tasks' sources and
//!    outputs; manifests name their segments, packs and standalone blobs.
//!    Any unreadable root aborts the sweep: nothing is deleted. The one
//!    exception is a task record that does not parse: it holds back only
//!    what it could protect, and the report says so (`roots.held_back`);
//! 4. **condemn** — every listed manifest, segment, pack and blob not marked
//!    is recorded in `sweep/epochs/<epoch>.condemned`, carrying the epoch and
//!    time it was first condemned;
//! 5. **delete** — objects condemned since an *earlier* epoch, at least the
//!    grace period ago, and still unmarked, are deleted in batches bounded by
//!    count and time. Each batch holds `sweep/DELETING.lease`, first checks
//!    that no writer (a held staging owner) is live — otherwise deletion is
//!    deferred to a later sweep — and re-marks incrementally (index records,
//!    pins and tasks that appeared since the mark). Writers take their owner
//!    lease and then wait while `DELETING` is held, so a writer either is
//!    seen by the batch or starts after it: nothing a writer deduplicated
//!    against, created or published can be deleted under it.
//!
//! A sweep that would only repeat the newest epoch's report and condemned
//! list writes nothing (`SweepReport::unchanged`).
//!
//! Readers are never blocked: the mark only reads, condemning writes one
//! list, and a batch is a few hundred unlinks of objects nobody can reach.

mod condemned;
mod delete;
mod mark;
mod report;
pub mod residue;

pub use report::{last_report, Roots, Space, SparsePack, SweepReport, Tally};

use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::storage::TryLease;
use crate::store::{keys, Store};
use condemned::{epochs, finish, load_condemned, unreachable, write_condemned, FirstCondemned};
use delete::delete;
use mark::Marks;
use report::{staging_space, REPORT_TAG, REPORT_VERSION};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Least grace on a remote store, in lease ttls (see `effective_grace`).
pub const REMOTE_GRACE_TTLS: u32 = 3;
/// Default grace: an object is deleted only after it stayed condemned this long.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone)]
pub struct SweepOptions {
    pub grace: Duration,
    pub dry_run: bool,
    /// Who sweeps (for lease holders and retirement records).
    pub holder: String,
    /// Recompute pack live ratios from every reachable row even when the
    /// previous report's apply (`liveness_key`).
    pub recount: bool,
}

/// Take the sweeper lease or report who holds it.
fn take_sweeper(store: &Store, holder: &str) -> Result<Box<dyn crate::storage::Lease>> {
    match store.storage().lease(keys::SWEEPER_LEASE, holder, false)? {
        TryLease::Acquired(l) => Ok(l),
        TryLease::Busy { holder } => Err(Error::Conflict(format!(
            "another sweep is running: holder=`{holder}`"
        ))),
    }
}

/// On a store whose leases expire by observation, the grace is at least
/// [`REMOTE_GRACE_TTLS`] lease ttls: one for a dead holder to be recognised,
/// one for a publication (fenced within a ttl), one as a margin for
/// clock-rate skew between hosts.
fn effective_grace(store: &Store, asked: Duration, report: &mut SweepReport) -> Duration {
    let Some(ttl) = store.storage().lease_ttl() else {
        return asked;
    };
    let floor = ttl * REMOTE_GRACE_TTLS;
    if asked >= floor {
        return asked;
    }
    report.warnings.push(format!(
        "grace raised from {asked:?} to {floor:?} ({REMOTE_GRACE_TTLS} lease ttls on a remote store)"
    ));
    report.grace_ms = floor.as_millis() as u64;
    floor
}

/// Run one sweep (see the module docs for the steps).
pub fn sweep(store: &Store, opts: &SweepOptions) -> Result<SweepReport> {
    let started = Instant::now();
    let now = crate::token::now_ns();
    let sweeper = take_sweeper(store, &opts.holder)?;
    let mut report = SweepReport {
        tag: REPORT_TAG.into(),
        version: REPORT_VERSION,
        dry_run: opts.dry_run,
        grace_ms: opts.grace.as_millis() as u64,
        started_ns: now,
        ..SweepReport::default()
    };
    let mut marks = Marks::default();
    retire(store, opts, &mut report, &mut marks)?;
    residue(store, opts, &mut report)?;
    let mark_start = Instant::now();
    marks.roots(store).map_err(|e| root_unreadable(e, "mark"))?;
    let previous = last_report(store).unwrap_or(None);
    let liveness = marks
        .pack_liveness(store, previous.as_ref().filter(|_| !opts.recount))
        .map_err(|e| root_unreadable(e, "pack live ratios"))?;
    let mut space = marks.space();
    space.packs_live_bytes = liveness.live;
    space.packs_dead_bytes = liveness.dead;
    report.sparse_packs = liveness.sparse;
    report.liveness_key = liveness.key;
    report.mark_ms = mark_start.elapsed().as_millis() as u64;
    report.marked = marks.objects.len() as u64;
    report.mark_rows = liveness.rows;
    report.roots = marks.roots.clone();
    let known = epochs(store)?;
    let epoch = match known.last() {
        None => 1,
        Some(e) => e.checked_add(1).ok_or_else(|| {
            Error::corrupt(
                "sweep epoch",
                keys::EPOCH_DIR,
                "the newest epoch cannot be followed",
            )
        })?,
    };
    report.epoch = epoch;
    let prev = previous_condemned(store, known.last().copied(), &mut report);
    let listing = unreachable(store, &marks, &prev, epoch, now)?;
    let condemned = listing.condemned;
    report.objects = listing.listed;
    space.reachable = listing.reachable;
    let grace = effective_grace(store, opts.grace, &mut report);
    let grace_ns = grace.as_nanos().min(i64::MAX as u128) as i64;
    let mut deletable = Vec::new();
    for c in &condemned {
        report.condemned.add(c.size);
        if c.first_epoch == epoch {
            report.newly_condemned.add(c.size);
        } else if now.saturating_sub(c.first_ns) >= grace_ns {
            report.deletable.add(c.size);
            deletable.push(c.clone());
        }
    }
    report.space = space;
    report.space.condemned = report.condemned;
    report.space.staging = staging_space(store)?;
    if let Some(p) = previous.filter(|p| known.last() == Some(&p.epoch)) {
        report.unchanged = unchanged(&report, &p, prev.len(), condemned.len());
        report.epoch = if report.unchanged { p.epoch } else { epoch };
    }
    if opts.dry_run || report.unchanged {
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }
    write_condemned(store, epoch, &condemned, now)?;
    store.failpoints().hit(Step::Condemned)?;
    delete(store, opts, &*sweeper, &mut marks, &deletable, &mut report)?;
    report.space.condemned.count -= report.deleted.count;
    report.space.condemned.bytes -= report.deleted.bytes;
    report.duration_ms = started.elapsed().as_millis() as u64;
    finish(store, epoch, &known, &report)?;
    Ok(report)
}

/// Whether a sweep would only write again what the newest epoch's report
/// `p` and condemned list (`prev_len` objects) already say. Quiet sweeps
/// then write nothing: on a daemon sweeping an idle store every few
/// seconds, two fsynced files per sweep widened the mount's cat p99 by a
/// third (docs/BENCHMARKS.md, "Sweep"). Every condemned object was found in
/// the list (none is new), so equal counts mean equal sets, and each keeps
/// the epoch and time it was first condemned.
fn unchanged(r: &SweepReport, p: &SweepReport, prev_len: usize, condemned: usize) -> bool {
    r.retired.is_empty()
        && r.reclaimed.is_empty()
        && r.invalid.is_empty()
        && r.task_records_removed == 0
        && r.warnings.is_empty()
        && r.newly_condemned.count == 0
        && r.deletable.count == 0
        && prev_len == condemned
        && p.invalid.is_empty()
        && p.deferred.is_none()
        && r.liveness_key == p.liveness_key
        && r.objects == p.objects
        && r.marked == p.marked
        && r.roots == p.roots
        && r.space == p.space
}

/// The previous epoch's condemned list; an unreadable one only restarts the
/// grace of every object (they all count as newly condemned), so it is
/// reported and the sweep goes on.
fn previous_condemned(
    store: &Store,
    epoch: Option<u64>,
    report: &mut SweepReport,
) -> FirstCondemned {
    let Some(e) = epoch else {
        return HashMap::new();
    };
    load_condemned(store, e).unwrap_or_else(|err| {
        report.warnings.push(format!(
            "previous condemned list unreadable, grace restarts: {}",
            crate::cli_chain(&err)
        ));
        HashMap::new()
    })
}

pub(super) fn root_unreadable(e: Error, during: &'static str) -> Error {
    Error::RootUnreadable {
        during,
        source: Box::new(e),
    }
}

/// Step 1: retention. A dry run only plans (and marks as if retired).
fn retire(
    store: &Store,
    opts: &SweepOptions,
    report: &mut SweepReport,
    marks: &mut Marks,
) -> Result<()> {
    for set in store.sets()? {
        // A set whose policy or tags cannot be read retires nothing this
        // time (what it keeps stays marked); the other sets go on.
        if let Err(e) = retire_set(store, opts, report, marks, &set) {
            report.warnings.push(format!(
                "retention of set `{set}` skipped: {}",
                crate::cli_chain(&e)
            ));
        }
    }
    if !opts.dry_run {
        store.failpoints().hit(Step::Retired)?;
    }
    Ok(())
}

fn retire_set(
    store: &Store,
    opts: &SweepOptions,
    report: &mut SweepReport,
    marks: &mut Marks,
    set: &str,
) -> Result<()> {
    let plan = crate::retain::plan(store, set, crate::token::now_ns())?;
    if opts.dry_run {
        for &g in &plan.retire {
            marks.skip.insert((set.to_string(), g));
            report.retired.push((set.to_string(), g));
        }
        return Ok(());
    }
    for g in crate::retain::apply(store, &plan, &opts.holder)? {
        report.retired.push((set.to_string(), g));
    }
    Ok(())
}

/// Step 2: probe and reclaim residue.
fn residue(store: &Store, opts: &SweepOptions, report: &mut SweepReport) -> Result<()> {
    let items = crate::sweep::residue::scan(store)?;
    report.invalid = items
        .iter()
        .filter(|i| i.verdict == crate::sweep::residue::Verdict::Invalid)
        .cloned()
        .collect();
    report.reclaimed = match opts.dry_run {
        true => items
            .into_iter()
            .filter(|i| i.action == crate::sweep::residue::RECLAIM)
            .collect(),
        false => crate::sweep::residue::reclaim(store, &items)?,
    };
    if !opts.dry_run {
        let tasks = crate::task::Tasks::new(store);
        report.task_records_removed =
            tasks.remove_expired(crate::task::DONE_KEEP, crate::token::now_ns())?;
        store.failpoints().hit(Step::ResidueReclaimed)?;
    }
    Ok(())
}
