//! The mark: everything reachable from the index (non-retired
//! representations and the bases they bind), held pins and live tasks;
//! manifests name their segments, packs and standalone blobs, chunk lists
//! their chunks. Grown again by each deletion batch's re-mark.
//!
//! Marks are [`Obj`] records sorted under the sweep's memory budget
//! (`crate::spill`), spilled to the sweep's scratch as they outgrow it
//! (invariant 6); what they reach is read once per sweep: every manifest,
//! and each chunk list while a bounded memo remembers it (one forgotten is
//! read again, and its marks combine with the earlier ones).

use super::report::Roots;
use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, RepKind, MAX_MANIFEST_BYTES};
use crate::format::record::{IndexRecord, State, MAX_RECORD_BYTES};
use crate::row::BlobLoc;
use crate::spill::{read_fixed, Record, SortBudget, Sorter, Spilled};
use crate::store::{keys, Store};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Kinds of stored objects, in the order marks, listings and condemned
/// lists sort them (and the order the store is listed in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Kind {
    Manifest,
    Segment,
    Pack,
    Blob,
    ChunkList,
    Chunk,
}

impl Kind {
    /// Every kind, in sort order.
    pub(super) const ALL: [Kind; 6] = [
        Kind::Manifest,
        Kind::Segment,
        Kind::Pack,
        Kind::Blob,
        Kind::ChunkList,
        Kind::Chunk,
    ];

    pub(super) fn key(self, hex: &str) -> String {
        match self {
            Kind::Manifest => keys::manifest(hex),
            Kind::Segment => keys::segment(hex),
            Kind::Pack => keys::pack(hex),
            Kind::Blob => keys::blob(hex),
            Kind::ChunkList => keys::chunk_list(hex),
            Kind::Chunk => keys::chunk(hex),
        }
    }

    /// The space category `strata status` shows this kind's objects under.
    pub(super) fn category(self) -> &'static str {
        match self {
            Kind::Manifest => "manifests",
            Kind::Segment => "segments",
            Kind::Pack => "packs",
            Kind::Blob => "blobs",
            Kind::ChunkList => "chunk lists",
            Kind::Chunk => "chunks",
        }
    }

    pub(super) fn code(self) -> char {
        match self {
            Kind::Manifest => 'm',
            Kind::Segment => 's',
            Kind::Pack => 'p',
            Kind::Blob => 'b',
            Kind::ChunkList => 'l',
            Kind::Chunk => 'k',
        }
    }

    pub(super) fn from_code(c: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| c.len() == 1 && c.starts_with(k.code()))
    }

    /// The kind's byte in scratch records (its place in the sort order).
    pub(super) fn byte(self) -> u8 {
        self as u8
    }

    pub(super) fn from_byte(b: u8) -> Option<Kind> {
        Kind::ALL.get(usize::from(b)).copied()
    }
}

/// A scratch record's kind byte, checked.
pub(super) fn kind_of(b: u8, run: &Path) -> Result<Kind> {
    Kind::from_byte(b).ok_or_else(|| {
        Error::corrupt(
            "sweep scratch run",
            run.display().to_string(),
            "bad kind byte",
        )
    })
}

pub(super) fn digest(what: &'static str, name: &str) -> Result<[u8; 32]> {
    let mut d = [0u8; 32];
    match hex::decode_to_slice(name, &mut d) {
        Ok(()) => Ok(d),
        Err(_) => Err(Error::corrupt(
            what,
            name,
            "name is not a SHA-256/BLAKE3 hex digest",
        )),
    }
}

/// A stored object by kind and digest, with its size and, for a mark,
/// whether a base representation reaches it (false in other lists).
#[derive(Debug, Clone, Copy)]
pub(super) struct Obj {
    pub(super) kind: Kind,
    pub(super) digest: [u8; 32],
    pub(super) size: u64,
    pub(super) base: bool,
}

impl Obj {
    /// How this object's key compares to `(kind, digest)`.
    pub(super) fn cmp_to(&self, kind: Kind, digest: &[u8; 32]) -> Ordering {
        (self.kind, &self.digest).cmp(&(kind, digest))
    }
}

/// Scratch encoding: kind byte, digest, size (u64le), base byte.
const OBJ_BYTES: usize = 42;

impl Record for Obj {
    fn key_cmp(&self, other: &Self) -> Ordering {
        self.cmp_to(other.kind, &other.digest)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind.byte());
        out.extend_from_slice(&self.digest);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.push(u8::from(self.base));
    }

    fn read(input: &mut impl Read, run: &Path) -> Result<Option<Obj>> {
        let Some(b) = read_fixed::<OBJ_BYTES>(input, run)? else {
            return Ok(None);
        };
        let mut digest = [0u8; 32];
        digest.copy_from_slice(&b[1..33]);
        let mut size = [0u8; 8];
        size.copy_from_slice(&b[33..41]);
        Ok(Some(Obj {
            kind: kind_of(b[0], run)?,
            digest,
            size: u64::from_le_bytes(size),
            base: b[41] != 0,
        }))
    }

    /// One object reached twice: its size is the same (digest-named); it
    /// is a base's if either reach is.
    fn absorb(&mut self, later: &Obj) -> Result<()> {
        self.base |= later.base;
        Ok(())
    }
}

/// Bytes one remembered chunk list costs the memo, at most (hash table
/// slack included).
const MEMO_ENTRY_BYTES: usize = 80;

/// The reachable set, built by the mark and grown by each batch's re-mark.
pub(super) struct Marks {
    /// What the mark (or the re-mark since the last [`Marks::take`]) reached.
    pending: Sorter<Obj>,
    /// Where `pending` sorts.
    dir: PathBuf,
    /// Manifests already expanded (as many as the representations reached).
    manifests: HashSet<[u8; 32]>,
    /// Chunk lists already expanded, and whether from a base; forgotten
    /// when `memo_cap` is reached (a forgotten one is only read again).
    chunk_lists: HashMap<[u8; 32], bool>,
    memo_cap: usize,
    /// Root sources already read: newest index record keys, pin keys, task record keys.
    pub(super) seen: HashSet<String>,
    /// Generations planned for retirement (a dry run marks as if retired).
    pub(super) skip: HashSet<(String, u64)>,
    pub(super) roots: Roots,
}

impl Marks {
    /// Marks sorting in `dir` under `budget`, with `memo_bytes` for the
    /// chunk-list memo.
    pub(super) fn new(dir: &Path, budget: SortBudget, memo_bytes: usize) -> Result<Marks> {
        Ok(Marks {
            pending: Sorter::new(dir, budget)?,
            dir: dir.to_path_buf(),
            manifests: HashSet::new(),
            chunk_lists: HashMap::new(),
            memo_cap: memo_bytes / MEMO_ENTRY_BYTES,
            seen: HashSet::new(),
            skip: HashSet::new(),
            roots: Roots::default(),
        })
    }

    /// What was marked since the last take, sorted; marking goes on
    /// afresh under `budget`.
    pub(super) fn take(&mut self, budget: SortBudget) -> Result<Spilled<Obj>> {
        let fresh = Sorter::new(&self.dir, budget)?;
        std::mem::replace(&mut self.pending, fresh).into_spilled()
    }

    fn mark(&mut self, kind: Kind, digest: [u8; 32], size: u64, base: bool) -> Result<()> {
        self.pending.push(Obj {
            kind,
            digest,
            size,
            base,
        })
    }

    fn remember_chunk_list(&mut self, d: [u8; 32], base: bool) {
        if self.chunk_lists.len() >= self.memo_cap {
            self.chunk_lists.clear();
        }
        if self.memo_cap > 0 {
            self.chunk_lists.insert(d, base);
        }
    }

    /// Mark a manifest, what it names and the base manifest it binds. The
    /// manifest itself is marked (and remembered) last, so one that failed
    /// to load (or whose base failed) is expanded again by the next root
    /// that names it.
    pub(super) fn manifest(&mut self, store: &Store, name: &str) -> Result<()> {
        let d = digest("manifest", name)?;
        if self.manifests.contains(&d) {
            return Ok(());
        }
        let bytes = store
            .storage()
            .get(&keys::manifest(name), MAX_MANIFEST_BYTES)?;
        let m = Manifest::decode(name, &bytes)?;
        let base = m.representation == RepKind::Base;
        for s in &m.segments {
            self.mark(Kind::Segment, digest("segment", &s.name)?, s.size, base)?;
        }
        for p in &m.packs {
            self.mark(Kind::Pack, digest("pack", &p.name)?, p.size, base)?;
        }
        for b in &m.blobs {
            self.mark(Kind::Blob, digest("blob", &b.name)?, b.size, base)?;
        }
        for c in &m.chunklists {
            self.chunk_list(store, &c.name, c.size, base)?;
        }
        if let Some(b) = &m.base {
            self.manifest(store, &b.manifest)?;
        }
        self.mark(Kind::Manifest, d, bytes.len() as u64, base)?;
        self.manifests.insert(d);
        Ok(())
    }

    /// Mark a chunk list and its chunks (chunks by their raw length: their
    /// stored size is not recorded anywhere smaller than a listing). A list
    /// that cannot be read fails the mark: its chunks are unaccounted for.
    fn chunk_list(&mut self, store: &Store, name: &str, size: u64, base: bool) -> Result<()> {
        let d = digest("chunk list", name)?;
        if self.chunk_lists.get(&d).is_some_and(|&had| had || !base) {
            return Ok(());
        }
        let list = crate::chunks::list_any(store, &d)?;
        for e in &list.extents {
            if let crate::format::chunk::Extent::Data { len, digest } = *e {
                self.mark(Kind::Chunk, digest, len, base)?;
            }
        }
        self.mark(Kind::ChunkList, d, size, base)?;
        self.remember_chunk_list(d, base);
        Ok(())
    }

    /// Mark from the index: every generation's newest record not yet read.
    pub(super) fn index(&mut self, store: &Store) -> Result<()> {
        for set in store.sets()? {
            let mut newest: BTreeMap<u64, u32> = BTreeMap::new();
            for name in store.storage().list(&keys::index_dir(&set))? {
                if let Some((g, v)) = IndexRecord::parse_name(&name) {
                    let e = newest.entry(g).or_insert(v);
                    *e = (*e).max(v);
                }
            }
            for (g, v) in newest {
                let key = keys::index_record(&set, g, v);
                if self.seen.insert(key.clone()) {
                    self.record(store, &set, &key)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn record(&mut self, store: &Store, set: &str, key: &str) -> Result<()> {
        let bytes = store.storage().get(key, MAX_RECORD_BYTES)?;
        let r = IndexRecord::decode(key, &bytes)?;
        if r.state == State::Retired || self.skip.contains(&(set.to_string(), r.generation)) {
            return Ok(());
        }
        self.roots.generations += 1;
        for rep in r
            .representations
            .iter()
            .filter(|x| x.state != State::Retired)
        {
            self.roots.representations += 1;
            self.manifest(store, &rep.manifest)?;
        }
        Ok(())
    }

    /// Mark from pins not yet read. A held pin whose manifest cannot be
    /// read, or whose body does not parse, is an unreadable root.
    pub(super) fn pins(&mut self, store: &Store) -> Result<()> {
        for p in crate::pin::list(store)? {
            if !self.seen.insert(p.key.clone()) {
                continue;
            }
            match p.state {
                crate::pin::PinState::Invalid if p.held => {
                    return Err(Error::corrupt(
                        "pin",
                        &p.key,
                        "held pin with an unreadable body",
                    ))
                }
                crate::pin::PinState::Invalid => {}
                _ => {
                    self.roots.pins += u64::from(p.held);
                    if let Err(e) = self.manifest(store, &p.manifest) {
                        if p.state == crate::pin::PinState::Held {
                            return Err(e);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Mark sources and outputs of tasks that are not final. A source or
    /// output already gone is the task's to discover (SOURCE_RETIRED or a
    /// refold), not a reason to stop the sweep. A task whose newest record
    /// does not parse holds back what it could protect (see [`Marks::hold_back`]).
    pub(super) fn tasks(&mut self, store: &Store) -> Result<()> {
        let listing = crate::task::Tasks::new(store).list()?;
        for t in listing.tasks {
            let key = keys::task_record(&t.id, t.record);
            if t.state.is_final() || !self.seen.insert(key) {
                continue;
            }
            self.roots.tasks += 1;
            self.task_manifests(store, &t)?;
        }
        for c in listing.corrupt {
            if self.seen.insert(c.key.clone()) {
                self.hold_back(store, &c)?;
            }
        }
        Ok(())
    }

    fn task_manifests(&mut self, store: &Store, t: &crate::task::TaskRecord) -> Result<()> {
        let names = t.sources.iter().map(|s| s.manifest.clone());
        for name in names.chain(t.output.clone()) {
            match self.manifest(store, &name) {
                Err(e) if e.is_not_found() => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// What a task with an unreadable newest record could protect: the
    /// sources and outputs its readable records name, and every
    /// representation any index record of its generation ever named (its
    /// set and generation come from a readable record, else from its id).
    /// Nothing else is held back; the report names the record.
    fn hold_back(&mut self, store: &Store, c: &crate::task::CorruptTask) -> Result<()> {
        let readable = crate::task::Tasks::new(store).readable_records(&c.id)?;
        for t in &readable {
            self.task_manifests(store, t)?;
        }
        let target = match readable.last() {
            Some(t) => vec![(t.set.clone(), t.target.generation)],
            None => crate::task::target_of_id(store, &c.id)?,
        };
        for (set, generation) in target {
            self.every_representation(store, &set, generation)?;
        }
        self.roots.held_back.push(format!(
            "corrupt task record `{}`: its sources, outputs and generation kept",
            c.key
        ));
        Ok(())
    }

    /// Every representation named by any record version of a generation.
    fn every_representation(&mut self, store: &Store, set: &str, generation: u64) -> Result<()> {
        for name in store.storage().list(&keys::index_dir(set))? {
            let Some((g, v)) = IndexRecord::parse_name(&name) else {
                continue;
            };
            if g != generation {
                continue;
            }
            let key = keys::index_record(set, g, v);
            let bytes = store.storage().get(&key, MAX_RECORD_BYTES)?;
            for rep in IndexRecord::decode(&key, &bytes)?.representations {
                match self.manifest(store, &rep.manifest) {
                    Err(e) if e.is_not_found() => {}
                    other => other?,
                }
            }
        }
        Ok(())
    }

    /// Every root, index first, then pins, then tasks.
    pub(super) fn roots(&mut self, store: &Store) -> Result<()> {
        self.index(store)?;
        self.pins(store)?;
        self.tasks(store)?;
        self.resumable_journals(store)
    }

    /// What a dead commit's sealed journal names stays while the journal
    /// is resumable (`commit::resume`).
    fn resumable_journals(&mut self, store: &Store) -> Result<()> {
        let mut rows = Vec::new();
        crate::resumable::protected_refs(store, |row| rows.push((row.digest, row.blob, row.size)))?;
        let (mut packs, mut lists) = (HashSet::new(), HashSet::new());
        for (digest, blob, size) in rows {
            let sized = |key: String| store.storage().size(&key).map(|s| s.unwrap_or(0));
            match (blob, digest) {
                (BlobLoc::Packed { pack, .. }, _) if packs.insert(pack) => {
                    let size = sized(keys::pack(&hex::encode(pack)))?;
                    self.mark(Kind::Pack, pack, size, false)?;
                }
                (BlobLoc::Standalone, Some(d)) => self.mark(Kind::Blob, d, size, false)?,
                (BlobLoc::Chunked { list, .. }, _) if lists.insert(list) => {
                    let name = hex::encode(list);
                    let size = sized(keys::chunk_list(&name))?;
                    self.chunk_list(store, &name, size, false)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
