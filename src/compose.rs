//! Reading a generation: a representation's segments, and the composition of
//! a base with one cumulative delta.
//!
//! Offers what every reader needs without knowing about FUSE: resolve a path,
//! list a directory range, stream all rows in key order. Segments are loaded
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
use std::sync::{Arc, Mutex};

/// Segments kept parsed in memory per representation.
const SEGMENT_CACHE: usize = 4;
/// Decoded row groups kept per representation.
const GROUP_CACHE: usize = 32;

type Key = (Vec<u8>, Vec<u8>);
/// Decoded row groups by (segment, group).
type GroupCache = Lru<(usize, usize), Arc<Vec<Row>>>;

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
}

/// Load and verify a manifest by name.
pub fn load_manifest(store: &Store, name: &str) -> Result<Manifest> {
    let bytes = store
        .storage()
        .get(&keys::manifest(name), MAX_MANIFEST_BYTES)?;
    Manifest::decode(name, &bytes)
}

/// Load and verify a segment by name, checking its size against the manifest.
pub fn load_segment(store: &Store, name: &str, size: u64) -> Result<Segment> {
    let bytes = store
        .storage()
        .get(&keys::segment(name), MAX_SEGMENT_BYTES)?;
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
    Segment::parse(name, bytes)
}

/// One representation: a manifest and its segments.
pub struct Representation {
    store: Store,
    pub manifest_name: String,
    pub manifest: Manifest,
    bounds: Vec<(Key, Key)>,
    segments: Mutex<Lru<usize, Arc<Segment>>>,
    groups: Mutex<GroupCache>,
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
        if let Some(s) = self.segments.lock().expect("segment cache").get(&i) {
            return Ok(s);
        }
        let r = &self.manifest.segments[i];
        let seg = Arc::new(load_segment(&self.store, &r.name, r.size)?);
        if seg.rows() != r.rows {
            return Err(Error::corrupt(
                "segment",
                &r.name,
                "row count differs from manifest",
            ));
        }
        self.segments
            .lock()
            .expect("segment cache")
            .put(i, seg.clone());
        Ok(seg)
    }

    fn group(&self, seg: usize, group: usize) -> Result<Arc<Vec<Row>>> {
        if let Some(g) = self.groups.lock().expect("group cache").get(&(seg, group)) {
            return Ok(g);
        }
        let rows = Arc::new(self.segment(seg)?.read_group(group)?);
        self.check_bounds(seg, group, &rows)?;
        self.groups
            .lock()
            .expect("group cache")
            .put((seg, group), rows.clone());
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

    pub fn lookup(&self, parent: &[u8], name: &[u8]) -> Result<Option<Row>> {
        let mut cursor = self.cursor_at(parent, name)?;
        match cursor.next_row()? {
            Some(r) if r.parent == parent && r.name == name => Ok(Some(r)),
            _ => Ok(None),
        }
    }

    /// Rows whose parent is `dir`, in name order.
    pub fn list_dir(&self, dir: &[u8]) -> Result<Vec<Row>> {
        let mut cursor = self.cursor_at(dir, b"")?;
        let mut out = Vec::new();
        while let Some(r) = cursor.next_row()? {
            if r.parent != dir {
                break;
            }
            if !r.name.is_empty() {
                out.push(r);
            }
        }
        Ok(out)
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

    /// Every row in key order.
    pub fn rows(&self) -> Result<Cursor<'_>> {
        let mut c = Cursor {
            rep: self,
            seg: 0,
            group: 0,
            rows: Arc::new(Vec::new()),
            pos: 0,
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
}

impl Cursor<'_> {
    fn load(&mut self) -> Result<()> {
        self.rows = self.rep.group(self.seg, self.group)?;
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
        while self.pos >= self.rows.len() {
            if self.seg >= self.rep.bounds.len() || !self.advance_group()? {
                return Ok(None);
            }
        }
        self.pos += 1;
        Ok(Some(self.rows[self.pos - 1].clone()))
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
        let (parent, name) = split(path);
        if let Some(d) = &self.delta {
            if let Some(r) = d.lookup(&parent, &name)? {
                return Ok((r.kind != Kind::Tombstone).then_some(r));
            }
        }
        self.base.lookup(&parent, &name)
    }

    /// Children of directory `path`, in name order.
    pub fn list_dir(&self, path: &[u8]) -> Result<Vec<Row>> {
        let base = self.base.list_dir(path)?;
        let Some(d) = &self.delta else {
            return Ok(base);
        };
        let mut out = Vec::with_capacity(base.len());
        let mut merged = Merge::new(
            base.into_iter().map(Ok),
            d.list_dir(path)?.into_iter().map(Ok),
        );
        while let Some(r) = merged.next_row()? {
            out.push(r);
        }
        Ok(out)
    }

    /// Every live row of the generation in key order.
    pub fn rows(&self) -> Result<Merge<Cursor<'_>, Cursor<'_>>> {
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

/// Key-order composition of a base stream with a delta stream: a delta row
/// replaces the base row with the same key; a tombstone removes it.
pub struct Merge<B: Iterator<Item = Result<Row>>, D: Iterator<Item = Result<Row>>> {
    base: std::iter::Peekable<B>,
    delta: std::iter::Peekable<D>,
}

impl<B: Iterator<Item = Result<Row>>, D: Iterator<Item = Result<Row>>> Merge<B, D> {
    pub fn new(base: B, delta: D) -> Self {
        Merge {
            base: base.peekable(),
            delta: delta.peekable(),
        }
    }

    pub fn next_row(&mut self) -> Result<Option<Row>> {
        loop {
            let order = match (self.base.peek(), self.delta.peek()) {
                (None, None) => return Ok(None),
                (Some(Err(_)), _) => return self.base.next().transpose(),
                (_, Some(Err(_))) => return self.delta.next().transpose(),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(Ok(b)), Some(Ok(d))) => b.key_cmp(d),
            };
            if order == Ordering::Less {
                return self.base.next().transpose();
            }
            if order == Ordering::Equal {
                self.base.next();
            }
            let d = self.delta.next().transpose()?.expect("peeked");
            if d.kind != Kind::Tombstone {
                return Ok(Some(d));
            }
        }
    }
}

impl<B: Iterator<Item = Result<Row>>, D: Iterator<Item = Result<Row>>> Iterator for Merge<B, D> {
    type Item = Result<Row>;
    fn next(&mut self) -> Option<Result<Row>> {
        self.next_row().transpose()
    }
}
