//! Assembled copies: whole raw copies of chunked files, built from verified
//! chunks in the mount's local directory so the kernel can serve them by
//! passthrough at native speed.
//!
//! Owns `<local dir>/assembled/<blake3 of the content>` (the store's own
//! directory for a local store, the cache directory for a remote one). The
//! first open of a chunked file is served by FUSE reads of its chunks while
//! a background thread assembles the copy: it sizes a temporary file, writes
//! each data extent at its offset (holes stay holes), fsyncs it and renames
//! it into place. Later opens pass it through.
//!
//! Every chunk is verified as it is read, so a copy this process assembled
//! is served as verified; a copy found from an earlier process is hashed in
//! full at its first open, as `--verify` asks of any local copy
//! ([`super::Verifier`]), and one that fails is removed.
//!
//! The total size is bounded by a budget (`--assembled-size`): least
//! recently opened copies are removed past it (recency in memory, seeded
//! from file times at start); a file larger than half the budget is never
//! assembled and stays on FUSE reads. Removing a copy never disturbs a
//! reader that has it open.

use crate::error::{Error, IoContext, Result};
use crate::format::chunk::ChunkList;
use crate::Store;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};

/// Default budget of assembled copies.
pub const DEFAULT_BUDGET: u64 = 8 << 30;
/// Chunked files waiting for assembly, at most (more are left for later opens).
const QUEUE: usize = 16;

#[derive(Default)]
struct State {
    /// Size and last use of each copy present.
    copies: HashMap<[u8; 32], (u64, u64)>,
    total: u64,
    clock: u64,
    /// Copies assembled by this process (served without hashing again).
    made_here: HashSet<[u8; 32]>,
    /// Queued or being assembled.
    pending: HashSet<[u8; 32]>,
}

/// The assembled copies of one mount.
pub struct Assembled {
    dir: PathBuf,
    budget: u64,
    state: Mutex<State>,
    queue: SyncSender<(Store, [u8; 32], ChunkList)>,
}

/// A copy present for a file, and whether this process made it.
pub struct Copy {
    pub file: File,
    pub made_here: bool,
}

impl Assembled {
    /// Open (creating) the copies under `local_dir/assembled` and start the
    /// assembling thread.
    pub fn open(local_dir: &Path, budget: u64) -> Result<Arc<Assembled>> {
        let dir = local_dir.join(crate::store::keys::ASSEMBLED);
        crate::storage::ensure_local_dir(&dir)?;
        let mut state = State::default();
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).ctx("list", &dir)? {
            let entry = entry.ctx("list", &dir)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            match digest_of(&name) {
                Some(d) => found.push((meta.modified().ok(), d, meta.len())),
                // A temporary file of a process that died while assembling.
                None => crate::storage::remove_or_warn(&entry.path(), "stale assembly"),
            }
        }
        found.sort();
        for (_, d, size) in found {
            state.clock += 1;
            state.copies.insert(d, (size, state.clock));
            state.total += size;
        }
        let (queue, jobs) = sync_channel::<(Store, [u8; 32], ChunkList)>(QUEUE);
        let me = Arc::new(Assembled {
            dir,
            budget,
            state: Mutex::new(state),
            queue,
        });
        me.evict(0);
        let worker = Arc::downgrade(&me);
        std::thread::Builder::new()
            .name("strata-assemble".into())
            .spawn(move || {
                // A cache: it must not take the cores or the disk from readers.
                crate::os::yield_cpu();
                for (store, digest, list) in jobs {
                    let Some(me) = worker.upgrade() else { return };
                    me.assemble(&store, digest, &list);
                }
            })
            .map_err(|e| Error::io("spawn", "assembling thread", e))?;
        Ok(me)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, digest: &[u8; 32]) -> PathBuf {
        self.dir.join(hex::encode(digest))
    }

    /// The copy of the file whose content is `digest`, if assembled.
    pub fn open_copy(&self, digest: &[u8; 32]) -> Option<Copy> {
        let mut st = self.lock();
        if !st.copies.contains_key(digest) {
            return None;
        }
        let Ok(file) = File::open(self.path(digest)) else {
            forget(&mut st, digest);
            return None;
        };
        st.clock += 1;
        let now = st.clock;
        if let Some(c) = st.copies.get_mut(digest) {
            c.1 = now;
        }
        Some(Copy {
            file,
            made_here: st.made_here.contains(digest),
        })
    }

    /// Remove a copy that failed its check.
    pub fn drop_copy(&self, digest: &[u8; 32]) {
        forget(&mut self.lock(), digest);
        crate::storage::remove_or_warn(&self.path(digest), "assembled copy that failed its check");
    }

    /// Queue the file `digest` (its verified `list`) for assembly, unless
    /// it is queued, present, too large for the budget, or the queue is full.
    pub fn request(&self, store: &Store, digest: [u8; 32], list: &ChunkList) {
        if list.size > self.budget / 2 {
            return;
        }
        let mut st = self.lock();
        if st.copies.contains_key(&digest) || !st.pending.insert(digest) {
            return;
        }
        drop(st);
        match self.queue.try_send((store.clone(), digest, list.clone())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.lock().pending.remove(&digest);
            }
        }
    }

    fn assemble(&self, store: &Store, digest: [u8; 32], list: &ChunkList) {
        let name = hex::encode(digest);
        let tmp = self.dir.join(format!(".tmp-{name}"));
        self.evict(list.size);
        let made = crate::token::create_private(&tmp).and_then(|file| {
            crate::chunks::write_sparse(store, list, &file, &name)?;
            // Durable before its name: a power cut never leaves a torn copy
            // under a content name (which `--verify off` would serve).
            file.sync_all().ctx("fsync", &tmp)?;
            fs::rename(&tmp, self.path(&digest)).ctx("rename", &tmp)
        });
        let mut st = self.lock();
        st.pending.remove(&digest);
        match made {
            Ok(()) => {
                st.clock += 1;
                let now = st.clock;
                st.copies.insert(digest, (list.size, now));
                st.total += list.size;
                st.made_here.insert(digest);
            }
            Err(e) => {
                drop(st);
                crate::storage::remove_or_warn(&tmp, "failed assembly");
                tracing::warn!(
                    "assembling {name} failed; its reads stay on FUSE: {}",
                    crate::cli_chain(&e)
                );
            }
        }
    }

    /// Remove least recently used copies until `extra` more bytes fit.
    fn evict(&self, extra: u64) {
        let mut st = self.lock();
        while st.total + extra > self.budget {
            let Some(victim) = st.copies.iter().min_by_key(|(_, c)| c.1).map(|(d, _)| *d) else {
                break;
            };
            forget(&mut st, &victim);
            crate::storage::remove_or_warn(&self.path(&victim), "assembled copy past the budget");
        }
    }
}

fn forget(st: &mut State, digest: &[u8; 32]) {
    st.made_here.remove(digest);
    if let Some((size, _)) = st.copies.remove(digest) {
        st.total -= size;
    }
}

fn digest_of(name: &str) -> Option<[u8; 32]> {
    let mut d = [0u8; 32];
    hex::decode_to_slice(name, &mut d).ok().map(|()| d)
}
