//! Condemned lists: per epoch, every listed object the mark did not reach,
//! with the epoch and time it was first condemned (invariant 5: deletion
//! only after an earlier epoch condemned it, a grace period ago). Epoch
//! files are created exclusively and never rewritten.
//!
//! Condemning is one merge of sorted streams (invariant 6): the store's
//! listing in (kind, digest) order against the sorted marks and the
//! previous epoch's list (read line by line into a sort under the budget,
//! so an unsorted older list still works). The new list and the deletable
//! objects are written to the sweep's scratch as they are found; nothing
//! of either is held in memory.

use super::mark::{digest, kind_of, Kind, Obj};
use super::report::{SweepReport, Tally};
use crate::error::{Error, IoContext, Result};
use crate::failpoint::Step;
use crate::spill::{read_fixed, Probe, Record, SortBudget, SortedWriter, Sorter, Spilled};
use crate::storage::{ObjectReader, PutOutcome};
use crate::store::{keys, Store};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// 1: initial layout (lines in (kind, digest) order, which every writer
/// has produced; readers do not rely on it).
pub(super) const CONDEMNED_VERSION: u32 = 1;
const CONDEMNED_TAG: &str = "strata-condemned";
/// Condemned lists are read as a stream; this bounds the whole and
/// [`MAX_LINE_BYTES`] each line.
const MAX_CONDEMNED_BYTES: u64 = 1 << 40;
const MAX_LINE_BYTES: u64 = 4096;
/// Epoch files (condemned lists and reports) kept besides the newest.
const KEEP_EPOCHS: u64 = 4;

/// When one object was first condemned: the previous list's entry.
#[derive(Debug, Clone, Copy)]
pub(super) struct First {
    kind: Kind,
    digest: [u8; 32],
    epoch: u64,
    ns: i64,
}

/// Scratch encoding: kind byte, digest, epoch (u64le), time (i64le).
const FIRST_BYTES: usize = 49;

impl Record for First {
    fn key_cmp(&self, other: &Self) -> Ordering {
        (self.kind, &self.digest).cmp(&(other.kind, &other.digest))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind.byte());
        out.extend_from_slice(&self.digest);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.ns.to_le_bytes());
    }

    fn read(input: &mut impl Read, run: &Path) -> Result<Option<First>> {
        let Some(b) = read_fixed::<FIRST_BYTES>(input, run)? else {
            return Ok(None);
        };
        let (mut digest, mut epoch, mut ns) = ([0u8; 32], [0u8; 8], [0u8; 8]);
        digest.copy_from_slice(&b[1..33]);
        epoch.copy_from_slice(&b[33..41]);
        ns.copy_from_slice(&b[41..]);
        Ok(Some(First {
            kind: kind_of(b[0], run)?,
            digest,
            epoch: u64::from_le_bytes(epoch),
            ns: i64::from_le_bytes(ns),
        }))
    }

    fn absorb(&mut self, _later: &First) -> Result<()> {
        Err(Error::corrupt(
            "condemned list",
            "sweep scratch",
            "an object is listed twice",
        ))
    }
}

/// The previous epoch's list, sorted, and how many objects it holds.
pub(super) struct Previous {
    pub(super) firsts: Spilled<First>,
    pub(super) len: u64,
}

impl Previous {
    pub(super) fn none() -> Previous {
        Previous {
            firsts: Spilled::empty(),
            len: 0,
        }
    }
}

#[derive(Serialize, serde::Deserialize)]
struct CondemnedHeader {
    #[serde(rename = "type")]
    tag: String,
    version: u32,
    epoch: u64,
    written_ns: i64,
    count: u64,
}

/// Epochs with a condemned list, ascending.
pub(super) fn epochs(store: &Store) -> Result<Vec<u64>> {
    let mut out: Vec<u64> = store
        .storage()
        .list(keys::EPOCH_DIR)?
        .iter()
        .filter_map(|n| n.strip_suffix(".condemned")?.parse().ok())
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// The condemned list of `epoch`, sorted in `dir` under `budget`.
pub(super) fn load_condemned(
    store: &Store,
    epoch: u64,
    dir: &Path,
    budget: SortBudget,
) -> Result<Previous> {
    let key = keys::epoch(epoch, "condemned");
    let size = store.storage().size(&key)?.unwrap_or(0);
    if size > MAX_CONDEMNED_BYTES {
        return Err(Error::corrupt(
            "condemned list",
            &key,
            "over the size limit",
        ));
    }
    let mut input =
        BufReader::with_capacity(1 << 20, ObjectReader::new(&**store.storage(), &key, size));
    let header = next_line(&mut input, &key)?.unwrap_or_default();
    let h: CondemnedHeader = crate::format::parse_versioned(
        "condemned list",
        &key,
        CONDEMNED_TAG,
        CONDEMNED_VERSION,
        header.as_bytes(),
    )?;
    let mut sorter = Sorter::new(dir, budget)?;
    let mut len = 0;
    while let Some(line) = next_line(&mut input, &key)? {
        sorter.push(parse_line(&line, &key)?)?;
        len += 1;
    }
    if len != h.count || h.epoch != epoch {
        return Err(Error::corrupt(
            "condemned list",
            &key,
            "count or epoch differs from its header",
        ));
    }
    let firsts = sorter.into_spilled()?;
    // Read once through, so that an object listed twice in different
    // runs is found here rather than while condemning.
    for f in firsts.sorted()? {
        f?;
    }
    Ok(Previous { firsts, len })
}

/// The next line without its newline; `None` at the end.
fn next_line(input: &mut impl BufRead, key: &str) -> Result<Option<String>> {
    let mut buf = Vec::new();
    input
        .take(MAX_LINE_BYTES + 1)
        .read_until(b'\n', &mut buf)
        .ctx("read", key)?;
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() as u64 > MAX_LINE_BYTES {
        return Err(Error::corrupt("condemned list", key, "a line is too long"));
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| Error::corrupt("condemned list", key, "not UTF-8"))
}

fn parse_line(line: &str, key: &str) -> Result<First> {
    let bad = || Error::corrupt("condemned list", key, format!("bad line `{line}`"));
    let f: Vec<&str> = line.split(' ').collect();
    let [code, hexd, _size, first_epoch, first_ns] = f[..] else {
        return Err(bad());
    };
    Ok(First {
        kind: Kind::from_code(code).ok_or_else(bad)?,
        digest: digest("condemned object", hexd)?,
        epoch: first_epoch.parse().map_err(|_| bad())?,
        ns: first_ns.parse().map_err(|_| bad())?,
    })
}

/// What condemning found: the listing, the marks and the condemned
/// objects, with the new list and the deletable objects in scratch.
pub(super) struct Condemnation {
    /// Objects listed in the store.
    pub(super) listed: u64,
    /// Listed bytes of the marked objects, by category.
    pub(super) reachable: BTreeMap<String, Tally>,
    /// Marked objects (listed or not), by whether a base reaches them.
    pub(super) marked: u64,
    pub(super) live_base: Tally,
    pub(super) live_delta: Tally,
    /// Every unmarked object; those first condemned now; those past grace.
    pub(super) condemned: Tally,
    pub(super) newly: Tally,
    pub(super) deletable: Tally,
    /// The new list's lines (without its header), in scratch.
    pub(super) lines: PathBuf,
    /// The deletable objects, sorted.
    pub(super) deletable_objects: Spilled<Obj>,
}

/// When and since which epoch a condemning pass runs.
pub(super) struct Clock {
    pub(super) epoch: u64,
    pub(super) now: i64,
    pub(super) grace_ns: i64,
}

/// Every stored object that is not marked, condemned; the rest tallied.
pub(super) fn condemn(
    store: &Store,
    marked: &Spilled<Obj>,
    prev: &Previous,
    clock: &Clock,
    dir: &Path,
) -> Result<Condemnation> {
    let mut pass = Pass::new(dir, clock)?;
    let mut marks = Probe::new(marked.sorted()?)?;
    let mut firsts = Probe::new(prev.firsts.sorted()?)?;
    let mut listing = Listing::new(store)?;
    while let Some((kind, d, size)) = listing.next_object()? {
        let at = |o: &Obj| o.cmp_to(kind, &d);
        if marks.seek_passing(at, |o| pass.marked(o))?.is_some() {
            pass.c
                .reachable
                .entry(kind.category().to_string())
                .or_default()
                .add(size);
            continue;
        }
        let first = firsts.seek(|f| (f.kind, &f.digest).cmp(&(kind, &d)))?;
        let (epoch, ns) = first.map_or((clock.epoch, clock.now), |f| (f.epoch, f.ns));
        pass.condemned(kind, d, size, epoch, ns)?;
    }
    for o in marks.into_rest() {
        pass.marked(&o?);
    }
    pass.c.listed = listing.listed;
    pass.finish()
}

/// One condemning pass's tallies and scratch output.
struct Pass<'a> {
    c: Condemnation,
    clock: &'a Clock,
    lines: BufWriter<File>,
    deletable: SortedWriter<Obj>,
}

impl<'a> Pass<'a> {
    fn new(dir: &Path, clock: &'a Clock) -> Result<Pass<'a>> {
        let lines = dir.join("condemned.lines");
        let file = crate::token::create_private(&lines)?;
        Ok(Pass {
            c: Condemnation {
                listed: 0,
                reachable: BTreeMap::new(),
                marked: 0,
                live_base: Tally::default(),
                live_delta: Tally::default(),
                condemned: Tally::default(),
                newly: Tally::default(),
                deletable: Tally::default(),
                lines,
                deletable_objects: Spilled::empty(),
            },
            clock,
            lines: BufWriter::with_capacity(1 << 20, file),
            deletable: SortedWriter::create(dir)?,
        })
    }

    fn marked(&mut self, o: &Obj) {
        self.c.marked += 1;
        match o.base {
            true => self.c.live_base.add(o.size),
            false => self.c.live_delta.add(o.size),
        }
    }

    fn condemned(&mut self, kind: Kind, d: [u8; 32], size: u64, epoch: u64, ns: i64) -> Result<()> {
        let line = format!("{} {} {size} {epoch} {ns}\n", kind.code(), hex::encode(d));
        self.lines
            .write_all(line.as_bytes())
            .ctx("write", &self.c.lines)?;
        self.c.condemned.add(size);
        if epoch == self.clock.epoch {
            self.c.newly.add(size);
        } else if self.clock.now.saturating_sub(ns) >= self.clock.grace_ns {
            self.c.deletable.add(size);
            self.deletable.push(&Obj {
                kind,
                digest: d,
                size,
                base: false,
            })?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Condemnation> {
        self.lines.flush().ctx("write", &self.c.lines)?;
        self.c.deletable_objects = self.deletable.finish()?;
        Ok(self.c)
    }
}

/// The store's objects in (kind, digest) order: kinds in [`Kind`] order,
/// a kind's two-hex-digit prefix directories in name order, each
/// directory's names sorted. A name that is not the lowercase digest of
/// its directory's prefix (plus the kind's suffix) is not ours to judge.
struct Listing<'a> {
    store: &'a Store,
    dirs: std::vec::IntoIter<(Kind, String, &'static str)>,
    current: std::vec::IntoIter<(String, u64)>,
    at: Option<(Kind, String, &'static str)>,
    last: Option<(Kind, [u8; 32])>,
    listed: u64,
}

impl<'a> Listing<'a> {
    fn new(store: &'a Store) -> Result<Listing<'a>> {
        let storage = store.storage();
        let mut dirs = vec![(
            Kind::Manifest,
            keys::MANIFESTS.to_string(),
            keys::MANIFEST_SUFFIX,
        )];
        for (kind, top, ext) in [
            (Kind::Segment, keys::SEGMENTS, keys::SEGMENT_SUFFIX),
            (Kind::Pack, keys::PACKS, keys::PACK_SUFFIX),
            (Kind::Blob, keys::BLOBS, ""),
            (Kind::ChunkList, keys::CHUNK_LISTS, ""),
            (Kind::Chunk, keys::CHUNKS, ""),
        ] {
            for sub in storage.list(top)? {
                if sub.len() == 2
                    && sub
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    dirs.push((kind, format!("{top}/{sub}"), ext));
                }
            }
        }
        Ok(Listing {
            store,
            dirs: dirs.into_iter(),
            current: Vec::new().into_iter(),
            at: None,
            last: None,
            listed: 0,
        })
    }

    /// The next object; directories are listed one at a time.
    fn next_object(&mut self) -> Result<Option<(Kind, [u8; 32], u64)>> {
        loop {
            if let Some((name, size)) = self.current.next() {
                let Some((kind, d)) = self.parse(&name) else {
                    continue;
                };
                self.check_order(kind, d)?;
                self.listed += 1;
                return Ok(Some((kind, d, size)));
            }
            let Some(next) = self.dirs.next() else {
                return Ok(None);
            };
            let mut names = self.store.storage().list_sizes(&next.1)?;
            names.sort_unstable();
            self.current = names.into_iter();
            self.at = Some(next);
        }
    }

    fn parse(&self, name: &str) -> Option<(Kind, [u8; 32])> {
        let (kind, dir, ext) = self.at.as_ref()?;
        let h = name.strip_suffix(ext)?;
        let d = digest("object", h).ok()?;
        let prefix = dir.rsplit_once('/').map_or("", |(_, p)| p);
        (hex::encode(d) == h && h.starts_with(prefix)).then_some((*kind, d))
    }

    /// A merge needs the listing strictly ascending; a backend that lists
    /// otherwise is a bug, not a reason to condemn at random.
    fn check_order(&mut self, kind: Kind, d: [u8; 32]) -> Result<()> {
        if self.last.is_some_and(|l| l >= (kind, d)) {
            return Err(Error::internal(format!(
                "store listing out of order: object=`{}`",
                kind.key(&hex::encode(d))
            )));
        }
        self.last = Some((kind, d));
        Ok(())
    }
}

/// Store the condemned list of `epoch`: its header, then the lines the
/// condemning pass wrote, staged in `dir` and created exclusively.
pub(super) fn write_condemned(
    store: &Store,
    epoch: u64,
    c: &Condemnation,
    now: i64,
    dir: &Path,
) -> Result<()> {
    let header = CondemnedHeader {
        tag: CONDEMNED_TAG.into(),
        version: CONDEMNED_VERSION,
        epoch,
        written_ns: now,
        count: c.condemned.count,
    };
    let mut text = serde_json::to_string(&header)
        .map_err(|e| Error::internal_from("encode the condemned list header", e))?;
    text.push('\n');
    let staged = dir.join("condemned.list");
    let mut out = crate::token::create_private(&staged)?;
    out.write_all(text.as_bytes()).ctx("write", &staged)?;
    let mut lines = File::open(&c.lines).ctx("open", &c.lines)?;
    std::io::copy(&mut lines, &mut out).ctx("write", &staged)?;
    out.sync_all().ctx("fsync", &staged)?;
    let key = keys::epoch(epoch, "condemned");
    created(store.storage().put_file_if_absent(&key, &staged)?, &key)
}

fn created(outcome: PutOutcome, key: &str) -> Result<()> {
    match outcome {
        PutOutcome::Created => Ok(()),
        PutOutcome::AlreadyExists => Err(Error::Conflict(format!(
            "another sweep wrote this epoch first: key=`{key}`"
        ))),
    }
}

/// Write the report, forget old epochs.
pub(super) fn finish(store: &Store, epoch: u64, known: &[u64], report: &SweepReport) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(report)
        .map_err(|e| Error::internal_from("encode the sweep report", e))?;
    let key = keys::epoch(epoch, "report.json");
    created(store.storage().put_if_absent(&key, &bytes)?, &key)?;
    store.failpoints().hit(Step::Swept)?;
    for &old in known
        .iter()
        .filter(|&&e| e < epoch.saturating_sub(KEEP_EPOCHS))
    {
        store.storage().delete(&keys::epoch(old, "condemned"))?;
        store.storage().delete(&keys::epoch(old, "report.json"))?;
    }
    Ok(())
}
