//! The walk: observes the covered scope of a directory without following
//! symlinks and compares it, directory by directory, with the parent
//! generation's rows. Everything below the directory is opened, listed and
//! stat'ed through [`Beneath`], so nothing outside it is ever read.
//!
//! Directories are visited in key order (a min-heap of directory paths), so
//! the parent's rows are read sequentially. Unchanged files (same size,
//! mtime ns, inode, ctime ns and mode) produce nothing; changed or new files
//! become hash jobs; directories, symlinks and removals become journal rows.

use super::beneath::Beneath;
use super::{Scope, WalkStats};
use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::row::{check_path_len, join, split, BlobLoc, Kind, Meta, Row};
use crossbeam_channel::{bounded, Sender};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Timestamp granularity margin: a file modified this close to (or after)
/// the moment the parent generation's walk started may have changed again
/// within the same timestamp tick, so its stat cannot prove it unchanged.
/// 100 ms covers jiffy-granular kernel clocks; see docs/FORMAT.md.
pub(crate) const RACY_MARGIN_NS: i64 = 100_000_000;

/// Listings the lister may run ahead of the walker.
const LISTING_QUEUE: usize = 64;

/// One directory as listed: entries sorted by name, each stat'ed relative
/// to the open directory (`statx(dirfd, name, AT_SYMLINK_NOFOLLOW)`).
pub(crate) struct Listing {
    dir: Vec<u8>,
    entries: io::Result<Vec<(Vec<u8>, io::Result<Metadata>)>>,
}

fn list_one(root: &Beneath, dir: &[u8]) -> Listing {
    let entries = root.read_dir(dir).and_then(|rd| {
        let mut names = rd
            .map(|e| e.map(|e| (e.file_name().as_bytes().to_vec(), e)))
            .collect::<io::Result<Vec<_>>>()?;
        names.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(names.into_iter().map(|(n, e)| (n, e.metadata())).collect())
    });
    Listing {
        dir: dir.to_vec(),
        entries,
    }
}

/// The lister: reads and stats directories in key order (a min-heap of
/// paths, so the walker meets the parent's rows sequentially), running on its
/// own thread ahead of the walker. It descends exactly where the walker
/// records a directory: a directory entry whose path is within limits.
fn list_tree(root: &Beneath, seeds: Vec<Vec<u8>>, tx: Sender<Listing>) {
    let mut heap: BinaryHeap<Reverse<Vec<u8>>> = seeds.into_iter().map(Reverse).collect();
    while let Some(Reverse(dir)) = heap.pop() {
        let listing = list_one(root, &dir);
        if let Ok(entries) = &listing.entries {
            for (name, md) in entries {
                let child = join(&dir, name);
                if md.as_ref().is_ok_and(|m| m.is_dir()) && check_path_len(&child).is_ok() {
                    heap.push(Reverse(child));
                }
            }
        }
        if tx.send(listing).is_err() {
            return;
        }
    }
}

/// Whether a directory, symlink or special file kept the metadata the walk
/// compares (mode, mtime, ctime, owner, link count, device number). An
/// attribute change moves ctime, so equal ctimes spare reading attributes.
fn same_meta(prev: &Row, row: &Row) -> bool {
    prev.mode == row.mode
        && prev.mtime_ns == row.mtime_ns
        && prev.ctime_ns == row.ctime_ns
        && (prev.uid, prev.gid) == (row.uid, row.gid)
        && (prev.meta().link, prev.meta().nlink, prev.meta().rdev)
            == (row.meta().link, row.meta().nlink, row.meta().rdev)
}

/// The kind an entry of file type `ft` is stored as.
fn kind_of(ft: &fs::FileType) -> Kind {
    if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_socket() {
        Kind::Socket
    } else if ft.is_char_device() {
        Kind::CharDev
    } else {
        Kind::BlockDev
    }
}

/// A link group key for the source inode `(dev, ino)`: nonzero, and the
/// same for every name of that inode in one walk.
fn link_key(dev: u64, ino: u64) -> u64 {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&dev.to_le_bytes());
    key[8..].copy_from_slice(&ino.to_le_bytes());
    let h = blake3::hash(&key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(first) | 1
}

/// Link group and device number as a stat shows them (attributes are read
/// separately, only for rows the walk emits).
fn stat_meta(md: &Metadata, kind: Kind) -> Meta {
    let linked = kind != Kind::Dir && md.nlink() > 1;
    let device = matches!(kind, Kind::CharDev | Kind::BlockDev);
    Meta {
        link: if linked {
            link_key(md.dev(), md.ino())
        } else {
            0
        },
        nlink: if linked {
            u32::try_from(md.nlink()).unwrap_or(u32::MAX)
        } else {
            0
        },
        rdev: if device { md.rdev() } else { 0 },
        xattrs: Vec::new(),
    }
}

/// Add the extended attributes read by `read` to `row`'s metadata.
pub(crate) fn with_xattrs(row: &mut Row, attrs: Vec<crate::xattr::Attr>) -> Result<()> {
    let xattrs = crate::format::xattrs::encode(attrs)?;
    let mut meta = row.meta.take().map(|m| *m).unwrap_or_default();
    meta.xattrs = xattrs;
    row.meta = meta.boxed();
    Ok(())
}

/// A file the walk found new or changed, for the hash workers.
pub(crate) struct HashJob {
    pub row: Row,
    /// For messages only: the file is opened through `root`.
    pub abs: PathBuf,
    pub root: Arc<Beneath>,
    pub prev: Option<Row>,
}

/// What the walk hands to ingest.
// Both variants are moved exactly once, from the walk into a channel or a
// hash job; boxing either would cost an allocation per entry for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Event {
    /// A finished row (directory, symlink, tombstone) for the journal.
    Row(Row),
    /// A file whose content must be read; `row` carries the walk's stat.
    Hash(HashJob),
}

pub(crate) struct Walker<'a> {
    root: PathBuf,
    beneath: Arc<Beneath>,
    parent: Option<&'a GenView>,
    generation: u64,
    emit: &'a mut dyn FnMut(Event) -> Result<()>,
    pub stats: WalkStats,
    /// Parent rows whose mtime or ctime is not before this are re-hashed.
    racy_from_ns: i64,
    /// Live count of observed entries, for progress display.
    walked: &'a AtomicU64,
    /// Directories to walk, found while observing the start paths.
    seeds: Vec<Vec<u8>>,
    /// A dead attempt's journal rows, reused for files whose stat matches.
    pub hints: Option<&'a super::resume::Hints>,
    /// The parent was committed before rows carried metadata: entries its
    /// stat finds unchanged have their metadata read and compared too.
    catch_up: bool,
}

pub(crate) fn stat_row(parent: Vec<u8>, name: Vec<u8>, md: &Metadata, kind: Kind) -> Row {
    Row {
        parent,
        name,
        kind,
        mode: md.mode() & 0o7777,
        size: if kind == Kind::File { md.size() } else { 0 },
        mtime_ns: md
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(md.mtime_nsec()),
        digest: None,
        blob: BlobLoc::None,
        target: None,
        first_gen: 0,
        changed_gen: 0,
        ino: md.ino(),
        ctime_ns: md
            .ctime()
            .saturating_mul(1_000_000_000)
            .saturating_add(md.ctime_nsec()),
        uid: md.uid(),
        gid: md.gid(),
        meta: stat_meta(md, kind).boxed(),
    }
}

impl<'a> Walker<'a> {
    pub(crate) fn new(
        root: &Path,
        beneath: Arc<Beneath>,
        parent: Option<&'a GenView>,
        generation: u64,
        emit: &'a mut dyn FnMut(Event) -> Result<()>,
        walked: &'a AtomicU64,
    ) -> Walker<'a> {
        let racy_from_ns = parent.map_or(i64::MIN, |p| {
            p.top().manifest.observed_ns.saturating_sub(RACY_MARGIN_NS)
        });
        Walker {
            walked,
            racy_from_ns,
            root: root.to_path_buf(),
            beneath,
            parent,
            generation,
            emit,
            stats: WalkStats::default(),
            seeds: Vec::new(),
            hints: None,
            catch_up: parent.is_some_and(|p| !p.top().manifest.metadata),
        }
    }

    fn abs(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(OsStr::from_bytes(rel))
        }
    }

    fn problem(&mut self, rel: &[u8], what: &str, e: &dyn std::fmt::Display) {
        self.stats
            .problems
            .push(format!("{}: {what}: {e}", crate::row::show(rel)));
    }

    fn prev(&self, rel: &[u8]) -> Result<Option<Row>> {
        match self.parent {
            Some(p) => p.lookup(rel),
            None => Ok(None),
        }
    }

    pub(crate) fn run(&mut self, scope: &Scope) -> Result<()> {
        match scope {
            Scope::Whole => self.start_path(b"")?,
            Scope::Paths(paths) => self.start_paths(paths)?,
        }
        let seeds = std::mem::take(&mut self.seeds);
        let root = self.beneath.clone();
        let (tx, rx) = bounded::<Listing>(LISTING_QUEUE);
        std::thread::scope(|s| {
            s.spawn(move || list_tree(&root, seeds, tx));
            for listing in rx {
                self.walk_listing(listing)?;
            }
            Ok(())
        })
    }

    fn start_paths(&mut self, paths: &[Vec<u8>]) -> Result<()> {
        // Ancestor path -> whether it is a directory on disk.
        let mut ancestors: HashMap<Vec<u8>, bool> = HashMap::new();
        for p in paths {
            let mut reachable = true;
            for a in ancestors_of(p) {
                let is_dir = match ancestors.get(&a) {
                    Some(&d) => d,
                    None => {
                        let d = self.observe_ancestor(&a)?;
                        ancestors.insert(a, d);
                        d
                    }
                };
                if !is_dir {
                    reachable = false;
                    break;
                }
            }
            if reachable {
                self.start_path(p)?;
            }
        }
        Ok(())
    }

    /// Observe an ancestor of a covered path; false if it is not a directory
    /// on disk (then nothing below it can be observed).
    fn observe_ancestor(&mut self, rel: &[u8]) -> Result<bool> {
        let prev = self.prev(rel)?;
        match self.beneath.lstat(rel) {
            Ok(md) => {
                let is_dir = md.is_dir();
                let (parent, name) = split(rel);
                self.observe(parent, name, &md, prev)?;
                Ok(is_dir)
            }
            Err(e) if gone(&e) => {
                self.emit_removal(rel, prev)?;
                Ok(false)
            }
            Err(e) => {
                self.problem(rel, "cannot stat", &e);
                Ok(false)
            }
        }
    }

    fn start_path(&mut self, rel: &[u8]) -> Result<()> {
        let prev = self.prev(rel)?;
        match self.beneath.lstat(rel) {
            Ok(md) => {
                let (parent, name) = split(rel);
                if self.observe(parent, name, &md, prev)? {
                    self.seeds.push(rel.to_vec());
                }
                Ok(())
            }
            Err(e) if gone(&e) && !rel.is_empty() => self.emit_removal(rel, prev),
            Err(e) => {
                self.problem(rel, "cannot stat", &e);
                Ok(())
            }
        }
    }

    fn emit_removal(&mut self, rel: &[u8], prev: Option<Row>) -> Result<()> {
        if prev.is_some() {
            let (parent, name) = split(rel);
            (self.emit)(Event::Row(Row::tombstone(parent, name)))?;
        }
        Ok(())
    }

    fn walk_listing(&mut self, listing: Listing) -> Result<()> {
        let dir = listing.dir;
        let entries = match listing.entries {
            Ok(e) => e,
            Err(e) => {
                self.problem(&dir, "cannot list directory", &e);
                return Ok(());
            }
        };
        let prev = match self.parent {
            Some(p) => p.list_dir(&dir)?,
            None => Vec::new(),
        };
        let mut prev = prev.into_iter().peekable();
        for (name, md) in entries {
            while let Some(p) = prev.next_if(|p| p.name < name) {
                (self.emit)(Event::Row(Row::tombstone(p.parent, p.name)))?;
            }
            let old = prev.next_if(|p| p.name == name);
            self.visit(&dir, name, md, old)?;
        }
        for p in prev {
            (self.emit)(Event::Row(Row::tombstone(p.parent, p.name)))?;
        }
        Ok(())
    }

    fn visit(
        &mut self,
        dir: &[u8],
        name: Vec<u8>,
        md: io::Result<Metadata>,
        old: Option<Row>,
    ) -> Result<()> {
        let rel = join(dir, &name);
        if let Err(e) = check_path_len(&rel).and_then(|()| crate::row::check_name(&name, &rel)) {
            self.problem(&rel, "refused", &e);
            return Ok(());
        }
        match md {
            Ok(md) => {
                self.observe(dir.to_vec(), name, &md, old)?;
            }
            Err(e) => self.problem(&rel, "vanished or unreadable during walk", &e),
        }
        Ok(())
    }

    /// Classify one entry; true if it is a directory to descend into.
    fn observe(
        &mut self,
        parent: Vec<u8>,
        name: Vec<u8>,
        md: &Metadata,
        prev: Option<Row>,
    ) -> Result<bool> {
        self.stats.entries += 1;
        self.walked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let kind = kind_of(&md.file_type());
        let mut row = stat_row(parent, name, md, kind);
        row.first_gen = prev
            .as_ref()
            .filter(|p| p.kind == kind)
            .map_or(self.generation, |p| p.first_gen);
        row.changed_gen = self.generation;
        match kind {
            Kind::File => self.observe_file(row, prev)?,
            Kind::Symlink => self.observe_symlink(row, prev)?,
            _ => self.observe_other(row, prev)?,
        }
        Ok(kind == Kind::Dir)
    }

    fn observe_file(&mut self, mut row: Row, prev: Option<Row>) -> Result<()> {
        if let Some(p) = &prev {
            if stat_proves_unchanged(p, &row, self.racy_from_ns) {
                if !self.meta_caught_up(&mut row, p) {
                    // Same content; the metadata the parent never recorded.
                    row.digest = p.digest;
                    row.blob = p.blob;
                    return (self.emit)(Event::Row(row));
                }
                self.stats.unchanged_files += 1;
                return Ok(());
            }
        }
        if let Some(hint) = self.hints.and_then(|h| h.reuse(&row)) {
            row.digest = hint.digest;
            row.blob = hint.blob;
            row.meta = hint.meta.clone();
            self.stats.reused += 1;
            return (self.emit)(Event::Row(row));
        }
        let abs = self.abs(&row.path());
        let root = self.beneath.clone();
        (self.emit)(Event::Hash(HashJob {
            row,
            abs,
            root,
            prev,
        }))
    }

    fn observe_symlink(&mut self, mut row: Row, prev: Option<Row>) -> Result<()> {
        let target = match self.beneath.read_link(&row.path()) {
            Ok(t) => t.into_os_string().into_vec(),
            Err(e) => {
                self.problem(&row.path(), "cannot read link", &e);
                return Ok(());
            }
        };
        if target.len() > crate::row::MAX_PATH {
            self.problem(
                &row.path(),
                "refused",
                &Error::TooLarge {
                    what: "link target",
                    size: target.len() as u64,
                    limit: crate::row::MAX_PATH as u64,
                },
            );
            return Ok(());
        }
        row.size = target.len() as u64;
        row.target = Some(target);
        let same = prev.as_ref().is_some_and(|p| {
            p.kind == Kind::Symlink && p.target == row.target && same_meta(p, &row)
        });
        self.emit_if_changed(row, prev.as_ref().filter(|_| same))
    }

    /// A directory, FIFO, socket or device node: a row when its metadata
    /// changed.
    fn observe_other(&mut self, row: Row, prev: Option<Row>) -> Result<()> {
        let same = prev
            .as_ref()
            .is_some_and(|p| p.kind == row.kind && same_meta(p, &row));
        if row.kind.is_special() {
            self.stats.special += 1;
        }
        self.emit_if_changed(row, prev.as_ref().filter(|_| same))
    }

    /// Emit `row` (with its attributes) unless `same`, the parent's row,
    /// already holds it, metadata included.
    fn emit_if_changed(&mut self, mut row: Row, same: Option<&Row>) -> Result<()> {
        match same {
            None => self.emit_with_xattrs(row),
            Some(p) if !self.meta_caught_up(&mut row, p) => (self.emit)(Event::Row(row)),
            Some(_) => Ok(()),
        }
    }

    /// Whether parent row `prev` holds `row`'s metadata. Only a catch-up
    /// walk asks (reading `row`'s attributes into it); otherwise a stat
    /// that proves the entry unchanged proves its metadata unchanged too.
    /// Attributes that cannot be read are a problem, and the parent's row
    /// stands.
    fn meta_caught_up(&mut self, row: &mut Row, prev: &Row) -> bool {
        if !self.catch_up {
            return true;
        }
        let path = row.path();
        let read = self
            .beneath
            .xattrs(&path)
            .map_err(|e| Error::io("read extended attributes", self.abs(&path), e))
            .and_then(|attrs| with_xattrs(row, attrs));
        match read {
            Ok(()) => row.meta() == prev.meta(),
            Err(e) => {
                self.problem(&path, "refused", &e);
                true
            }
        }
    }

    /// Emit `row` with its extended attributes; an entry whose attributes
    /// cannot be read or are over the limits is a problem, not a row.
    fn emit_with_xattrs(&mut self, mut row: Row) -> Result<()> {
        let path = row.path();
        let read = self
            .beneath
            .xattrs(&path)
            .map_err(|e| Error::io("read extended attributes", self.abs(&path), e))
            .and_then(|attrs| with_xattrs(&mut row, attrs));
        match read {
            Ok(()) => (self.emit)(Event::Row(row)),
            Err(e) if row.kind == Kind::Dir && path.is_empty() => Err(e),
            Err(e) => {
                self.problem(&path, "refused", &e);
                Ok(())
            }
        }
    }
}

use std::os::unix::ffi::OsStringExt;

/// True when the walk's stat proves a file equals its parent row: same
/// kind, size, mtime ns, inode, ctime ns, mode and owner, and the parent row was
/// settled (not modified within the racy margin of the parent's walk).
pub(crate) fn stat_proves_unchanged(prev: &Row, now: &Row, racy_from_ns: i64) -> bool {
    let settled = prev.mtime_ns.max(prev.ctime_ns) < racy_from_ns;
    settled
        && prev.kind == Kind::File
        && prev.size == now.size
        && prev.mtime_ns == now.mtime_ns
        && prev.ino == now.ino
        && prev.ctime_ns == now.ctime_ns
        && prev.mode == now.mode
        && (prev.uid, prev.gid) == (now.uid, now.gid)
}

fn gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// Strict ancestors of a path, root first (`""`, `a`, `a/b` for `a/b/c`).
fn ancestors_of(path: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![Vec::new()];
    for (i, &b) in path.iter().enumerate() {
        if b == b'/' {
            out.push(path[..i].to_vec());
        }
    }
    if path.is_empty() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(mtime: i64, ctime: i64) -> Row {
        let mut r = Row::tombstone(Vec::new(), b"f".to_vec());
        r.kind = Kind::File;
        r.size = 16;
        r.mtime_ns = mtime;
        r.ctime_ns = ctime;
        r.ino = 7;
        r
    }

    #[test]
    fn settled_identical_stat_proves_unchanged() {
        let parent_walk = 10_000_000_000;
        let prev = file(1_000, 2_000);
        assert!(stat_proves_unchanged(
            &prev,
            &prev.clone(),
            parent_walk - RACY_MARGIN_NS
        ));
    }

    #[test]
    fn a_file_touched_near_the_parent_walk_is_never_trusted() {
        let parent_walk = 10_000_000_000;
        let racy_from = parent_walk - RACY_MARGIN_NS;
        for t in [racy_from, parent_walk - 1, parent_walk, parent_walk + 5] {
            let prev = file(t - 3, t);
            assert!(
                !stat_proves_unchanged(&prev, &prev.clone(), racy_from),
                "ctime={t}"
            );
            let prev = file(t, 0);
            assert!(
                !stat_proves_unchanged(&prev, &prev.clone(), racy_from),
                "mtime={t}"
            );
        }
    }

    #[test]
    fn any_stat_difference_means_rehash() {
        let prev = file(1_000, 2_000);
        let mut now = prev.clone();
        now.ino = 8;
        assert!(!stat_proves_unchanged(&prev, &now, i64::MAX));
    }

    #[test]
    fn ancestors_are_listed_root_first() {
        assert_eq!(
            ancestors_of(b"a/b/c"),
            vec![b"".to_vec(), b"a".to_vec(), b"a/b".to_vec()]
        );
        assert_eq!(ancestors_of(b"top"), vec![b"".to_vec()]);
        assert!(ancestors_of(b"").is_empty());
    }
}
