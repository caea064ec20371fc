//! The sweep's scratch: a private local directory for its sorted runs and
//! the condemned list it stages, `sweep/scratch/<token>` of the store's
//! scratch space (a remote store's local directory), removed when the
//! sweep ends. It is neither staging nor residue: no owner lease and not
//! under `staging/`, so writers, the residue scan and staging space never
//! see it; a killed sweep's is removed by the next sweep, which holds the
//! sweeper lease.

use crate::error::{IoContext, Result};
use crate::spill::SortBudget;
use crate::store::{keys, Store};
use std::path::{Path, PathBuf};

/// How a sweep divides its memory budget (eighths, at most seven held at
/// once): the mark's sort 4, the chunk-list memo 1, the frames of pack
/// live ratios 2 (while the marks are held), the previous condemned list 1
/// (while condemning), the re-marks' sort 1 and the late marks 1 (while
/// deleting, after the marks are dropped).
pub(super) struct Shares {
    pub(super) marks: SortBudget,
    pub(super) memo_bytes: usize,
    pub(super) frames: SortBudget,
    pub(super) previous: SortBudget,
    pub(super) late: SortBudget,
}

impl Shares {
    pub(super) fn of(budget: SortBudget) -> Shares {
        Shares {
            marks: budget.eighths(4),
            memo_bytes: budget.eighths(1).memory_bytes,
            frames: budget.eighths(2),
            previous: budget.eighths(1),
            late: budget.eighths(1),
        }
    }
}

/// A sweep's scratch directory, removed on drop.
pub(super) struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    /// A fresh directory; earlier sweeps' leftovers are removed.
    pub(super) fn create(store: &Store) -> Result<Scratch> {
        let token = crate::token::new_token();
        let dir = store.storage().scratch_dir(&keys::sweep_scratch(&token))?;
        if let Some(parent) = dir.parent() {
            remove_others(parent, &dir)?;
        }
        Ok(Scratch { dir })
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }
}

fn remove_others(parent: &Path, keep: &Path) -> Result<()> {
    for entry in std::fs::read_dir(parent).ctx("readdir", parent)? {
        let path = entry.ctx("readdir", parent)?.path();
        if path != keep {
            std::fs::remove_dir_all(&path).ctx("remove", &path)?;
        }
    }
    Ok(())
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(
                "sweep scratch not removed; the next sweep removes it: path=`{}` error=`{e}`",
                self.dir.display()
            );
        }
    }
}
