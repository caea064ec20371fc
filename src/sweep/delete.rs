//! Deletion: condemned objects past their grace, in batches bounded by
//! count and time, each under the DELETING lease, only with no live writer
//! and after an incremental re-mark (invariant 4).

use super::condemned::Condemned;
use super::mark::Marks;
use super::report::SweepReport;
use super::{root_unreadable, SweepOptions};
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::storage::{fence, TryLease};
use crate::store::{keys, Store};
use std::time::{Duration, Instant};

/// Objects deleted per batch, at most.
pub(super) const BATCH_COUNT: usize = 512;
/// Time one batch may spend deleting (writers wait at most this plus a re-mark).
pub(super) const BATCH_TIME: Duration = Duration::from_millis(50);
/// Pause between batches so waiting writers get in.
const BATCH_PAUSE: Duration = Duration::from_millis(5);

/// Step 5: delete in batches, each under the DELETING lease, with no live
/// writer, after an incremental re-mark.
pub(super) fn delete(
    store: &Store,
    opts: &SweepOptions,
    sweeper: &dyn crate::storage::Lease,
    marks: &mut Marks,
    deletable: &[Condemned],
    report: &mut SweepReport,
) -> Result<()> {
    let mut next = 0;
    while next < deletable.len() {
        let _deleting = match store
            .storage()
            .lease(keys::DELETING_LEASE, &opts.holder, true)?
        {
            TryLease::Acquired(l) => l,
            TryLease::Busy { holder } => {
                return Err(Error::internal(format!(
                    "waited for the deleting lease but did not get it: holder=`{holder}`"
                )))
            }
        };
        store.failpoints().hit(Step::Deleting)?;
        if let Some(holder) = crate::sweep::residue::live_writer(store)? {
            report.deferred = Some(format!(
                "{} object(s) left for a later sweep: a writer is live ({holder})",
                deletable.len() - next
            ));
            return Ok(());
        }
        marks
            .roots(store)
            .map_err(|e| root_unreadable(e, "re-mark before deleting"))?;
        let fence = fence::enter(&[sweeper, &*_deleting])?;
        next = delete_batch(store, marks, deletable, next, report)?;
        drop(fence);
        drop(_deleting);
        store.failpoints().hit(Step::BatchDeleted)?;
        std::thread::sleep(BATCH_PAUSE);
    }
    Ok(())
}

/// Delete from `deletable[next..]` up to the batch bounds; returns the next index.
fn delete_batch(
    store: &Store,
    marks: &Marks,
    deletable: &[Condemned],
    mut next: usize,
    report: &mut SweepReport,
) -> Result<usize> {
    let start = Instant::now();
    let mut n = 0;
    while next < deletable.len() && n < BATCH_COUNT && start.elapsed() < BATCH_TIME {
        let c = &deletable[next];
        next += 1;
        if marks.contains(c.kind, &c.digest) {
            continue;
        }
        store.storage().delete(&c.key())?;
        report.deleted.add(c.size);
        n += 1;
    }
    Ok(next)
}
