//! Reading a generation: a representation's segments, and the composition of
//! a base with one cumulative delta.
//!
//! Offers what every reader needs without knowing about FUSE: resolve a path,
//! list a directory range, stream all rows in key order. Every row has a
//! [`RowPos`] (which representation, segment, row group and index), stable
//! for as long as the view is open: the mount derives inode numbers and
//! directory offsets from it, so it keeps no per-entry state. Segments are loaded
//! and SHA-256-verified on first use and kept in a small LRU; decoded row
//! groups likewise (invariant 6: bounded by counts, not by the tree).

use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, RepKind, MAX_MANIFEST_BYTES};
use crate::format::segment::{Segment, MAX_SEGMENT_BYTES};
use crate::pin::Pin;
use crate::row::{key_cmp, split, Kind, Row};
use crate::store::{keys, Store};
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Segments kept parsed in memory per representation.
const SEGMENT_CACHE: usize = 8;
/// Decoded row groups kept per representation.
const GROUP_CACHE: usize = 32;
/// Row groups decoded ahead of a listing's end ([`Representation::warm_after`]).
const READ_AHEAD_GROUPS: usize = 2;

type Key = (Vec<u8>, Vec<u8>);

/// One cached segment or decoded row group, filled once by whichever reader
/// loads it first; readers that want it meanwhile wait for that load
/// instead of repeating it (a segment is read whole and hashed; a group is
/// decoded). `None` when the load failed: the readers that waited load it
/// again and meet the error themselves, and the slot leaves the cache, so
/// a failure that passes (a remote store's timeout) is not kept.
type Slot<T> = OnceLock<Option<Arc<T>>>;
/// Slots by key, the most recently used kept.
type SlotCache<K, T> = Mutex<Lru<K, Arc<Slot<T>>>>;

/// The item of `cache` at `key`, loaded with `load` unless it is cached or
/// being loaded by another reader (then that load is waited for).
fn cached<K: PartialEq + Copy, T>(
    cache: &SlotCache<K, T>,
    key: K,
    load: impl Fn() -> Result<T>,
) -> Result<Arc<T>> {
    let slot = {
        let mut items = cache.lock().unwrap_or_else(PoisonError::into_inner);
        items.get(&key).unwrap_or_else(|| {
            let slot = Arc::new(Slot::new());
            items.put(key, slot.clone());
            slot
        })
    };
    let mut failed = None;
    let loaded = slot.get_or_init(|| match load() {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            failed = Some(e);
            None
        }
    });
    match (loaded, failed) {
        (Some(v), _) => Ok(v.clone()),
        (None, Some(e)) => {
            let mut items = cache.lock().unwrap_or_else(PoisonError::into_inner);
            items.remove_if(&key, |s| Arc::ptr_eq(s, &slot));
            Err(e)
        }
        // Another reader's load of it failed: meet the error here too.
        (None, None) => load().map(Arc::new),
    }
}

struct Lru<K, V> {
    cap: usize,
    items: VecDeque<(K, V)>,
}

impl<K: PartialEq, V: Clone> Lru<K, V> {
    fn new(cap: usize) -> Self {
        Lru {
            cap,
            items: VecDeque::new(),
        }
    }
    fn get(&mut self, k: &K) -> Option<V> {
        let i = self.items.iter().position(|(key, _)| key == k)?;
        let item = self.items.remove(i)?;
        let v = item.1.clone();
        self.items.push_front(item);
        Some(v)
    }
    fn put(&mut self, k: K, v: V) {
        self.items.push_front((k, v));
        self.items.truncate(self.cap);
    }
    /// Drop the item at `k` if `which` says it is the one meant.
    fn remove_if(&mut self, k: &K, which: impl Fn(&V) -> bool) {
        self.items.retain(|(key, v)| key != k || !which(v));
    }
}

/// Load and verify a manifest by name.
pub fn load_manifest(store: &Store, name: &str) -> Result<Manifest> {
    let key = keys::manifest(name);
    store.read_fresh(&key, || {
        let bytes = store.storage().get(&key, MAX_MANIFEST_BYTES)?;
        Manifest::decode(name, &bytes)
    })
}

/// Load and verify a segment by name, checking its size against the manifest.
pub fn load_segment(store: &Store, name: &str, size: u64) -> Result<Segment> {
    let key = keys::segment(name);
    store.read_fresh(&key, || {
        let bytes = store.storage().get(&key, MAX_SEGMENT_BYTES)?;
        parse_segment(store, name, size, bytes)
    })
}

fn parse_segment(store: &Store, name: &str, size: u64, bytes: Vec<u8>) -> Result<Segment> {
    if bytes.len() as u64 != size {
        return Err(Error::corrupt(
            "segment",
            name,
            format!(
                "size differs from manifest: size={} expected={size}",
                bytes.len()
            ),
        ));
    }
    if store.segment_verified(name, false) {
        return Segment::parse_verified(name, bytes);
    }
    let segment = Segment::parse(name, bytes)?;
    store.segment_verified(name, true);
    Ok(segment)
}

/// One representation: a manifest and its segments.
pub struct Representation {
    store: Store,
    pub manifest_name: String,
    pub manifest: Manifest,
    bounds: Vec<(Key, Key)>,
    segments: SlotCache<usize, Segment>,
    /// Decoded row groups by (segment, group).
    groups: SlotCache<(usize, usize), Vec<Row>>,
}

impl Representation {
    pub fn open(store: &Store, manifest_name: &str) -> Result<Representation> {
        let manifest = load_manifest(store, manifest_name)?;
        let mut bounds = Vec::with_capacity(manifest.segments.len());
        for s in &manifest.segments {
            let k = |a: &[String; 2]| -> Result<Key> {
                let d = |x: &str| {
                    hex::decode(x).map_err(|_| {
                        Error::corrupt("manifest", manifest_name, "segment key is not hex")
                    })
                };
                Ok((d(&a[0])?, d(&a[1])?))
            };
            bounds.push((k(&s.first)?, k(&s.last)?));
        }
        let ordered = bounds
            .windows(2)
            .all(|w| key_cmp(&w[0].1 .0, &w[0].1 .1, &w[1].0 .0, &w[1].0 .1) == Ordering::Less);
        if !ordered {
            return Err(Error::corrupt(
                "manifest",
                manifest_name,
                "segments overlap or are out of order",
            ));
        }
        Ok(Representation {
            store: store.clone(),
            manifest_name: manifest_name.to_string(),
            manifest,
            bounds,
            segments: Mutex::new(Lru::new(SEGMENT_CACHE)),
            groups: Mutex::new(Lru::new(GROUP_CACHE)),
        })
    }

    pub fn kind(&self) -> RepKind {
        self.manifest.representation
    }

    fn segment(&self, i: usize) -> Result<Arc<Segment>> {
        cached(&self.segments, i, || self.load_segment(i))
    }

    /// Segment `i`, read and checked (not cached).
    fn load_segment(&self, i: usize) -> Result<Segment> {
        let r = &self.manifest.segments[i];
        let seg = load_segment(&self.store, &r.name, r.size)?;
        if seg.rows() != r.rows {
            return Err(Error::corrupt(
                "segment",
                &r.name,
                "row count differs from manifest",
            ));
        }
        Ok(seg)
    }

    fn group(&self, seg: usize, group: usize) -> Result<Arc<Vec<Row>>> {
        cached(&self.groups, (seg, group), || self.read_group(seg, group))
    }

    /// Decode the [`READ_AHEAD_GROUPS`] row groups that follow `pos` into
    /// the cache, so that a reader walking on in key order finds them
    /// ready; from halfway through a segment, load the next segment too (a
    /// segment takes longer to load, read whole and hashed, than a walk
    /// takes to cross a few groups). A reader that wants a group while it
    /// is being decoded here waits for that decode rather than repeat it.
    /// Errors are left for the read that needs the group to report.
    pub fn warm_after(&self, pos: RepPos) {
        let seg = pos.seg as usize;
        let Ok(groups) = self.group_count(seg) else {
            return;
        };
        let has_next = seg + 1 < self.bounds.len();
        for g in pos.group as usize + 1..=pos.group as usize + READ_AHEAD_GROUPS {
            if g < groups {
                let _ = self.group(seg, g);
            } else if has_next && self.group_count(seg + 1).is_ok_and(|n| g - groups < n) {
                let _ = self.group(seg + 1, g - groups);
            }
        }
        if has_next && pos.group as usize >= groups / 2 {
            let _ = self.segment(seg + 1);
        }
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.bounds.len()
    }

    /// Number of row groups of segment `seg`.
    pub fn group_count(&self, seg: usize) -> Result<usize> {
        Ok(self.segment(seg)?.group_count())
    }

    /// One row group, decoded and checked, bypassing the group cache (for
    /// scans, which read each group once).
    pub fn read_group(&self, seg: usize, group: usize) -> Result<Vec<Row>> {
        let rows = self.segment(seg)?.read_group(group)?;
        self.check_bounds(seg, group, &rows)?;
        Ok(rows)
    }

    /// Rows must lie inside the segment's declared key range.
    fn check_bounds(&self, seg: usize, _group: usize, rows: &[Row]) -> Result<()> {
        let (first, last) = &self.bounds[seg];
        let inside = rows.iter().all(|r| {
            key_cmp(&first.0, &first.1, &r.parent, &r.name).is_le()
                && key_cmp(&r.parent, &r.name, &last.0, &last.1).is_le()
        });
        let tomb_ok =
            self.kind() == RepKind::Delta || rows.iter().all(|r| r.kind != Kind::Tombstone);
        if !inside || !tomb_ok {
            return Err(Error::corrupt(
                "segment",
                &self.manifest.segments[seg].name,
                "rows outside the manifest's key range or tombstone in a base",
            ));
        }
        Ok(())
    }

    /// Index of the segment that could hold `(parent, name)`.
    fn segment_for(&self, parent: &[u8], name: &[u8]) -> Option<usize> {
        let i = self
            .bounds
            .partition_point(|(f, _)| key_cmp(&f.0, &f.1, parent, name).is_le());
        i.checked_sub(1)
    }

    pub fn lookup(&self, parent: &[u8], name: &[u8]) -> Result<Option<(Row, RepPos)>> {
        let mut cursor = self.cursor_at(parent, name)?;
        match cursor.next_located()? {
            Some((r, pos)) if r.parent == parent && r.name == name => Ok(Some((r, pos))),
            _ => Ok(None),
        }
    }

    /// The row at `pos`, or `None` when no row is there.
    pub fn row_at(&self, pos: RepPos) -> Result<Option<Row>> {
        let seg = pos.seg as usize;
        if seg >= self.bounds.len() || pos.group as usize >= self.segment(seg)?.group_count() {
            return Ok(None);
        }
        let rows = self.group(seg, pos.group as usize)?;
        Ok(rows.get(pos.idx as usize).cloned())
    }

    /// A cursor positioned at the first row with key >= `(parent, name)`.
    pub fn cursor_at(&self, parent: &[u8], name: &[u8]) -> Result<Cursor<'_>> {
        let seg = self.segment_for(parent, name).unwrap_or(0);
        let mut c = Cursor {
            rep: self,
            seg,
            group: 0,
            rows: Arc::new(Vec::new()),
            pos: 0,
            scan: false,
        };
        if seg < self.bounds.len() {
            c.group = self.segment(seg)?.group_for(parent, name);
            c.load()?;
            let target = (parent, name);
            c.pos = c.rows.partition_point(|r| {
                key_cmp(&r.parent, &r.name, target.0, target.1) == Ordering::Less
            });
        }
        Ok(c)
    }

    /// Visit the children of `dir` in name order, after the child named
    /// `after` (from the first when `None`), by reference to the cached row
    /// groups, until `f` returns true.
    fn visit_children(
        &self,
        dir: &[u8],
        after: Option<&[u8]>,
        f: &mut dyn FnMut(&Row, RepPos) -> bool,
    ) -> Result<()> {
        let start = after.unwrap_or(b"");
        let mut seg = self.segment_for(dir, start).unwrap_or(0);
        if seg >= self.bounds.len() {
            return Ok(());
        }
        let mut group = self.segment(seg)?.group_for(dir, start);
        let mut rows = self.group(seg, group)?;
        let mut i = rows.partition_point(|r| key_cmp(&r.parent, &r.name, dir, start).is_lt());
        loop {
            while i >= rows.len() {
                let next = if group + 1 < self.segment(seg)?.group_count() {
                    (seg, group + 1)
                } else if seg + 1 < self.bounds.len() {
                    (seg + 1, 0)
                } else {
                    return Ok(());
                };
                // The children of `dir` are contiguous in key order: when
                // the next group starts under another parent they ended
                // here, which its first key (in the group index) tells
                // without decoding it.
                if !self.starts_under(next.0, next.1, dir)? {
                    return Ok(());
                }
                (seg, group) = next;
                rows = self.group(seg, group)?;
                i = 0;
            }
            let row = &rows[i];
            if row.parent != dir {
                return Ok(());
            }
            let skip = row.name.is_empty() || after == Some(&row.name[..]);
            let at = RepPos {
                seg: seg as u32,
                group: group as u32,
                idx: i as u32,
            };
            if !skip && f(row, at) {
                return Ok(());
            }
            i += 1;
        }
    }

    /// Whether group `group` of segment `seg` starts with a child of `dir`:
    /// read from the manifest's bounds (a segment's first group) or the
    /// segment's group index, without decoding the group.
    fn starts_under(&self, seg: usize, group: usize, dir: &[u8]) -> Result<bool> {
        if group == 0 {
            return Ok(self.bounds[seg].0 .0 == dir);
        }
        let segment = self.segment(seg)?;
        let first = segment.group_first(group).ok_or_else(|| {
            Error::internal(format!("group {group} of segment {seg} out of range"))
        })?;
        Ok(first.0 == dir)
    }

    /// Every content digest with its location, decoding only those columns.
    pub fn blob_refs(
        &self,
        mut f: impl FnMut([u8; 32], crate::row::BlobLoc) -> bool,
    ) -> Result<()> {
        let mut buf = Vec::with_capacity(crate::format::segment::GROUP_ROWS);
        for i in 0..self.bounds.len() {
            let seg = self.segment(i)?;
            for g in 0..seg.group_count() {
                buf.clear();
                seg.read_blob_refs(g, &mut buf)?;
                for (d, loc) in buf.drain(..) {
                    if !f(d, loc) {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// Every stored content location, decoding only those columns (a scan:
    /// each segment is read for it alone and dropped after, not cached).
    pub fn blob_locs(&self, mut f: impl FnMut(crate::row::BlobLoc)) -> Result<()> {
        let mut buf = Vec::with_capacity(crate::format::segment::GROUP_ROWS);
        for i in 0..self.bounds.len() {
            let seg = self.load_segment(i)?;
            for g in 0..seg.group_count() {
                buf.clear();
                seg.read_locs(g, &mut buf)?;
                buf.drain(..).for_each(&mut f);
            }
        }
        Ok(())
    }

    /// Every row in key order (a scan: groups are decoded for it alone,
    /// not cached, and their rows moved out rather than copied).
    pub fn rows(&self) -> Result<Cursor<'_>> {
        let mut c = Cursor {
            rep: self,
            seg: 0,
            group: 0,
            rows: Arc::new(Vec::new()),
            pos: 0,
            scan: true,
        };
        if !self.bounds.is_empty() {
            c.load()?;
        }
        Ok(c)
    }
}

/// Streams rows of one representation in key order, group by group.
pub struct Cursor<'a> {
    rep: &'a Representation,
    seg: usize,
    group: usize,
    rows: Arc<Vec<Row>>,
    pos: usize,
    /// A scan: groups bypass the cache and rows are moved out.
    scan: bool,
}

impl Cursor<'_> {
    fn load(&mut self) -> Result<()> {
        self.rows = match self.scan {
            true => Arc::new(self.rep.read_group(self.seg, self.group)?),
            false => self.rep.group(self.seg, self.group)?,
        };
        self.pos = 0;
        Ok(())
    }

    fn advance_group(&mut self) -> Result<bool> {
        let seg = self.rep.segment(self.seg)?;
        if self.group + 1 < seg.group_count() {
            self.group += 1;
        } else if self.seg + 1 < self.rep.bounds.len() {
            self.seg += 1;
            self.group = 0;
        } else {
            return Ok(false);
        }
        self.load()?;
        Ok(true)
    }

    pub fn next_row(&mut self) -> Result<Option<Row>> {
        Ok(self.next_located()?.map(|(r, _)| r))
    }

    /// The next row with its position.
    pub fn next_located(&mut self) -> Result<Option<(Row, RepPos)>> {
        while self.pos >= self.rows.len() {
            if self.seg >= self.rep.bounds.len() || !self.advance_group()? {
                return Ok(None);
            }
        }
        self.pos += 1;
        let i = self.pos - 1;
        let at = RepPos {
            seg: self.seg as u32,
            group: self.group as u32,
            idx: i as u32,
        };
        // A group nobody else holds (a scan's) gives its rows up.
        let row = match Arc::get_mut(&mut self.rows) {
            Some(rows) => take_row(&mut rows[i]),
            None => self.rows[i].clone(),
        };
        Ok(Some((row, at)))
    }
}

/// Move a row's contents out, leaving empty buffers behind.
fn take_row(r: &mut Row) -> Row {
    Row {
        parent: std::mem::take(&mut r.parent),
        name: std::mem::take(&mut r.name),
        target: r.target.take(),
        ..*r
    }
}

/// Where a row lies in one representation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RepPos {
    pub seg: u32,
    pub group: u32,
    pub idx: u32,
}

/// Where a row of a generation lies: in its base or its delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowPos {
    pub delta: bool,
    pub at: RepPos,
}

/// A row with its position.
pub type Located = (Row, RowPos);

/// A cursor's rows tagged with the representation they come from.
struct Tagged<'a> {
    cursor: Cursor<'a>,
    delta: bool,
}

impl Iterator for Tagged<'_> {
    type Item = Result<Located>;
    fn next(&mut self) -> Option<Result<Located>> {
        let delta = self.delta;
        self.cursor
            .next_located()
            .map(|o| o.map(|(r, at)| (r, RowPos { delta, at })))
            .transpose()
    }
}

/// Children of one directory in name order, from a start name on, served
/// straight from the row ranges of base and delta (no listing is built).
pub struct DirEntries<'a> {
    merge: Merge<Tagged<'a>, Tagged<'a>, Located>,
    dir: Vec<u8>,
    after: Option<Vec<u8>>,
}

impl DirEntries<'_> {
    pub fn next_entry(&mut self) -> Result<Option<Located>> {
        while let Some((row, pos)) = self.merge.next_row()? {
            if row.parent != self.dir {
                return Ok(None);
            }
            if row.name.is_empty() || self.after.as_deref() == Some(&row.name[..]) {
                continue;
            }
            return Ok(Some((row, pos)));
        }
        Ok(None)
    }
}

impl Iterator for DirEntries<'_> {
    type Item = Result<Located>;
    fn next(&mut self) -> Option<Result<Located>> {
        self.next_entry().transpose()
    }
}

impl Iterator for Cursor<'_> {
    type Item = Result<Row>;
    fn next(&mut self) -> Option<Result<Row>> {
        self.next_row().transpose()
    }
}

/// A pinned generation as readers see it: base, optionally plus one delta.
pub struct GenView {
    pub pin: Pin,
    pub base: Representation,
    pub delta: Option<Representation>,
}

impl GenView {
    /// Pin and open `generation` (latest when `None`) of `set`.
    pub fn open(
        store: &Store,
        set: &str,
        generation: Option<u64>,
        holder: &str,
    ) -> Result<GenView> {
        let pin = crate::pin::pin(store, set, generation, holder)?;
        let top = Representation::open(store, &pin.rep.manifest)?;
        check_binding(&pin, &top)?;
        let (base, delta) = match &top.manifest.base {
            None => (top, None),
            Some(b) => {
                let base = Representation::open(store, &b.manifest)?;
                if base.manifest.identity != b.identity
                    || base.manifest.generation != b.generation
                    || base.kind() != RepKind::Base
                {
                    return Err(Error::corrupt(
                        "manifest",
                        &top.manifest_name,
                        "base binding does not match the base manifest",
                    ));
                }
                (base, Some(top))
            }
        };
        Ok(GenView { pin, base, delta })
    }

    pub fn generation(&self) -> u64 {
        self.pin.record.generation
    }

    /// The manifest of the representation this view reads (delta if any).
    pub fn top(&self) -> &Representation {
        self.delta.as_ref().unwrap_or(&self.base)
    }

    /// Resolve a normalized path (`""` is the root).
    pub fn lookup(&self, path: &[u8]) -> Result<Option<Row>> {
        Ok(self.locate(path)?.map(|(r, _)| r))
    }

    /// Resolve a normalized path to its row and position.
    pub fn locate(&self, path: &[u8]) -> Result<Option<Located>> {
        let (parent, name) = split(path);
        if let Some(d) = &self.delta {
            if let Some((r, at)) = d.lookup(&parent, &name)? {
                let pos = RowPos { delta: true, at };
                return Ok((r.kind != Kind::Tombstone).then_some((r, pos)));
            }
        }
        let found = self.base.lookup(&parent, &name)?;
        Ok(found.map(|(r, at)| (r, RowPos { delta: false, at })))
    }

    /// Decode the row group that follows `pos` ahead of need (see
    /// [`Representation::warm_after`]).
    pub fn warm_after(&self, pos: RowPos) {
        match (&self.delta, pos.delta) {
            (Some(d), true) => d.warm_after(pos.at),
            (None, true) => {}
            (_, false) => self.base.warm_after(pos.at),
        }
    }

    /// The row at `pos` (a position this view handed out), if any.
    pub fn row_at(&self, pos: RowPos) -> Result<Option<Row>> {
        match (&self.delta, pos.delta) {
            (Some(d), true) => d.row_at(pos.at),
            (None, true) => Ok(None),
            (_, false) => self.base.row_at(pos.at),
        }
    }

    /// Children of directory `path` in name order, starting after the child
    /// named `after` (from the first child when `None`).
    pub fn dir_entries(&self, path: &[u8], after: Option<&[u8]>) -> Result<DirEntries<'_>> {
        let start = after.unwrap_or(b"");
        let delta = match &self.delta {
            Some(d) => Tagged {
                cursor: d.cursor_at(path, start)?,
                delta: true,
            },
            None => Tagged {
                cursor: self.base.rows_empty(),
                delta: true,
            },
        };
        Ok(DirEntries {
            merge: Merge::new(
                Tagged {
                    cursor: self.base.cursor_at(path, start)?,
                    delta: false,
                },
                delta,
            ),
            dir: path.to_vec(),
            after: after.map(<[u8]>::to_vec),
        })
    }

    /// Visit the children of directory `path` in name order, after the
    /// child named `after` (from the first when `None`), until `f` returns
    /// true. The same entries as [`GenView::dir_entries`]; a view without a
    /// delta lends its cached rows instead of copying each one.
    pub fn visit_dir(
        &self,
        path: &[u8],
        after: Option<&[u8]>,
        mut f: impl FnMut(&Row, RowPos) -> bool,
    ) -> Result<()> {
        if self.delta.is_none() {
            let mut base = |row: &Row, at| f(row, RowPos { delta: false, at });
            return self.base.visit_children(path, after, &mut base);
        }
        for entry in self.dir_entries(path, after)? {
            let (row, pos) = entry?;
            if f(&row, pos) {
                break;
            }
        }
        Ok(())
    }

    /// Children of directory `path`, in name order.
    pub fn list_dir(&self, path: &[u8]) -> Result<Vec<Row>> {
        self.dir_entries(path, None)?
            .map(|r| r.map(|(row, _)| row))
            .collect()
    }

    /// Every live row of the generation in key order.
    pub fn rows(&self) -> Result<Merge<Cursor<'_>, Cursor<'_>, Row>> {
        let delta = match &self.delta {
            Some(d) => d.rows()?,
            None => self.base.rows_empty(),
        };
        Ok(Merge::new(self.base.rows()?, delta))
    }
}

impl Representation {
    fn rows_empty(&self) -> Cursor<'_> {
        Cursor {
            rep: self,
            seg: usize::MAX,
            group: 0,
            rows: Arc::new(Vec::new()),
            pos: 0,
            scan: true,
        }
    }
}

fn check_binding(pin: &Pin, top: &Representation) -> Result<()> {
    let m = &top.manifest;
    if m.set != pin.record.set
        || m.generation != pin.record.generation
        || m.identity != pin.record.identity
        || m.representation != pin.rep.kind
    {
        return Err(Error::corrupt(
            "manifest",
            &top.manifest_name,
            "does not match its index record",
        ));
    }
    Ok(())
}

/// What a merged stream carries: a row, possibly with more.
pub trait HasRow {
    fn row(&self) -> &Row;
}

impl HasRow for Row {
    fn row(&self) -> &Row {
        self
    }
}

impl HasRow for Located {
    fn row(&self) -> &Row {
        &self.0
    }
}

/// Key-order composition of a base stream with a delta stream: a delta row
/// replaces the base row with the same key; a tombstone removes it.
pub struct Merge<B, D, T>
where
    B: Iterator<Item = Result<T>>,
    D: Iterator<Item = Result<T>>,
{
    base: std::iter::Peekable<B>,
    delta: std::iter::Peekable<D>,
}

impl<B, D, T> Merge<B, D, T>
where
    B: Iterator<Item = Result<T>>,
    D: Iterator<Item = Result<T>>,
    T: HasRow,
{
    pub fn new(base: B, delta: D) -> Self {
        Merge {
            base: base.peekable(),
            delta: delta.peekable(),
        }
    }

    pub fn next_row(&mut self) -> Result<Option<T>> {
        loop {
            let order = match (self.base.peek(), self.delta.peek()) {
                (None, None) => return Ok(None),
                (Some(Err(_)), _) => return self.base.next().transpose(),
                (_, Some(Err(_))) => return self.delta.next().transpose(),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(Ok(b)), Some(Ok(d))) => b.row().key_cmp(d.row()),
            };
            if order == Ordering::Less {
                return self.base.next().transpose();
            }
            if order == Ordering::Equal {
                self.base.next();
            }
            let Some(d) = self.delta.next().transpose()? else {
                return Ok(None);
            };
            if d.row().kind != Kind::Tombstone {
                return Ok(Some(d));
            }
        }
    }
}

impl<B, D, T> Iterator for Merge<B, D, T>
where
    B: Iterator<Item = Result<T>>,
    D: Iterator<Item = Result<T>>,
    T: HasRow,
{
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        self.next_row().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn readers_of_one_item_share_one_load() {
        let cache: SlotCache<usize, usize> = Mutex::new(Lru::new(2));
        let loads = AtomicUsize::new(0);
        let load = || {
            loads.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            Ok(7)
        };
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| cached(&cache, 1, load)))
                .collect();
            for r in readers {
                assert_eq!(*r.join().unwrap().unwrap(), 7);
            }
        });
        assert_eq!(loads.load(Ordering::SeqCst), 1, "one load for four readers");
    }

    #[test]
    fn a_failed_load_is_met_by_every_reader_and_evicted_items_load_again() {
        let cache: SlotCache<usize, usize> = Mutex::new(Lru::new(1));
        let fail = || Err(Error::Invalid("no".into()));
        assert!(cached(&cache, 1, fail).is_err());
        assert!(cached(&cache, 1, fail).is_err(), "the error is met again");
        assert_eq!(*cached(&cache, 2, || Ok(2)).unwrap(), 2);
        assert_eq!(*cached(&cache, 1, || Ok(1)).unwrap(), 1, "1 was evicted");
    }

    #[test]
    fn a_failure_that_passes_is_not_kept() {
        let cache: SlotCache<usize, usize> = Mutex::new(Lru::new(4));
        let loads = AtomicUsize::new(0);
        let flaky = || match loads.fetch_add(1, Ordering::SeqCst) {
            0 => Err(Error::Invalid("timeout".into())),
            _ => Ok(7),
        };
        assert!(cached(&cache, 1, flaky).is_err());
        assert_eq!(*cached(&cache, 1, flaky).unwrap(), 7, "loaded anew");
        assert_eq!(*cached(&cache, 1, flaky).unwrap(), 7, "and kept");
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }
}
