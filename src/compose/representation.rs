//! One representation: a manifest and its lazily loaded, verified segments
//! and decoded row groups (cached), and cursors over its rows in key order.

use super::cache::{cached, Lru, SlotCache};
use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, RepKind, MAX_MANIFEST_BYTES};
use crate::format::segment::{Segment, MAX_SEGMENT_BYTES};
use crate::row::{key_cmp, Kind, Row};
use crate::store::{keys, Store};
use std::cmp::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

/// Segments kept parsed in memory per representation (each holds its
/// whole file, about 4 MiB at 65,536 rows). A walk in key order needs the
/// current one and the next. With 8 segments and 32 groups cached, the
/// daemon held 115-122 MiB after walks of a 1M-entry generation; with 4
/// and 16, 53-61 MiB (docs/BENCHMARKS.md, issue 26).
const SEGMENT_CACHE: usize = 4;
/// Decoded row groups kept per representation (about 1.2 MiB each at
/// 4,096 rows): the current ones of 8 concurrent walkers, and more.
const GROUP_CACHE: usize = 16;
/// Row groups decoded ahead of a listing's end ([`Representation::warm_after`]).
const READ_AHEAD_GROUPS: usize = 2;

type Key = (Vec<u8>, Vec<u8>);

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

    /// Drop the cached segments and decoded row groups (an idle mount gives
    /// their memory back; readers load them again as needed).
    pub fn shed(&self) {
        self.segments
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
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
    pub(super) fn visit_children(
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
        meta: r.meta.take(),
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

impl Iterator for Cursor<'_> {
    type Item = Result<Row>;
    fn next(&mut self) -> Option<Result<Row>> {
        self.next_row().transpose()
    }
}

impl Representation {
    pub(super) fn rows_empty(&self) -> Cursor<'_> {
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
