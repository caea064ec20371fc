//! Push-ahead: the next small files (up to [`MAX_SIZE`]) of a directory a
//! caller is reading, put into the kernel's page cache before the caller
//! asks for them.
//!
//! Under `--opens none` the kernel keeps an inode's pages across opens, so
//! a file whose bytes it holds is opened and read with no request at all.
//! Without this, every small file `grep -r` reads costs a READ round trip:
//! the reader sleeps, a worker wakes, answers, and wakes the reader. With
//! eight readers of tiny files on two cores, those wakeups, not the
//! decoding, are where the daemon's time goes (docs/BENCHMARKS.md, issue
//! 26). Here one thread
//! reads and verifies the files that follow the one just read, in the
//! directory's name order (the order of `readdir`, so of `grep -r` and
//! `find | xargs cat`), and hands each to the kernel with
//! `FUSE_NOTIFY_STORE`: one write per file, and no thread waits on it.
//!
//! **When.** A caller (the thread id of the request) that makes its second
//! first-read (offset 0) of a packed file in one directory is pushed the
//! [`FIRST_WINDOW`] files that follow. If it then reads a file past what
//! was pushed, the next window is pushed, twice as large, up to
//! [`MAX_WINDOW`]. A caller the kernel took pushes for in its last
//! directory is pushed at its first read of the next one. A reader that overtakes the pushes tells
//! the pusher where it is, and the pusher skips what it has passed.
//!
//! **Never from a worker.** A push waits for the lock of any page a READ in
//! flight holds, and only a FUSE worker can answer that READ: pushes from
//! workers deadlocked once every worker waited so (BENCHMARKS, "tried").
//! The thread here is the only one that pushes; it holds no lock a request
//! needs while it does, and work beyond its queue is dropped, never waited
//! for.
//!
//! **What is pushed is what a READ answers.** Each blob is read and checked
//! against its row's digest by `strata::blob::read`, as a READ's is; one
//! that fails is not pushed, so its READ still fails with EIO. An entry's
//! inode number names its generation's slot (kept for the daemon's life)
//! and its row position (node.rs), so a number pushed to is that entry's
//! for as long as the daemon runs. Members of a hard-link group are skipped
//! (the group is served under the number of whichever member was looked up
//! first). The kernel refuses a push to an inode it does not hold (an entry
//! listed bare and not looked up yet, stat_habits.rs); that costs the
//! decode, and [`MAX_REFUSED`] refusals in a row end the directory's push.

use crate::fs::Stats;
use crate::gen::Gen;
use fuser::{INodeNo, Notifier};
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use strata::compose::RowPos;
use strata::row::{BlobLoc, Kind, Row};
use strata::store::Store;
use tracing::warn;

/// Files pushed after a directory's first trigger.
const FIRST_WINDOW: u32 = 32;
/// The largest window: files pushed per trigger at most.
const MAX_WINDOW: u32 = 1024;
/// Files pushed for one job before the next job's turn, so that several
/// readers are each kept ahead of.
const BATCH: usize = 8;
/// Entries looked at for one batch at most (a directory of subdirectories
/// or large files has few to push).
const SCAN: usize = 256;
/// The largest file pushed. A push saves a file its READ round trip; a
/// larger file's decoding outweighs that, and the longer the pusher spends
/// on one file the likelier its reader overtakes it and decodes it too. On
/// the mixed tree (files of 29 KB on average) pushing files up to 16 KiB
/// took 8 cold greps at once from 2.06 s to 1.97 s (medians), while up to
/// 64 KiB or 1 MiB cost more daemon CPU and no time (docs/BENCHMARKS.md).
const MAX_SIZE: u64 = 16 << 10;
/// Pushes in a row the kernel refuses before a job gives up: it holds no
/// inode for the entries (they were listed without attributes), so the
/// caller looks each up as it goes, after any push could have helped.
const MAX_REFUSED: u32 = 8;
/// Jobs waiting at most; past it new ones are dropped.
const QUEUE: usize = 64;
/// Callers remembered at most; past it the record starts over.
const CALLERS: usize = 1024;

/// What became of one file's push.
enum Pushed {
    /// The kernel holds the file's bytes.
    Taken,
    /// Not pushed: the blob failed, or the kernel does not hold the inode.
    Refused,
    /// The kernel connection is gone.
    Unmounted,
}

/// What the pusher and the readers of one pushed directory tell each other.
#[derive(Default)]
struct Progress {
    /// The last name a READ of the caller asked for: pushing it, or any
    /// name before it, comes too late.
    reader_at: Mutex<Vec<u8>>,
    /// The last name the pusher has passed.
    pushed_through: Mutex<Vec<u8>>,
    /// The job has ended: its window is pushed, or the directory ended.
    done: AtomicBool,
    /// The directory has no entry after `pushed_through`, or the kernel
    /// refused [`MAX_REFUSED`] pushes in a row: nothing more to push.
    exhausted: AtomicBool,
    /// The kernel took at least one push of this job.
    taken: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One directory being pushed.
struct Job {
    gen: Arc<Gen>,
    /// The inode number of the generation's slot: an entry's number is
    /// this or'ed with its packed row position.
    base: u64,
    dir: Vec<u8>,
    /// Push the entries after this name.
    after: Vec<u8>,
    /// Files still to push in this window.
    left: u32,
    /// Pushes refused in a row.
    refused: u32,
    progress: Arc<Progress>,
}

/// The next entries of a job's directory to push.
struct Batch {
    rows: Vec<(Row, RowPos)>,
    /// The last name looked at.
    last: Vec<u8>,
    /// The directory has no entry after `last`.
    ended: bool,
}

/// What the daemon remembers of one caller's reads.
struct Trail {
    /// Slot base and path of the directory of its last first-read.
    dir: (u64, Vec<u8>),
    /// First-reads in that directory.
    reads: u32,
    /// Files the next push of that directory may push.
    window: u32,
    /// The push of that directory, if one started.
    job: Option<Arc<Progress>>,
    /// The kernel took pushes of the caller's previous directory.
    carried: bool,
}

/// The sending side of the push thread, and the callers' trails.
pub(crate) struct PushAhead {
    tx: SyncSender<Job>,
    trails: Mutex<HashMap<u32, Trail>>,
}

impl PushAhead {
    /// Start the push thread; it ends when this is dropped.
    pub(crate) fn start(
        store: Store,
        notifier: Arc<OnceLock<Notifier>>,
        stats: Arc<Stats>,
    ) -> PushAhead {
        let (tx, rx) = sync_channel(QUEUE);
        let spawned = std::thread::Builder::new()
            .name("push-ahead".into())
            .spawn(move || run(rx, &store, &notifier, &stats));
        if let Err(e) = spawned {
            warn!("no push-ahead (cannot start its thread): {e}");
        }
        PushAhead {
            tx,
            trails: Mutex::new(HashMap::new()),
        }
    }

    /// `caller` asked for the start of `row`, a packed file of `gen` whose
    /// generation slot's inode base is `base`: push what follows it, if
    /// the caller has shown that it reads on.
    pub(crate) fn first_read(&self, caller: u32, gen: &Arc<Gen>, base: u64, row: &Row) {
        let mut trails = lock(&self.trails);
        if trails.len() >= CALLERS && !trails.contains_key(&caller) {
            trails.clear();
        }
        let dir = (base, row.parent.clone());
        let trail = trails
            .entry(caller)
            .or_insert_with(|| Trail::new(dir.clone(), false));
        if !trail.read(dir, &row.name) {
            return;
        }
        let progress = Arc::new(Progress::default());
        *lock(&progress.reader_at) = row.name.clone();
        let job = Job {
            gen: gen.clone(),
            base,
            dir: row.parent.clone(),
            after: row.name.clone(),
            left: trail.window,
            refused: 0,
            progress: progress.clone(),
        };
        if self.tx.try_send(job).is_ok() {
            trail.job = Some(progress);
        }
    }
}

impl Trail {
    fn new(dir: (u64, Vec<u8>), carried: bool) -> Trail {
        Trail {
            dir,
            reads: 0,
            window: FIRST_WINDOW,
            job: None,
            carried,
        }
    }

    /// The caller read the start of file `name` of directory `dir`:
    /// whether a push of what follows it is to start now. A push under way
    /// learns where the reader is instead; after one, the reader reading
    /// past what it pushed doubles the window.
    fn read(&mut self, dir: (u64, Vec<u8>), name: &[u8]) -> bool {
        if self.dir != dir {
            let taken = self
                .job
                .as_ref()
                .is_some_and(|p| p.taken.load(Ordering::Acquire));
            *self = Trail::new(dir, taken);
        }
        self.reads = self.reads.saturating_add(1);
        let Some(p) = &self.job else {
            return self.reads >= 2 || self.carried;
        };
        if !p.done.load(Ordering::Acquire) {
            let mut at = lock(&p.reader_at);
            if name > at.as_slice() {
                *at = name.to_vec();
            }
            return false;
        }
        let passed = name > lock(&p.pushed_through).as_slice();
        if p.exhausted.load(Ordering::Acquire) || !passed {
            return false;
        }
        self.window = (self.window * 2).min(MAX_WINDOW);
        true
    }
}

/// Take turns among the jobs, a batch each, until the daemon drops the
/// sending side.
fn run(rx: Receiver<Job>, store: &Store, notifier: &OnceLock<Notifier>, stats: &Stats) {
    let mut active = VecDeque::new();
    loop {
        if active.is_empty() {
            match rx.recv() {
                Ok(work) => active.push_back(work),
                Err(_) => return,
            }
        }
        active.extend(rx.try_iter());
        let Some(mut work) = active.pop_front() else {
            continue;
        };
        let more = notifier.get().is_some_and(|notifier| {
            catch_unwind(AssertUnwindSafe(|| work.push_batch(store, notifier, stats)))
                .unwrap_or_else(|_| {
                    warn!("push-ahead panicked; the files it was pushing are read when asked");
                    false
                })
        });
        match more {
            true => active.push_back(work),
            false => work.progress.done.store(true, Ordering::Release),
        }
    }
}

/// Whether a READ would answer `row` from one decoded packed blob the
/// push can carry. Link group members are left to their READs (see the
/// module docs).
fn pushable(row: &Row) -> bool {
    row.kind == Kind::File
        && matches!(row.blob, BlobLoc::Packed { .. })
        && (1..=MAX_SIZE).contains(&row.size)
        && row.link_key().is_none()
}

impl Job {
    /// Push the next batch; whether the job goes on.
    fn push_batch(&mut self, store: &Store, notifier: &Notifier, stats: &Stats) -> bool {
        let reader_at = lock(&self.progress.reader_at).clone();
        let start = if reader_at > self.after {
            reader_at
        } else {
            self.after.clone()
        };
        let limit = (self.left as usize).min(BATCH);
        let Some(Batch { rows, last, ended }) = self.next_rows(&start, limit) else {
            return false;
        };
        for (row, pos) in rows {
            if *lock(&self.progress.reader_at) >= row.name {
                continue;
            }
            match self.push(store, notifier, &row, pos) {
                Pushed::Taken => {
                    stats.pushed_files.fetch_add(1, Ordering::Relaxed);
                    self.progress.taken.store(true, Ordering::Release);
                    self.refused = 0;
                }
                Pushed::Refused => self.refused += 1,
                Pushed::Unmounted => return false,
            }
            self.left -= 1;
            if self.refused >= MAX_REFUSED {
                self.progress.exhausted.store(true, Ordering::Release);
                return false;
            }
        }
        *lock(&self.progress.pushed_through) = last.clone();
        self.after = last;
        if ended {
            self.progress.exhausted.store(true, Ordering::Release);
        }
        !ended && self.left > 0
    }

    /// Up to `limit` pushable entries after `start`; `None` if the
    /// directory cannot be read.
    fn next_rows(&self, start: &[u8], limit: usize) -> Option<Batch> {
        let mut rows = Vec::new();
        let mut last = start.to_vec();
        let mut seen = 0;
        let mut ended = true;
        let visited = self.gen.view.visit_dir(&self.dir, Some(start), |row, pos| {
            seen += 1;
            last.clone_from(&row.name);
            if pushable(row) {
                rows.push((row.clone(), pos));
            }
            let full = rows.len() >= limit || seen >= SCAN;
            ended = !full;
            full
        });
        visited.ok().map(|()| Batch { rows, last, ended })
    }

    /// Read, verify and push one file. A file that cannot be read is
    /// refused here: its READ reports it.
    fn push(&self, store: &Store, notifier: &Notifier, row: &Row, pos: RowPos) -> Pushed {
        let Some(packed) = crate::node::pack_pos(pos) else {
            return Pushed::Refused;
        };
        let Ok(bytes) = strata::blob::read(store, row) else {
            return Pushed::Refused;
        };
        match notifier.store(INodeNo(self.base | packed), 0, &bytes) {
            Ok(()) => Pushed::Taken,
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Pushed::Unmounted,
            Err(_) => Pushed::Refused,
        }
    }
}
