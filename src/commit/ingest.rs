//! Ingest: turns walk events into durable blobs and journal records.
//!
//! Files are read and hashed (BLAKE3) on a worker pool; a file that changes
//! while read (fstat before/after differs) is retried, then reported. Small
//! content goes into pack files (one zstd frame per blob when that saves
//! space), large content into content-defined chunks (`large`), stored by the
//! worker that reads the file. A single sink thread owns
//! the journal and the open pack, so journal records of packed blobs are
//! written only once their pack is sealed and in its final name.

use super::walk::{stat_row, HashJob};
use super::Progress;
use crate::error::{IoContext, Result};
use crate::format::journal::JournalWriter;
use crate::format::pack::STANDALONE_MIN;
use crate::pack_writer::{Placed, RollingPacks};
use crate::row::{BlobLoc, Codec, Kind, Row};
use crate::staging::Staging;
use crate::store::Store;
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Attempts to read a file that keeps changing underneath.
const READ_ATTEMPTS: usize = 3;
/// zstd level for packed blobs.
const ZSTD_LEVEL: i32 = 3;

/// Content lookup of the parent generation for deduplication.
pub(crate) type DedupIndex = HashMap<[u8; 32], BlobLoc>;

pub(crate) enum SinkMsg {
    Journal(Row),
    Packed {
        row: Row,
        codec: Codec,
        frame: Vec<u8>,
    },
    Problem(String),
    /// A failure on the store's side (the disk budget, a staging write):
    /// it fails the commit; it is not a path to skip.
    Failed(crate::error::Error),
}

/// Where hash workers store large files, their staging directory, and the
/// budget they admit against.
#[derive(Clone, Copy)]
pub(crate) struct StageDir<'a> {
    pub store: &'a Store,
    pub dir: &'a Path,
    pub admission: &'a crate::budget::Admission,
}

/// What the sink hands back when the walk is done.
pub(crate) struct SinkOutput {
    pub journal: JournalWriter,
    pub problems: Vec<String>,
}

struct Sink {
    admission: Arc<crate::budget::Admission>,
    journal: JournalWriter,
    /// The open pack; its rows are journaled once it is sealed.
    packs: RollingPacks<Row>,
    stored: HashMap<[u8; 32], BlobLoc>,
    problems: Vec<String>,
    progress: Arc<Progress>,
}

impl Sink {
    fn handle(&mut self, msg: SinkMsg) -> Result<()> {
        match msg {
            SinkMsg::Journal(row) => self.journal.append(&row),
            SinkMsg::Packed { row, codec, frame } => self.packed(row, codec, frame),
            SinkMsg::Problem(p) => {
                self.problems.push(p);
                Ok(())
            }
            SinkMsg::Failed(e) => Err(e),
        }
    }

    fn packed(&mut self, mut row: Row, codec: Codec, frame: Vec<u8>) -> Result<()> {
        let digest = row.digest.expect("hashed row");
        if let Some(loc) = self.stored.get(&digest) {
            row.blob = *loc;
            return self.journal.append(&row);
        }
        self.admission.admit("commit", frame.len() as u64)?;
        let size = row.size;
        let placed = self.packs.append(row, digest, codec, size, &frame)?;
        self.progress
            .stored_bytes
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        self.journal_placed(placed)
    }

    /// Journal the rows of a sealed pack, now in its final name.
    fn journal_placed(&mut self, placed: Placed<Row>) -> Result<()> {
        for (mut row, loc) in placed {
            row.blob = loc;
            self.stored.insert(row.digest.expect("hashed row"), loc);
            self.journal.append(&row)?;
        }
        Ok(())
    }

    /// Seal the open pack and journal its rows.
    fn seal_pack(&mut self) -> Result<()> {
        let placed = self.packs.seal()?;
        self.journal_placed(placed)
    }
}

/// Start the sink thread; it runs until every sender is dropped.
pub(crate) fn spawn_sink(
    store: &Store,
    staging: &Staging,
    journal: JournalWriter,
    progress: Arc<Progress>,
) -> Result<(Sender<SinkMsg>, std::thread::JoinHandle<Result<SinkOutput>>)> {
    let (tx, rx) = bounded::<SinkMsg>(64);
    let mut sink = Sink {
        admission: staging.admission.clone(),
        journal,
        packs: RollingPacks::new(store, &staging.dir)?,
        stored: HashMap::new(),
        problems: Vec::new(),
        progress,
    };
    let handle = std::thread::Builder::new()
        .name("strata-sink".into())
        .spawn(move || {
            run_sink(&mut sink, rx).map(|()| SinkOutput {
                journal: sink.journal,
                problems: sink.problems,
            })
        });
    let handle = handle.map_err(|e| crate::error::Error::io("spawn", "sink thread", e))?;
    Ok((tx, handle))
}

fn run_sink(sink: &mut Sink, rx: Receiver<SinkMsg>) -> Result<()> {
    let mut first_err = None;
    for msg in rx {
        if first_err.is_none() {
            if let Err(e) = sink.handle(msg) {
                first_err = Some(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => sink.seal_pack(),
    }
}

/// Read, hash and stage one file; retried while it changes underneath.
pub(crate) fn hash_job(
    job: HashJob,
    staging: StageDir<'_>,
    dedup: &DedupIndex,
    progress: &Progress,
) -> SinkMsg {
    let HashJob {
        row,
        abs,
        root,
        prev,
    } = job;
    let path = row.path();
    let mut last = None;
    for _ in 0..READ_ATTEMPTS {
        let file = root.open_file(&path).ctx("open", &abs);
        match file.and_then(|f| {
            read_file(
                row.clone(),
                f,
                &abs,
                staging,
                dedup,
                prev.as_ref(),
                progress,
            )
        }) {
            Ok(Some(msg)) => return msg,
            Ok(None) => last = Some("changed while being read".to_string()),
            Err(e) if store_side(&e, staging.dir) => return SinkMsg::Failed(e),
            Err(e) => {
                return SinkMsg::Problem(format!(
                    "{}: cannot read: {}",
                    crate::row::show(&path),
                    crate::cli_chain(&e)
                ))
            }
        }
    }
    SinkMsg::Problem(format!(
        "{}: {} ({READ_ATTEMPTS} attempts)",
        crate::row::show(&path),
        last.unwrap_or_default()
    ))
}

/// Whether a hashing failure is the store's (the budget refused, or writing
/// the staged copy failed) rather than the source file's.
fn store_side(e: &crate::error::Error, staging: &Path) -> bool {
    match e {
        crate::error::Error::NoSpace { .. } => true,
        crate::error::Error::Io { path, .. } => Path::new(path).starts_with(staging),
        _ => false,
    }
}

/// `Ok(None)` when the file changed between fstat before and after reading.
fn read_file(
    walk: Row,
    file: File,
    abs: &Path,
    staging: StageDir<'_>,
    dedup: &DedupIndex,
    prev: Option<&Row>,
    progress: &Progress,
) -> Result<Option<SinkMsg>> {
    let before = file.metadata().ctx("fstat", abs)?;
    if !before.is_file() {
        return Ok(None);
    }
    let mut row = stat_row(walk.parent, walk.name, &before, Kind::File);
    row.first_gen = walk.first_gen;
    row.changed_gen = walk.changed_gen;
    let attrs = crate::xattr::read_fd(&file).ctx("read extended attributes", abs)?;
    super::walk::with_xattrs(&mut row, attrs)?;
    let read = if row.size >= STANDALONE_MIN {
        chunked(&file, abs, &mut row, staging, prev, progress)?
    } else {
        read_small(&file, abs, &mut row, dedup, prev)?
    };
    let Some(msg) = read else { return Ok(None) };
    let after = stat_row(
        Vec::new(),
        Vec::new(),
        &file.metadata().ctx("fstat", abs)?,
        Kind::File,
    );
    let same = (after.size, after.mtime_ns, after.ctime_ns, after.ino)
        == (row.size, row.mtime_ns, row.ctime_ns, row.ino);
    if !same {
        return Ok(None);
    }
    progress.hashed_files.fetch_add(1, Ordering::Relaxed);
    progress.hashed_bytes.fetch_add(row.size, Ordering::Relaxed);
    Ok(Some(msg))
}

/// Store a large file as chunks (`large`); its row names the chunk list.
fn chunked(
    file: &File,
    abs: &Path,
    row: &mut Row,
    staging: StageDir<'_>,
    prev: Option<&Row>,
    progress: &Progress,
) -> Result<Option<SinkMsg>> {
    let Some(stored) = super::large::store_file(file, abs, row.size, prev, staging)? else {
        return Ok(None);
    };
    row.digest = Some(stored.digest);
    row.blob = BlobLoc::Chunked {
        list: stored.list,
        data: stored.data,
    };
    progress
        .stored_bytes
        .fetch_add(stored.new_bytes, Ordering::Relaxed);
    Ok(Some(SinkMsg::Journal(row.clone())))
}

fn read_small(
    file: &File,
    abs: &Path,
    row: &mut Row,
    dedup: &DedupIndex,
    prev: Option<&Row>,
) -> Result<Option<SinkMsg>> {
    let mut data = Vec::with_capacity(row.size as usize);
    file.take(row.size + 1)
        .read_to_end(&mut data)
        .ctx("read", abs)?;
    if data.len() as u64 != row.size {
        return Ok(None);
    }
    let digest = *blake3::hash(&data).as_bytes();
    row.digest = Some(digest);
    if data.is_empty() {
        row.blob = BlobLoc::None;
        return Ok(Some(SinkMsg::Journal(row.clone())));
    }
    let known = prev
        .filter(|p| p.digest == Some(digest) && p.blob != BlobLoc::None)
        .map(|p| p.blob)
        .or_else(|| dedup.get(&digest).copied());
    if let Some(loc) = known {
        row.blob = loc;
        return Ok(Some(SinkMsg::Journal(row.clone())));
    }
    let (codec, frame) = compress(data);
    Ok(Some(SinkMsg::Packed {
        row: row.clone(),
        codec,
        frame,
    }))
}

/// zstd frame if it is smaller than the raw bytes, else raw.
fn compress(data: Vec<u8>) -> (Codec, Vec<u8>) {
    if data.len() >= 64 {
        if let Ok(z) = zstd::bulk::compress(&data, ZSTD_LEVEL) {
            if z.len() < data.len() {
                return (Codec::Zstd, z);
            }
        }
    }
    (Codec::Raw, data)
}
