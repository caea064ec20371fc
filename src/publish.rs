//! Publish: merge a sealed journal with the parent generation and commit the
//! result as a new generation.
//!
//! The journal is sorted under a memory budget (spill runs, bounded fan-in)
//! and merged in key order with the parent's base and delta streams. The
//! output is a cumulative delta over the parent's base (one tombstone per
//! removed base row), or a base. Then, in order, each a named durability
//! step: segments, manifest, PREPARED record, COMMITTED record (the only
//! visibility change), latest hint.

use crate::compose::{GenView, Representation};
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::journal::JournalReader;
use crate::format::manifest::{BaseBinding, Counts, Coverage, Manifest, ParentBinding, RepKind};
use crate::format::record::{IndexRecord, RepRecord, State, RECORD_TAG, RECORD_VERSION};
use crate::index::GenIndex;
use crate::rep_writer::{store_manifest, RepHead, RepWriter, StagedRep};
use crate::row::{Kind, Row};
use crate::spill::{SortBudget, Sorter};
use crate::storage::fence;
use crate::storage::Lease;
use crate::store::Store;
use serde::Serialize;
use std::collections::HashSet;
use std::iter::Peekable;
use std::path::Path;

/// What a publication needs besides the journal.
pub struct PublishInput<'a> {
    pub store: &'a Store,
    pub set: &'a str,
    pub generation: u64,
    pub parent: Option<&'a GenView>,
    pub force_base: bool,
    pub message: Option<String>,
    pub owner: &'a str,
    /// The observed scope, recorded in the manifest; partial when the walk
    /// skipped unreadable paths.
    pub coverage: Coverage,
    /// Every row of the new generation carries observed metadata: the
    /// parent's did, or this walk covered the whole tree and caught up.
    pub metadata: bool,
    pub staging: &'a Path,
    pub budget: SortBudget,
    /// Leases the publication is made under; each is checked right before
    /// the index records are written (a lost remote lease fences it).
    pub leases: &'a [&'a dyn Lease],
}

/// Differences between the parent and the new generation.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ChangeStats {
    pub added: u64,
    pub changed: u64,
    pub removed: u64,
    pub unchanged: u64,
}

impl ChangeStats {
    pub fn any(&self) -> bool {
        self.added + self.changed + self.removed > 0
    }
}

#[derive(Debug, Clone)]
pub struct Published {
    pub generation: u64,
    pub representation: RepKind,
    pub manifest: String,
    pub identity: String,
    pub rows_written: u64,
    pub counts: Counts,
    /// Problems after the visibility point that did not undo the commit.
    pub warnings: Vec<String>,
}

/// Result of the merge: what changed and what was written to staging.
struct Merged {
    stats: ChangeStats,
    rep: StagedRep,
}

/// The observation instant the new manifest records for the racy-timestamp
/// guard. Rows a partial commit did not look at were last observed by an
/// older walk, so a scoped or partial commit keeps the parent's instant when
/// that is earlier.
fn observed_ns(input: &PublishInput<'_>, h: &crate::format::journal::JournalHeader) -> i64 {
    let whole = h.scope_count == 1 && h.scope.first().is_some_and(|s| s.is_empty());
    match input.parent {
        Some(p) if !whole || !input.coverage.complete => {
            h.created_ns.min(p.top().manifest.observed_ns)
        }
        _ => h.created_ns,
    }
}

/// The journal facts a manifest records.
struct Seal {
    digest: String,
    observed_ns: i64,
}

/// Merge the journal and, if anything changed, commit the new generation.
pub fn publish(
    input: &PublishInput<'_>,
    journal: &Path,
) -> Result<(ChangeStats, Option<Published>)> {
    let mut reader = JournalReader::open(journal)?;
    let seal = Seal {
        digest: reader.seal().to_string(),
        observed_ns: observed_ns(input, reader.header()),
    };
    check_journal_header(input, reader.header())?;
    let sort_dir = input.staging.join("sort");
    crate::storage::ensure_local_dir(&sort_dir)?;
    let mut sorter = Sorter::new(&sort_dir, input.budget)?;
    while let Some(row) = reader.next_row()? {
        sorter.push(row)?;
    }
    let sorted = sorter.finish()?;
    let kind = match (input.parent, input.force_base) {
        (Some(_), false) => RepKind::Delta,
        _ => RepKind::Base,
    };
    let merged = merge(input, kind, sorted)?;
    if !merged.stats.any() {
        return Ok((merged.stats, None));
    }
    let stats = merged.stats.clone();
    let published = commit_merged(input, kind, merged, seal)?;
    Ok((stats, Some(published)))
}

fn check_journal_header(
    input: &PublishInput<'_>,
    h: &crate::format::journal::JournalHeader,
) -> Result<()> {
    let parent = input.parent.map(|p| p.generation());
    if h.set != input.set || h.generation != input.generation || h.parent != parent {
        return Err(Error::Conflict(format!(
            "journal was observed against another parent: set=`{}` journal_parent={:?} parent={parent:?}",
            h.set, h.parent
        )));
    }
    Ok(())
}

type RowStream<'a> = Peekable<Box<dyn Iterator<Item = Result<Row>> + 'a>>;

fn stream<'a>(it: impl Iterator<Item = Result<Row>> + 'a) -> RowStream<'a> {
    let b: Box<dyn Iterator<Item = Result<Row>> + 'a> = Box::new(it);
    b.peekable()
}

fn rep_rows(rep: Option<&Representation>) -> Result<RowStream<'_>> {
    Ok(match rep {
        Some(r) => stream(r.rows()?),
        None => stream(std::iter::empty()),
    })
}

/// Take the head of `s` if its key equals `key`.
fn take_eq(s: &mut RowStream<'_>, key: &Row) -> Result<Option<Row>> {
    match s.peek() {
        Some(Ok(r)) if r.key_cmp(key).is_eq() => s.next().transpose(),
        Some(Err(_)) => s.next().transpose(),
        _ => Ok(None),
    }
}

/// Index of the stream whose head has the smallest key (the lowest index
/// on ties); an error at any head is returned.
fn min_stream<'a>(
    a: &mut RowStream<'a>,
    b: &mut RowStream<'a>,
    c: &mut RowStream<'a>,
) -> Result<Option<usize>> {
    for s in [&mut *a, &mut *b, &mut *c] {
        if let Some(Err(_)) = s.peek() {
            return Err(s.next().expect("peeked").expect_err("peeked error"));
        }
    }
    let heads = [a.peek(), b.peek(), c.peek()];
    let mut best: Option<(usize, &Row)> = None;
    for (i, h) in heads.iter().enumerate() {
        if let Some(Ok(r)) = h {
            if best.is_none_or(|(_, b)| r.key_cmp(b).is_lt()) {
                best = Some((i, r));
            }
        }
    }
    Ok(best.map(|(i, _)| i))
}

/// What the new generation holds at one key.
enum Next {
    /// The old composed row stands.
    Inherit,
    /// A new or changed row from the journal (boxed: rare next to Inherit).
    New(Box<Row>),
    /// Nothing: removed, or never there.
    Gone,
}

/// Accumulates the merge's outputs.
struct MergeState {
    kind: RepKind,
    writer: RepWriter,
    stats: ChangeStats,
    removed: HashSet<Vec<u8>>,
}

impl MergeState {
    fn under_removed(&self, row: &Row) -> bool {
        if self.removed.is_empty() {
            return false;
        }
        let path = row.path();
        path.iter()
            .enumerate()
            .any(|(i, &c)| c == b'/' && self.removed.contains(&path[..i]))
    }

    fn write(&mut self, row: Row) -> Result<()> {
        self.writer.write(row)
    }

    /// One key: base row `b`, parent delta row `pd`, journal row `j`.
    /// Rows are cloned only when they are written.
    fn step(&mut self, b: Option<Row>, pd: Option<Row>, j: Option<Row>) -> Result<()> {
        let o = match &pd {
            Some(p) if p.kind == Kind::Tombstone => None,
            Some(p) => Some(p),
            None => b.as_ref(),
        };
        let o = match o {
            Some(o) if self.under_removed(o) => {
                self.stats.removed += 1;
                None
            }
            o => o,
        };
        let next = self.next(o, j);
        self.count(o, &next);
        match (self.kind, next) {
            (_, Next::Gone) => match (&b, self.kind) {
                (Some(b), RepKind::Delta) => {
                    self.write(Row::tombstone(b.parent.clone(), b.name.clone()))
                }
                _ => Ok(()),
            },
            (RepKind::Base, Next::New(r)) => self.write(*r),
            (RepKind::Base, Next::Inherit) => self.write(o.expect("inherit needs a row").clone()),
            (RepKind::Delta, Next::New(r)) if b.as_ref() != Some(&*r) => self.write(*r),
            (RepKind::Delta, Next::New(_)) => Ok(()),
            (RepKind::Delta, Next::Inherit) => {
                let o = o.expect("inherit needs a row");
                let same_as_base = b.as_ref().is_some_and(|b| std::ptr::eq(b, o) || b == o);
                if same_as_base {
                    Ok(())
                } else {
                    self.write(o.clone())
                }
            }
        }
    }

    /// Decide the new row at a key from the old row `o` and the journal.
    fn next(&mut self, o: Option<&Row>, j: Option<Row>) -> Next {
        match j {
            Some(j) if j.kind == Kind::Tombstone => {
                if o.is_some_and(|o| o.kind == Kind::Dir) {
                    self.removed.insert(j.path());
                }
                Next::Gone
            }
            Some(j) if o.is_some_and(|o| o.same_observation(&j)) => Next::Inherit,
            Some(j) => {
                if j.kind != Kind::Dir && o.is_some_and(|o| o.kind == Kind::Dir) {
                    self.removed.insert(j.path());
                }
                Next::New(Box::new(j))
            }
            None if o.is_some() => Next::Inherit,
            None => Next::Gone,
        }
    }

    fn count(&mut self, o: Option<&Row>, next: &Next) {
        let n = match next {
            Next::Inherit => {
                self.stats.unchanged += 1;
                o
            }
            Next::New(r) => {
                match o {
                    None => self.stats.added += 1,
                    Some(_) => self.stats.changed += 1,
                }
                Some(&**r)
            }
            Next::Gone => {
                if o.is_some() {
                    self.stats.removed += 1;
                }
                None
            }
        };
        if let Some(n) = n {
            self.writer.live(n);
        }
    }
}

fn merge(
    input: &PublishInput<'_>,
    kind: RepKind,
    journal: crate::spill::Sorted<'static, Row>,
) -> Result<Merged> {
    let parent = input.parent;
    let mut base = rep_rows(parent.map(|p| &p.base))?;
    let mut pdelta = rep_rows(parent.and_then(|p| p.delta.as_ref()))?;
    let mut jr = stream(journal);
    let mut st = MergeState {
        kind,
        writer: RepWriter::new(&input.staging.join("segments"))?,
        stats: ChangeStats::default(),
        removed: HashSet::new(),
    };
    while let Some(i) = min_stream(&mut base, &mut pdelta, &mut jr)? {
        let (b, pd, j) = match i {
            0 => {
                let first = base.next().expect("peeked")?;
                let pd = take_eq(&mut pdelta, &first)?;
                let j = take_eq(&mut jr, &first)?;
                (Some(first), pd, j)
            }
            1 => {
                let first = pdelta.next().expect("peeked")?;
                let j = take_eq(&mut jr, &first)?;
                (None, Some(first), j)
            }
            _ => (None, None, Some(jr.next().expect("peeked")?)),
        };
        st.step(b, pd, j)?;
    }
    Ok(Merged {
        stats: st.stats,
        rep: st.writer.finish()?,
    })
}

fn commit_merged(
    input: &PublishInput<'_>,
    kind: RepKind,
    merged: Merged,
    seal: Seal,
) -> Result<Published> {
    let store = input.store;
    let fp = store.failpoints();
    let segments = merged.rep.store_segments(store)?;
    fp.hit(Step::SegmentsWritten)?;
    let manifest = merged
        .rep
        .manifest(store, head(input, kind, seal), segments)?;
    let name = store_manifest(store, &manifest)?;
    fp.hit(Step::ManifestWritten)?;
    let index = GenIndex::new(store, input.set);
    let prepared = {
        let _fence = fence::enter(input.leases)?;
        index.prepare(index_record(input, &manifest, &name))?
    };
    fp.hit(Step::Prepared)?;
    {
        let _fence = fence::enter(input.leases)?;
        index.commit(&prepared)?;
    }
    fp.hit(Step::Committed)?;
    let warnings = match index.advance_hint(input.generation) {
        Ok(()) => Vec::new(),
        Err(e) => vec![format!("generation is committed but the latest hint was not advanced (readers probe forward): {}", crate::cli_chain(&e))],
    };
    fp.hit(Step::LatestAdvanced)?;
    Ok(Published {
        generation: input.generation,
        representation: kind,
        manifest: name,
        identity: manifest.identity,
        rows_written: manifest.counts.rows,
        counts: manifest.counts,
        warnings,
    })
}

/// What the new manifest says besides its rows: bindings to the parent and
/// (for a delta) its base, the observation instant and the journal.
fn head(input: &PublishInput<'_>, kind: RepKind, seal: Seal) -> RepHead {
    let base = match kind {
        RepKind::Base => None,
        RepKind::Delta => input.parent.map(|p| BaseBinding {
            generation: p.base.manifest.generation,
            identity: p.base.manifest.identity.clone(),
            manifest: p.base.manifest_name.clone(),
        }),
    };
    RepHead {
        set: input.set.to_string(),
        generation: input.generation,
        representation: kind,
        base,
        parent: input.parent.map(|p| ParentBinding {
            generation: p.generation(),
            manifest: p.top().manifest_name.clone(),
        }),
        observed_ns: seal.observed_ns,
        message: input.message.clone(),
        journal: Some(seal.digest),
        coverage: Some(input.coverage.clone()),
        metadata: input.metadata,
    }
}

fn index_record(input: &PublishInput<'_>, m: &Manifest, manifest_name: &str) -> IndexRecord {
    IndexRecord {
        tag: RECORD_TAG.into(),
        version: RECORD_VERSION,
        set: input.set.to_string(),
        generation: input.generation,
        record: 0,
        state: State::Prepared,
        parent: input.parent.map(|p| p.generation()),
        identity: m.identity.clone(),
        representations: vec![RepRecord {
            kind: m.representation,
            manifest: manifest_name.to_string(),
            base: m.base.as_ref().map(|b| b.generation),
            state: State::Prepared,
        }],
        files: m.counts.files,
        bytes: m.counts.bytes,
        message: input.message.clone(),
        written_ns: crate::token::now_ns(),
        committed_ns: None,
        owner: input.owner.to_string(),
    }
}
