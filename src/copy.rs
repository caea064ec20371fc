//! Copy: replicate committed generations (and their tags) from one store to
//! another, local or S3 in either direction, keeping generation numbers and
//! identities.
//!
//! Objects are content-named, so a representation is copied as the objects
//! its manifest names (segments, packs, standalone blobs, chunk lists and
//! the chunks they list, and for a delta its base's), each checked against
//! its name as it is read from the source and sent only if the target lacks
//! it; the manifest goes last. The generation is then published on the
//! target through the target's own index (PREPARED, then COMMITTED: the
//! invariants every commit keeps), under the target set's write lease, so a
//! copy and a commit on the target never interleave and a reader of the
//! target sees a generation whole or not at all.
//!
//! The target set must be a prefix of the source set: the same identity at
//! every generation number it has. A set that diverged (a commit of its own
//! on the target) is refused by name, and nothing is written for it.
//! Generations the source retired, and generations before the ones asked
//! for, are recorded on the target as retired (numbers are kept; there is
//! nothing to read in them). A copy that stops midway leaves objects no
//! index record names, which the target's sweep reclaims; a rerun sends
//! only what is still missing.

use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::chunk::{ChunkList, Extent};
use crate::format::manifest::Manifest;
use crate::format::record::{IndexRecord, State};
use crate::index::GenIndex;
use crate::storage::{ObjectReader, PutOutcome, TryLease};
use crate::store::{keys, Store};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::io::Read;

/// Objects read whole into memory up to this size; larger standalone blobs
/// are streamed through a scratch file.
const IN_MEMORY: u64 = 64 << 20;

/// What to copy.
#[derive(Debug, Clone, Default)]
pub struct CopyOptions {
    /// Sets to copy; empty: every set of the source.
    pub sets: Vec<String>,
    /// Generations to copy with their content; empty: every committed one.
    pub generations: Vec<u64>,
}

/// What one set's copy did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SetCopy {
    pub set: String,
    /// Generations published on the target by this copy.
    pub copied: Vec<u64>,
    /// Generations recorded on the target as retired.
    pub retired: Vec<u64>,
    /// Generations the target already had (same identity).
    pub present: u64,
    pub tags: u64,
}

/// What a copy did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CopySummary {
    pub sets: Vec<SetCopy>,
    /// Objects sent to the target (it lacked them).
    pub objects_sent: u64,
    pub bytes_sent: u64,
    /// Objects the target already held.
    pub objects_present: u64,
}

/// Copy `opts`' sets and generations from `source` to `target`.
pub fn copy(source: &Store, target: &Store, opts: &CopyOptions) -> Result<CopySummary> {
    let sets = match opts.sets.is_empty() {
        true => source.sets()?,
        false => opts.sets.clone(),
    };
    let mut copier = Copier {
        source,
        target,
        known: HashSet::new(),
        summary: CopySummary::default(),
        owner: format!("copy-{}", crate::token::new_token()),
    };
    for set in sets {
        crate::store::check_set_name(&set)?;
        let done = copier.set(&set, &opts.generations)?;
        copier.summary.sets.push(done);
    }
    Ok(copier.summary)
}

struct Copier<'a> {
    source: &'a Store,
    target: &'a Store,
    /// Object keys the target is known to hold (sent or found).
    known: HashSet<String>,
    summary: CopySummary,
    owner: String,
}

impl Copier<'_> {
    fn set(&mut self, set: &str, wanted: &[u64]) -> Result<SetCopy> {
        let lease =
            match self
                .target
                .storage()
                .lease(&keys::writer_lease(set), &self.owner, true)?
            {
                TryLease::Acquired(l) => l,
                TryLease::Busy { holder } => {
                    return Err(Error::Busy {
                        set: set.to_string(),
                        holder,
                    })
                }
            };
        // Up to the source's latest, read before its records: a commit in
        // flight there (a PREPARED record past it) is left for the next copy.
        let latest = GenIndex::new(self.source, set)
            .latest()?
            .map_or(0, |r| r.generation);
        let src = GenIndex::new(self.source, set).all()?;
        let tgt_index = GenIndex::new(self.target, set);
        let tgt = tgt_index.all()?;
        let present = check_prefix(set, &src, &tgt)?;
        let mut done = SetCopy {
            set: set.to_string(),
            present,
            ..SetCopy::default()
        };
        let last = match wanted.iter().max() {
            Some(&g) if g > latest => {
                return Err(Error::NotFound {
                    what: "committed generation",
                    name: format!("{set}@{g} on the source"),
                })
            }
            Some(&g) => g,
            None => latest,
        };
        if present > 0 && present < last {
            self.known_from_target(&tgt_index, present)?;
        }
        for g in present + 1..=last {
            let rec = src.get(&g).ok_or_else(|| Error::NotFound {
                what: "generation",
                name: format!("{set}@{g} on the source"),
            })?;
            if rec.state == State::Prepared {
                return Err(Error::Conflict(format!(
                    "generation {g} of set `{set}` is being published on the source; copy again"
                )));
            }
            let content =
                rec.state == State::Committed && (wanted.is_empty() || wanted.contains(&g));
            if wanted.contains(&g) && !content {
                return Err(Error::Invalid(format!(
                    "generation {g} of set `{set}` is {} on the source: nothing to copy",
                    rec.state.label()
                )));
            }
            lease.check()?;
            if content {
                self.generation(set, rec, &tgt_index)?;
                done.copied.push(g);
            } else {
                tgt_index.record_retired(rec, &self.owner)?;
                done.retired.push(g);
            }
        }
        done.tags = self.tags(set, last)?;
        Ok(done)
    }

    /// Send one committed generation's objects, then publish it.
    fn generation(&mut self, set: &str, rec: &IndexRecord, index: &GenIndex) -> Result<()> {
        // The pin keeps the source's sweep away while its objects are read;
        // what is copied is the representation it pinned (a fold may have
        // replaced the one `rec` names meanwhile).
        let view = GenView::open(self.source, set, Some(rec.generation), "copy")?;
        let mut rep = view.pin.rep.clone();
        self.representation(&rep.manifest)?;
        self.source.failpoints().hit(Step::CopySent)?;
        let mut record = rec.clone();
        rep.state = State::Prepared;
        record.representations = vec![rep];
        record.owner = self.owner.clone();
        record.written_ns = crate::token::now_ns();
        let prepared = index.prepare(record)?;
        index.commit(&prepared)?;
        // Readers probe forward past a stale hint.
        let _ = index.advance_hint(rec.generation);
        Ok(())
    }

    /// Note as held every object that the target's committed generation `g`
    /// names through its manifest (and its base's): a committed
    /// generation's objects are all there, so an incremental copy probes
    /// only what is new instead of every object of the next generation.
    fn known_from_target(&mut self, index: &GenIndex, g: u64) -> Result<()> {
        let Some(rec) = index.newest(g)?.filter(|r| r.state == State::Committed) else {
            return Ok(());
        };
        let Some(rep) = rec.read_rep() else {
            return Ok(());
        };
        let mut name = Some(rep.manifest.clone());
        while let Some(n) = name.take() {
            let key = keys::manifest(&n);
            let m = Manifest::decode(&n, &self.target.storage().get(&key, IN_MEMORY)?)?;
            let names = m.segments.iter().map(|s| keys::segment(&s.name));
            let names = names
                .chain(m.packs.iter().map(|p| keys::pack(&p.name)))
                .chain(m.blobs.iter().map(|b| keys::blob(&b.name)))
                .chain(m.chunklists.iter().map(|l| keys::chunk_list(&l.name)));
            self.known.extend(names);
            self.known.insert(key);
            name = m.base.map(|b| b.manifest);
        }
        Ok(())
    }

    /// Send the objects manifest `name` names (its base's first), then it.
    fn representation(&mut self, name: &str) -> Result<()> {
        let key = keys::manifest(name);
        if self.known.contains(&key) {
            return Ok(());
        }
        let bytes = self.source.storage().get(&key, IN_MEMORY)?;
        let m = Manifest::decode(name, &bytes)?;
        if let Some(base) = &m.base {
            self.representation(&base.manifest)?;
        }
        for s in &m.segments {
            self.object(&keys::segment(&s.name), Check::Sha256(&s.name))?;
        }
        for p in &m.packs {
            self.object(&keys::pack(&p.name), Check::Sha256(&p.name))?;
        }
        for b in &m.blobs {
            self.object(&keys::blob(&b.name), Check::Blake3(&b.name))?;
        }
        for l in &m.chunklists {
            self.chunk_list(&l.name)?;
        }
        self.put(&key, &bytes)
    }

    /// A chunk list and every chunk it lists.
    fn chunk_list(&mut self, name: &str) -> Result<()> {
        let key = keys::chunk_list(name);
        if self.known.contains(&key) {
            return Ok(());
        }
        let digest = digest_of(name)?;
        let bytes = self.source.storage().get(&key, IN_MEMORY)?;
        let list = ChunkList::decode(&digest, &bytes)?;
        for e in &list.extents {
            if let Extent::Data { digest, .. } = e {
                let hex = hex::encode(digest);
                self.object(&keys::chunk(&hex), Check::Chunk(&hex))?;
            }
        }
        self.present_or_put(&key, &bytes)
    }

    /// Send object `key` unless the target holds it, checked as `check`.
    fn object(&mut self, key: &str, check: Check<'_>) -> Result<()> {
        if self.held(key)? {
            return Ok(());
        }
        let size = self
            .source
            .storage()
            .size(key)?
            .ok_or_else(|| Error::MissingObject {
                key: key.to_string(),
            })?;
        if size > IN_MEMORY {
            return self.streamed(key, size, check);
        }
        let bytes = self.source.storage().get(key, size)?;
        check.bytes(key, &bytes)?;
        self.put(key, &bytes)
    }

    /// Whether the target holds `key` (asked once per run).
    fn held(&mut self, key: &str) -> Result<bool> {
        if self.known.contains(key) {
            return Ok(true);
        }
        let held = self.target.storage().size(key)?.is_some();
        if held {
            self.summary.objects_present += 1;
            self.known.insert(key.to_string());
        }
        Ok(held)
    }

    fn present_or_put(&mut self, key: &str, bytes: &[u8]) -> Result<()> {
        match self.held(key)? {
            true => Ok(()),
            false => self.put(key, bytes),
        }
    }

    fn put(&mut self, key: &str, bytes: &[u8]) -> Result<()> {
        if let PutOutcome::Created = self.target.storage().put_if_absent(key, bytes)? {
            self.summary.objects_sent += 1;
            self.summary.bytes_sent += bytes.len() as u64;
        }
        self.known.insert(key.to_string());
        Ok(())
    }

    /// A large object through a scratch file, hashed on the way.
    fn streamed(&mut self, key: &str, size: u64, check: Check<'_>) -> Result<()> {
        let dir = self
            .target
            .storage()
            .scratch_dir(&keys::staging_dir(&self.owner))?;
        let path = dir.join("object");
        let mut reader = ObjectReader::new(&**self.source.storage(), key, size);
        let mut file = std::fs::File::create(&path).map_err(|e| Error::io("create", &path, e))?;
        let mut hash = check.hasher();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader
                .read(&mut buf)
                .map_err(|e| Error::io("read", key, e))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            std::io::Write::write_all(&mut file, &buf[..n])
                .map_err(|e| Error::io("write", &path, e))?;
        }
        check.finish(key, hash)?;
        let outcome = self.target.storage().put_file_if_absent(key, &path);
        let _ = std::fs::remove_dir_all(&dir);
        if let PutOutcome::Created = outcome? {
            self.summary.objects_sent += 1;
            self.summary.bytes_sent += size;
        }
        self.known.insert(key.to_string());
        Ok(())
    }

    /// Copy the source's tags of generations up to `last` the target has
    /// not got; the count copied.
    fn tags(&mut self, set: &str, last: u64) -> Result<u64> {
        let have: HashSet<String> = crate::tag::list_of_set(self.target, set)?
            .into_iter()
            .map(|t| t.name)
            .collect();
        let mut n = 0;
        for t in crate::tag::list_of_set(self.source, set)? {
            let copied = GenIndex::new(self.target, set)
                .newest(t.generation)?
                .is_some_and(|r| r.state == State::Committed);
            if t.generation <= last && copied && !have.contains(&t.name) {
                crate::tag::tag(self.target, set, &t.name, Some(t.generation))?;
                n += 1;
            }
        }
        Ok(n)
    }
}

/// The number of leading generations the target shares with the source;
/// a generation of the target the source does not have with the same
/// identity is a divergence.
fn check_prefix(
    set: &str,
    src: &BTreeMap<u64, IndexRecord>,
    tgt: &BTreeMap<u64, IndexRecord>,
) -> Result<u64> {
    for (g, t) in tgt {
        let same = src.get(g).is_some_and(|s| s.identity == t.identity);
        if !same {
            return Err(Error::Conflict(format!(
                "set `{set}` diverged: the target's generation {g} is not the source's \
                 (a commit of its own on the target?); copy to another set name or store"
            )));
        }
    }
    Ok(tgt.keys().next_back().copied().unwrap_or(0))
}

fn digest_of(name: &str) -> Result<[u8; 32]> {
    hex::decode(name)
        .ok()
        .and_then(|d| d.try_into().ok())
        .ok_or_else(|| Error::corrupt("object name", name, "not a 64-digit hex digest"))
}

/// How an object's bytes are checked against its name.
#[derive(Clone, Copy)]
enum Check<'a> {
    /// SHA-256 of the stored bytes (segments, packs).
    Sha256(&'a str),
    /// BLAKE3 of the stored bytes (standalone blobs: raw content).
    Blake3(&'a str),
    /// BLAKE3 of a chunk's decoded content.
    Chunk(&'a str),
}

/// A running hash for a streamed object.
enum Running {
    Sha(Sha256),
    Blake(Box<blake3::Hasher>),
}

impl Running {
    fn update(&mut self, b: &[u8]) {
        match self {
            Running::Sha(h) => h.update(b),
            Running::Blake(h) => {
                h.update(b);
            }
        }
    }
}

impl Check<'_> {
    fn bytes(self, key: &str, bytes: &[u8]) -> Result<()> {
        if let Check::Chunk(name) = self {
            let actual = crate::format::chunk::content_digest(name, bytes)?;
            return match hex::encode(actual) == name {
                true => Ok(()),
                false => Err(mismatch(key)),
            };
        }
        let mut h = self.hasher();
        h.update(bytes);
        self.finish(key, h)
    }

    fn hasher(self) -> Running {
        match self {
            Check::Sha256(_) => Running::Sha(Sha256::new()),
            _ => Running::Blake(Box::default()),
        }
    }

    fn finish(self, key: &str, h: Running) -> Result<()> {
        let actual = match h {
            Running::Sha(h) => hex::encode(h.finalize()),
            Running::Blake(h) => h.finalize().to_hex().to_string(),
        };
        let name = match self {
            Check::Sha256(n) | Check::Blake3(n) | Check::Chunk(n) => n,
        };
        match actual == name {
            true => Ok(()),
            false => Err(mismatch(key)),
        }
    }
}

fn mismatch(key: &str) -> Error {
    Error::corrupt(
        "object",
        key,
        "content differs from its name on the source; not copied",
    )
}
