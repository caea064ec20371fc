//! Directory read-ahead: after a listing's reply is sent, the row groups
//! that follow where it stopped are decoded (`GenView::warm_after`), so a
//! walk in key order (`find`, `ls -R`: the next directory's rows follow this
//! one's) finds its next listings decoded while it was busy with this one.
//!
//! The decoding runs on a thread of its own, not on the FUSE worker that
//! sent the reply: that worker goes straight back to the walk's next
//! requests (the `readdir` that ends the listing, the next `opendir`). A
//! request that wants a group being decoded here waits for that decode
//! rather than repeat it; the thread runs at the workers' priority, so such
//! a wait is never behind a starved thread. Measured on a cold `find` of 1M
//! entries (docs/BENCHMARKS.md, wide tree): 0.41–0.43 s with this thread,
//! 0.58–0.59 s with the decode on the replying worker, 0.49–0.55 s with
//! this thread at nice 19 and requests decoding for themselves. Work is
//! dropped when the queue is full: it is only a hint.

use crate::gen::Gen;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use strata::compose::RowPos;
use tracing::warn;

/// Read-aheads waiting at most; past it new ones are dropped.
const QUEUE: usize = 16;

/// The sending side of the read-ahead thread.
pub(crate) struct ReadAhead {
    tx: SyncSender<(Arc<Gen>, RowPos)>,
}

impl ReadAhead {
    /// Start the read-ahead thread; it ends when this is dropped.
    pub(crate) fn start() -> ReadAhead {
        let (tx, rx) = sync_channel(QUEUE);
        let spawned = std::thread::Builder::new()
            .name("read-ahead".into())
            .spawn(move || run(rx));
        if let Err(e) = spawned {
            warn!("no directory read-ahead (cannot start its thread): {e}");
        }
        ReadAhead { tx }
    }

    /// Decode the row groups after `pos` of `gen`, if the thread keeps up.
    pub(crate) fn after(&self, gen: Arc<Gen>, pos: RowPos) {
        let _ = self.tx.try_send((gen, pos));
    }
}

fn run(rx: Receiver<(Arc<Gen>, RowPos)>) {
    for (gen, pos) in rx {
        let warmed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gen.view.warm_after(pos);
        }));
        if warmed.is_err() {
            warn!(
                "directory read-ahead panicked (set={} gen={}); the listing is read when asked",
                gen.set, gen.generation
            );
        }
    }
}
