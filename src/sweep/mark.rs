//! The mark: everything reachable from the index (non-retired
//! representations and the bases they bind), held pins and live tasks;
//! manifests name their segments, packs and standalone blobs. Grown again
//! by each deletion batch's re-mark. Also the pack live ratios of what it
//! marked (`crate::liveness`), reused while the marked manifests stay the same.

use super::report::{Roots, Space, SparsePack, SweepReport};
use crate::compose::Representation;
use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, RepKind, MAX_MANIFEST_BYTES};
use crate::format::record::{IndexRecord, State, MAX_RECORD_BYTES};
use crate::liveness::FrameUse;
use crate::row::BlobLoc;
use crate::store::{keys, Store};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Names how pack live ratios are computed; changing it makes the ratios in
/// older reports stale (they are not reused).
pub(super) const LIVENESS_KEY_TAG: &str = "strata-pack-liveness-2";

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
        Some(match c {
            "m" => Kind::Manifest,
            "s" => Kind::Segment,
            "p" => Kind::Pack,
            "b" => Kind::Blob,
            "l" => Kind::ChunkList,
            "k" => Kind::Chunk,
            _ => return None,
        })
    }
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

/// A marked object: its size and whether a base representation reaches it.
#[derive(Clone, Copy)]
pub(super) struct Obj {
    size: u64,
    base: bool,
}

/// The reachable set, built by the mark and grown by each batch's re-mark.
#[derive(Default)]
pub(super) struct Marks {
    pub(super) objects: HashMap<(Kind, [u8; 32]), Obj>,
    /// Root sources already read: newest index record keys, pin keys, task record keys.
    pub(super) seen: HashSet<String>,
    /// Generations planned for retirement (a dry run marks as if retired).
    pub(super) skip: HashSet<(String, u64)>,
    pub(super) roots: Roots,
}

impl Marks {
    pub(super) fn contains(&self, kind: Kind, d: &[u8; 32]) -> bool {
        self.objects.contains_key(&(kind, *d))
    }

    pub(super) fn mark(&mut self, kind: Kind, d: [u8; 32], size: u64, base: bool) {
        let o = self.objects.entry((kind, d)).or_insert(Obj { size, base });
        o.base |= base;
    }

    /// Mark a manifest, what it names and the base manifest it binds. The
    /// manifest itself is marked last, so one that failed to load (or whose
    /// base failed) is expanded again by the next root that names it.
    pub(super) fn manifest(&mut self, store: &Store, name: &str) -> Result<()> {
        let d = digest("manifest", name)?;
        if self.contains(Kind::Manifest, &d) {
            return Ok(());
        }
        let bytes = store
            .storage()
            .get(&keys::manifest(name), MAX_MANIFEST_BYTES)?;
        let m = Manifest::decode(name, &bytes)?;
        let base = m.representation == RepKind::Base;
        for s in &m.segments {
            self.mark(Kind::Segment, digest("segment", &s.name)?, s.size, base);
        }
        for p in &m.packs {
            self.mark(Kind::Pack, digest("pack", &p.name)?, p.size, base);
        }
        for b in &m.blobs {
            self.mark(Kind::Blob, digest("blob", &b.name)?, b.size, base);
        }
        for c in &m.chunklists {
            self.chunk_list(store, &c.name, c.size, base)?;
        }
        if let Some(b) = &m.base {
            self.manifest(store, &b.manifest)?;
        }
        self.mark(Kind::Manifest, d, bytes.len() as u64, base);
        Ok(())
    }

    /// Mark a chunk list and its chunks (chunks by their raw length: their
    /// stored size is not recorded anywhere smaller than a listing). A list
    /// that cannot be read fails the mark: its chunks are unaccounted for.
    fn chunk_list(&mut self, store: &Store, name: &str, size: u64, base: bool) -> Result<()> {
        let d = digest("chunk list", name)?;
        if let Some(o) = self.objects.get_mut(&(Kind::ChunkList, d)) {
            o.base |= base;
            if !base {
                return Ok(());
            }
        }
        let list = crate::chunks::list_any(store, &d)?;
        for e in &list.extents {
            if let crate::format::chunk::Extent::Data { len, digest } = *e {
                self.mark(Kind::Chunk, digest, len, base);
            }
        }
        self.mark(Kind::ChunkList, d, size, base);
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
        for (digest, blob, size) in rows {
            let sized = |key: String| store.storage().size(&key).map(|s| s.unwrap_or(0));
            match (blob, digest) {
                (BlobLoc::Packed { pack, .. }, _) if !self.contains(Kind::Pack, &pack) => {
                    let size = sized(keys::pack(&hex::encode(pack)))?;
                    self.mark(Kind::Pack, pack, size, false);
                }
                (BlobLoc::Standalone, Some(d)) => self.mark(Kind::Blob, d, size, false),
                (BlobLoc::Chunked { list, .. }, _) if !self.contains(Kind::ChunkList, &list) => {
                    let name = hex::encode(list);
                    let size = sized(keys::chunk_list(&name))?;
                    self.chunk_list(store, &name, size, false)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Live bytes by category (reached from a base, or only from deltas).
    pub(super) fn space(&self) -> Space {
        let mut space = Space::default();
        for o in self.objects.values() {
            match o.base {
                true => space.live_base.add(o.size),
                false => space.live_delta.add(o.size),
            }
        }
        space
    }

    /// Names of the marked manifests, sorted.
    pub(super) fn manifest_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .objects
            .keys()
            .filter(|(k, _)| *k == Kind::Manifest)
            .map(|(_, d)| hex::encode(d))
            .collect();
        names.sort();
        names
    }

    /// Live and dead bytes of every reachable pack, from the location
    /// columns of every reachable row; reused from `previous` when the
    /// reachable manifests are the same (their rows are immutable).
    pub(super) fn pack_liveness(
        &self,
        store: &Store,
        previous: Option<&SweepReport>,
    ) -> Result<Liveness> {
        let names = self.manifest_names();
        let mut h = blake3::Hasher::new();
        h.update(LIVENESS_KEY_TAG.as_bytes());
        for n in &names {
            h.update(b"\n");
            h.update(n.as_bytes());
        }
        let key = hex::encode(h.finalize().as_bytes());
        if let Some(p) = previous.filter(|p| p.liveness_key == key) {
            return Ok(Liveness {
                key,
                live: p.space.packs_live_bytes,
                dead: p.space.packs_dead_bytes,
                sparse: p.sparse_packs.clone(),
                rows: 0,
            });
        }
        let mut used = FrameUse::default();
        let mut rows = 0;
        for name in &names {
            let rep = Representation::open(store, name)?;
            if rep.manifest.packs.is_empty() {
                continue;
            }
            rep.blob_locs(|loc| {
                rows += 1;
                used.add(loc);
            })?;
        }
        Ok(self.tally_packs(store, key, &mut used, rows))
    }

    pub(super) fn tally_packs(
        &self,
        store: &Store,
        key: String,
        used: &mut FrameUse,
        rows: u64,
    ) -> Liveness {
        let mut out = Liveness {
            key,
            rows,
            ..Liveness::default()
        };
        for (&(kind, d), o) in &self.objects {
            if kind != Kind::Pack {
                continue;
            }
            let pack = used.pack_use(store, d, o.size);
            out.live += pack.live;
            out.dead += pack.dead();
            if pack.is_sparse() {
                out.sparse.push(SparsePack {
                    name: hex::encode(d),
                    size: o.size,
                    live_bytes: pack.live,
                });
            }
        }
        out.sparse.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// Pack live ratios of one set of reachable manifests.
#[derive(Default)]
pub(super) struct Liveness {
    pub(super) key: String,
    pub(super) live: u64,
    pub(super) dead: u64,
    pub(super) sparse: Vec<SparsePack>,
    pub(super) rows: u64,
}
