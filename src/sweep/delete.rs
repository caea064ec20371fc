//! Deletion: condemned objects past their grace, in key order, in batches
//! bounded by count and time, each under the DELETING lease, only with no
//! live writer and after an incremental re-mark (invariant 4), whose marks
//! are kept as late marks (`late.rs`) within the sweep's budget.

use super::late::LateMarks;
use super::mark::{Marks, Obj};
use super::report::SweepReport;
use super::{root_unreadable, SweepOptions};
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::spill::{SortBudget, Sorted, Spilled};
use crate::storage::{fence, TryLease};
use crate::store::{keys, Store};
use std::iter::Peekable;
use std::path::Path;
use std::time::{Duration, Instant};

/// Objects deleted per batch, at most.
pub(super) const BATCH_COUNT: usize = 512;
/// Time one batch may spend deleting (writers wait at most this plus a re-mark).
pub(super) const BATCH_TIME: Duration = Duration::from_millis(50);
/// Pause between batches so waiting writers get in.
const BATCH_PAUSE: Duration = Duration::from_millis(5);

/// The deletable objects, sorted, and how many there are.
pub(super) struct Deletable {
    pub(super) objects: Spilled<Obj>,
    pub(super) count: u64,
}

/// Step 5: delete in batches, each under the DELETING lease, with no live
/// writer, after an incremental re-mark; late marks sort in `dir` under
/// `budget`.
pub(super) fn delete(
    store: &Store,
    opts: &SweepOptions,
    sweeper: &dyn crate::storage::Lease,
    marks: &mut Marks,
    deletable: Deletable,
    (dir, budget): (&Path, SortBudget),
    report: &mut SweepReport,
) -> Result<()> {
    let mut queue = deletable.objects.into_sorted()?.peekable();
    let mut late = LateMarks::new(dir, budget);
    let mut taken = 0;
    while queue.peek().is_some() {
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
                deletable.count - taken
            ));
            return Ok(());
        }
        marks
            .roots(store)
            .map_err(|e| root_unreadable(e, "re-mark before deleting"))?;
        late.add(marks.take(budget)?)?;
        let fence = fence::enter(&[sweeper, &*_deleting])?;
        taken += delete_batch(store, &mut late, &mut queue, report)?;
        drop(fence);
        drop(_deleting);
        store.failpoints().hit(Step::BatchDeleted)?;
        std::thread::sleep(BATCH_PAUSE);
    }
    Ok(())
}

/// Delete from the queue up to the batch bounds; returns how many objects
/// it took from the queue.
fn delete_batch(
    store: &Store,
    late: &mut LateMarks,
    queue: &mut Peekable<Sorted<'static, Obj>>,
    report: &mut SweepReport,
) -> Result<u64> {
    let start = Instant::now();
    let (mut n, mut taken) = (0, 0);
    while n < BATCH_COUNT && start.elapsed() < BATCH_TIME {
        let Some(o) = queue.next().transpose()? else {
            break;
        };
        taken += 1;
        if late.contains(o.kind, &o.digest)? {
            continue;
        }
        store
            .storage()
            .delete(&o.kind.key(&hex::encode(o.digest)))?;
        report.deleted.add(o.size);
        n += 1;
    }
    Ok(taken)
}
