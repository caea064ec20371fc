//! Chunked files: verified reads of a large file stored as a chunk list and
//! its chunks (formats: `format::chunk`).
//!
//! The row names its chunk list by digest, the list names each chunk by
//! the digest of its raw bytes, and both are checked as they are read, so
//! any byte range is served verified without reading the rest of the file
//! (invariant 2). Holes are zeros that were never stored. A chunk that
//! fails its check on a remote store's cached copy is dropped and fetched
//! once more ([`Store::read_fresh`]).

use crate::error::{Error, Result};
use crate::format::chunk::{
    decode_chunk, ChunkList, Extent, MAX_CHUNK_LIST_BYTES, MAX_CHUNK_OBJECT,
};
use crate::row::{BlobLoc, Row};
use crate::store::{keys, Store};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};

/// The verified chunk list of a chunked file's row.
pub fn list(store: &Store, row: &Row) -> Result<ChunkList> {
    let BlobLoc::Chunked { list, .. } = row.blob else {
        return Err(Error::Invalid(format!(
            "not a chunked file: path=`{}`",
            crate::row::show(&row.path())
        )));
    };
    list_named(store, &list, row.size)
}

/// The chunk list named `digest` of a file of `size` bytes, verified.
pub fn list_named(store: &Store, digest: &[u8; 32], size: u64) -> Result<ChunkList> {
    let list = list_any(store, digest)?;
    if list.size != size {
        return Err(Error::corrupt(
            "chunk list",
            hex::encode(digest),
            format!("describes {} bytes, the row {size}", list.size),
        ));
    }
    Ok(list)
}

/// The chunk list named `digest`, verified, whatever file it describes.
pub fn list_any(store: &Store, digest: &[u8; 32]) -> Result<ChunkList> {
    let key = keys::chunk_list(&hex::encode(digest));
    store.read_fresh(&key, || {
        let bytes = store.storage().get(&key, MAX_CHUNK_LIST_BYTES)?;
        ChunkList::decode(digest, &bytes)
    })
}

/// The raw bytes of the chunk `digest` (`len` bytes), verified.
pub fn chunk(store: &Store, digest: &[u8; 32], len: u64) -> Result<Vec<u8>> {
    let name = hex::encode(digest);
    let key = keys::chunk(&name);
    store.read_fresh(&key, || {
        let stored = store.storage().get(&key, MAX_CHUNK_OBJECT)?;
        decode_chunk(&name, &stored, digest, len)
    })
}

/// Chunks a reader fetches ahead of the one it reads.
const AHEAD: usize = 2;

/// One chunk being fetched or fetched: `Some(None)` when the fetch failed
/// (the reader that needs it fetches it again, for the error).
#[derive(Default)]
struct Fetch {
    done: Mutex<Option<Option<Arc<Vec<u8>>>>>,
    ready: Condvar,
}

impl Fetch {
    /// Record the outcome (the first one stays) and wake the waiters.
    fn set(&self, outcome: Option<Arc<Vec<u8>>>) {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        if done.is_none() {
            *done = Some(outcome);
        }
        self.ready.notify_all();
    }

    /// The outcome, once there is one.
    fn wait(&self) -> Option<Arc<Vec<u8>>> {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        while done.is_none() {
            done = self
                .ready
                .wait(done)
                .unwrap_or_else(PoisonError::into_inner);
        }
        done.clone().flatten()
    }
}

type Slot = Arc<Fetch>;

/// Chunks fetched or being fetched by any reader of this process, by
/// digest, while some reader's window holds them: concurrent readers of a
/// file (or of files sharing chunks) fetch each chunk once.
fn in_flight() -> &'static Mutex<HashMap<[u8; 32], Weak<Fetch>>> {
    static SHARED: OnceLock<Mutex<HashMap<[u8; 32], Weak<Fetch>>>> = OnceLock::new();
    SHARED.get_or_init(Default::default)
}

/// The shared slot of chunk `digest`, and whether it was just made (the
/// caller must fill it).
fn shared_slot(digest: &[u8; 32]) -> (Slot, bool) {
    let mut map = in_flight().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(slot) = map.get(digest).and_then(Weak::upgrade) {
        return (slot, false);
    }
    if map.len() >= 4096 {
        map.retain(|_, w| w.strong_count() > 0);
    }
    let slot = Slot::default();
    map.insert(*digest, Arc::downgrade(&slot));
    (slot, true)
}

/// Reads byte ranges of one chunked file. It keeps a window of chunks: the
/// one read last (sequential reads come in pieces smaller than a chunk) and
/// the next [`AHEAD`] data chunks, fetched and verified on the rayon pool
/// while the current one is served, so a sequential read uses both cores.
pub struct ChunkedReader {
    list: ChunkList,
    window: Mutex<BTreeMap<usize, Slot>>,
}

impl ChunkedReader {
    pub fn new(list: ChunkList) -> ChunkedReader {
        ChunkedReader {
            list,
            window: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn list(&self) -> &ChunkList {
        &self.list
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the file).
    pub fn read(&self, store: &Store, offset: u64, len: u64) -> Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(self.list.size);
        let mut at = offset.min(end);
        let mut out = Vec::with_capacity((end - at) as usize);
        while at < end {
            let Some(i) = self.list.extent_at(at) else {
                break;
            };
            let start = self.list.offsets[i];
            let extent = self.list.extents[i];
            let stop = (start + extent.span()).min(end);
            match extent {
                Extent::Hole { .. } => out.resize(out.len() + (stop - at) as usize, 0),
                Extent::Data { len, digest } => {
                    let bytes = self.extent(store, i, &digest, len)?;
                    out.extend_from_slice(&bytes[(at - start) as usize..(stop - start) as usize]);
                }
            }
            at = stop;
        }
        Ok(out)
    }

    fn extent(&self, store: &Store, i: usize, digest: &[u8; 32], len: u64) -> Result<Arc<Vec<u8>>> {
        let (slot, fresh) = self.slot(i, digest);
        self.fetch_ahead(store, i);
        if !fresh {
            if let Some(bytes) = slot.wait() {
                return Ok(bytes.clone());
            }
        }
        match chunk(store, digest, len) {
            Ok(bytes) => {
                let bytes = Arc::new(bytes);
                slot.set(Some(bytes.clone()));
                Ok(bytes)
            }
            Err(e) => {
                slot.set(None);
                self.lock().remove(&i);
                Err(e)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Slot>> {
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot of extent `i` (chunk `digest`), and whether it was just
    /// made (nobody fetches it yet); slots outside `i - 1 ..= i + AHEAD`
    /// are dropped.
    fn slot(&self, i: usize, digest: &[u8; 32]) -> (Slot, bool) {
        let mut window = self.lock();
        window.retain(|&j, _| j + 1 >= i && j <= i + AHEAD);
        if let Some(slot) = window.get(&i) {
            return (slot.clone(), false);
        }
        let (slot, fresh) = shared_slot(digest);
        window.insert(i, slot.clone());
        (slot, fresh)
    }

    /// Start fetching the data extents after `i` that are not in the window.
    fn fetch_ahead(&self, store: &Store, i: usize) {
        for j in i + 1..=(i + AHEAD).min(self.list.extents.len().saturating_sub(1)) {
            let Extent::Data { len, digest } = self.list.extents[j] else {
                continue;
            };
            let mut window = self.lock();
            if window.contains_key(&j) {
                continue;
            }
            let (slot, fresh) = shared_slot(&digest);
            window.insert(j, slot.clone());
            drop(window);
            if !fresh {
                continue;
            }
            let store = store.clone();
            rayon::spawn(move || slot.set(chunk(&store, &digest, len).ok().map(Arc::new)));
        }
    }
}

/// Write a chunked file's verified content to `out`, holes as zeros.
pub fn copy_to(store: &Store, row: &Row, out: &mut dyn Write) -> Result<()> {
    let list = list(store, row)?;
    let zeros = vec![0u8; 1 << 20];
    for extent in &list.extents {
        match *extent {
            Extent::Data { len, digest } => {
                let bytes = chunk(store, &digest, len)?;
                out.write_all(&bytes)
                    .map_err(|e| Error::io("write", "output", e))?;
            }
            Extent::Hole { len } => {
                let mut left = len;
                while left > 0 {
                    let n = left.min(zeros.len() as u64) as usize;
                    out.write_all(&zeros[..n])
                        .map_err(|e| Error::io("write", "output", e))?;
                    left -= n as u64;
                }
            }
        }
    }
    Ok(())
}

/// Write a chunked file's verified content into `file` at its offsets,
/// leaving holes unwritten (the file is sized first, so they read as zeros
/// and take no space where the filesystem supports sparse files). One chunk
/// at a time on the caller's thread: the mount assembles copies on a
/// background-priority thread that must not take the cores from readers.
pub fn write_sparse(
    store: &Store,
    list: &ChunkList,
    file: &std::fs::File,
    path: &str,
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    file.set_len(list.size)
        .map_err(|e| Error::io("truncate", path, e))?;
    for (extent, &offset) in list.extents.iter().zip(&list.offsets) {
        if let Extent::Data { len, digest } = *extent {
            let bytes = chunk(store, &digest, len)?;
            file.write_all_at(&bytes, offset)
                .map_err(|e| Error::io("write", path, e))?;
        }
    }
    Ok(())
}
