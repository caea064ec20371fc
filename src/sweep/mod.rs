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
//! Memory is bounded by [`SweepOptions::budget`], not by the store
//! (invariant 6; `scratch.rs` divides it): the marks, the previous
//! condemned list, the frames counted for pack live ratios and the
//! re-marks' late marks are sorted records (`crate::spill`) that spill to
//! the sweep's scratch directory; condemning is a merge of the store's
//! listing, in key order one directory at a time, with them; the new
//! condemned list and the deletable objects stream to scratch. What stays
//! in memory besides grows with the roots (index records read, manifests
//! expanded), not with the objects they reach.
//!
//! Readers are never blocked: the mark only reads, condemning writes one
//! list, and a batch is a few hundred unlinks of objects nobody can reach.

mod condemned;
mod delete;
mod late;
mod mark;
mod ratios;
mod report;
pub mod residue;
mod scratch;

pub use report::{last_report, Roots, Space, SparsePack, SweepReport, Tally};

use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::spill::{SortBudget, Spilled};
use crate::storage::TryLease;
use crate::store::{keys, Store};
use condemned::{condemn, epochs, finish, load_condemned, write_condemned, Clock, Previous};
use delete::{delete, Deletable};
use mark::{Marks, Obj};
use ratios::pack_liveness;
use report::{staging_space, REPORT_TAG, REPORT_VERSION};
use scratch::{Scratch, Shares};
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
    /// Memory the sweep's sorts and memo keep before spilling to its
    /// scratch, and their merge fan-in (`scratch::Shares` divides it).
    pub budget: SortBudget,
    /// Incomplete multipart uploads initiated at least this long ago are
    /// aborted (a remote store's; see [`DEFAULT_UPLOAD_AGE`]).
    pub upload_age: Duration,
}

/// How old an incomplete multipart upload must be before a sweep aborts
/// it: far longer than any live upload of one object takes, so only a
/// writer that died mid-upload leaves one this old.
pub const DEFAULT_UPLOAD_AGE: Duration = Duration::from_secs(24 * 3600);

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

/// Run one sweep (see the module docs for the steps). An unworkable
/// budget is refused before anything is read.
pub fn sweep(store: &Store, opts: &SweepOptions) -> Result<SweepReport> {
    opts.budget.check()?;
    let started = Instant::now();
    let now = crate::token::now_ns();
    let sweeper = take_sweeper(store, &opts.holder)?;
    let scratch = Scratch::create(store)?;
    let shares = Shares::of(opts.budget);
    let mut report = SweepReport {
        tag: REPORT_TAG.into(),
        version: REPORT_VERSION,
        dry_run: opts.dry_run,
        grace_ms: opts.grace.as_millis() as u64,
        started_ns: now,
        ..SweepReport::default()
    };
    let mut marks = Marks::new(scratch.dir(), shares.marks, shares.memo_bytes)?;
    retire(store, opts, &mut report, &mut marks)?;
    residue(store, opts, &mut report)?;
    let previous = last_report(store).unwrap_or(None);
    let reuse = previous.as_ref().filter(|_| !opts.recount);
    let marked = mark(store, (&scratch, &shares), reuse, &mut marks, &mut report)?;
    let known = epochs(store)?;
    let epoch = next_epoch(known.last().copied())?;
    report.epoch = epoch;
    let newest = known.last().copied();
    let prev = previous_condemned(store, newest, (&scratch, shares.previous), &mut report);
    let grace = effective_grace(store, opts.grace, &mut report);
    let clock = Clock {
        epoch,
        now,
        grace_ns: grace.as_nanos().min(i64::MAX as u128) as i64,
    };
    let c = condemn(store, &marked, &prev, &clock, scratch.dir())?;
    drop((marked, prev.firsts));
    tally(store, &c, &mut report)?;
    if let Some(p) = previous.filter(|p| known.last() == Some(&p.epoch)) {
        report.unchanged = unchanged(&report, &p, prev.len, c.condemned.count);
        report.epoch = if report.unchanged { p.epoch } else { epoch };
    }
    if opts.dry_run || report.unchanged {
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }
    write_condemned(store, epoch, &c, now, scratch.dir())?;
    store.failpoints().hit(Step::Condemned)?;
    let deletable = Deletable {
        objects: c.deletable_objects,
        count: c.deletable.count,
    };
    let late = (scratch.dir(), shares.late);
    delete(
        store,
        opts,
        &*sweeper,
        &mut marks,
        deletable,
        late,
        &mut report,
    )?;
    report.space.condemned.count -= report.deleted.count;
    report.space.condemned.bytes -= report.deleted.bytes;
    report.duration_ms = started.elapsed().as_millis() as u64;
    finish(store, epoch, &known, &report)?;
    Ok(report)
}

/// Step 3: mark from every root, then the pack live ratios of what was
/// marked (reused from `previous`, the newest report, when it applies).
fn mark(
    store: &Store,
    (scratch, shares): (&Scratch, &Shares),
    previous: Option<&SweepReport>,
    marks: &mut Marks,
    report: &mut SweepReport,
) -> Result<Spilled<Obj>> {
    let start = Instant::now();
    marks.roots(store).map_err(|e| root_unreadable(e, "mark"))?;
    let marked = marks.take(shares.late)?;
    let liveness = pack_liveness(store, &marked, previous, scratch.dir(), shares.frames)
        .map_err(|e| root_unreadable(e, "pack live ratios"))?;
    report.space.packs_live_bytes = liveness.live;
    report.space.packs_dead_bytes = liveness.dead;
    report.sparse_packs = liveness.sparse;
    report.liveness_key = liveness.key;
    report.mark_ms = start.elapsed().as_millis() as u64;
    report.mark_rows = liveness.rows;
    report.roots = marks.roots.clone();
    Ok(marked)
}

/// The epoch after the newest one.
fn next_epoch(newest: Option<u64>) -> Result<u64> {
    let Some(e) = newest else {
        return Ok(1);
    };
    e.checked_add(1).ok_or_else(|| {
        Error::corrupt(
            "sweep epoch",
            keys::EPOCH_DIR,
            "the newest epoch cannot be followed",
        )
    })
}

/// Step 4's figures into the report: what was listed, marked and condemned.
fn tally(store: &Store, c: &condemned::Condemnation, report: &mut SweepReport) -> Result<()> {
    report.objects = c.listed;
    report.marked = c.marked;
    report.space.live_base = c.live_base;
    report.space.live_delta = c.live_delta;
    report.space.reachable = c.reachable.clone();
    report.condemned = c.condemned;
    report.newly_condemned = c.newly;
    report.deletable = c.deletable;
    report.space.condemned = c.condemned;
    report.space.staging = staging_space(store)?;
    Ok(())
}

/// Whether a sweep would only write again what the newest epoch's report
/// `p` and condemned list (`prev_len` objects) already say. Quiet sweeps
/// then write nothing: on a daemon sweeping an idle store every few
/// seconds, two fsynced files per sweep widened the mount's cat p99 by a
/// third (docs/BENCHMARKS.md, "Sweep"). Every condemned object was found in
/// the list (none is new), so equal counts mean equal sets, and each keeps
/// the epoch and time it was first condemned.
fn unchanged(r: &SweepReport, p: &SweepReport, prev_len: u64, condemned: u64) -> bool {
    r.retired.is_empty()
        && r.reclaimed.is_empty()
        && r.uploads_aborted.is_empty()
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

/// The previous epoch's condemned list, sorted in scratch; an unreadable
/// one only restarts the grace of every object (they all count as newly
/// condemned), so it is reported and the sweep goes on.
fn previous_condemned(
    store: &Store,
    epoch: Option<u64>,
    (scratch, budget): (&Scratch, SortBudget),
    report: &mut SweepReport,
) -> Previous {
    let Some(e) = epoch else {
        return Previous::none();
    };
    load_condemned(store, e, scratch.dir(), budget).unwrap_or_else(|err| {
        report.warnings.push(format!(
            "previous condemned list unreadable, grace restarts: {}",
            crate::cli_chain(&err)
        ));
        Previous::none()
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
    // A service that cannot list uploads (or refuses it) does not stop
    // the sweep: it says so, and a bucket lifecycle rule covers them.
    match store
        .storage()
        .abort_stale_uploads(opts.upload_age, opts.dry_run)
    {
        Ok(keys) => report.uploads_aborted = keys,
        Err(e) => report
            .warnings
            .push(format!("incomplete uploads not checked: {e}")),
    }
    if !opts.dry_run {
        let tasks = crate::task::Tasks::new(store);
        report.task_records_removed =
            tasks.remove_expired(crate::task::DONE_KEEP, crate::token::now_ns())?;
        store.failpoints().hit(Step::ResidueReclaimed)?;
    }
    Ok(())
}
