//! The FUSE filesystem: translates kernel requests into reads of pinned
//! generations. No strata logic lives here; every handler resolves a node,
//! asks the core (`GenView::lookup`, `list_dir`, `blob::read`), and maps
//! errors to a deliberate errno, logging the cause. Handler bodies run under
//! `catch_unwind`: a panic becomes EIO and a log line, never a dead mount;
//! locks tolerate poisoning so one caught panic cannot disable the others.
//!
//! Layout: `/<set>/latest -> gens/<N>`, `/<set>/gens/<N>/...`.

use crate::gen::{Gen, Gens};
use crate::node::{ino_of, Inodes, Node};
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata::error::Error;
use strata::format::record::State;
use strata::index::GenIndex;
use strata::row::{join, BlobLoc, Kind, Row};
use strata::store::keys;

/// Generations never change: their entries and attributes live long.
const IMMUTABLE_TTL: Duration = Duration::from_secs(86_400);
/// Synthetic nodes (set list, generation list, `latest`) follow commits.
const LIVE_TTL: Duration = Duration::from_millis(500);

enum Handle {
    /// Kernel passthrough to a standalone blob: the backing id keeps the
    /// kernel's reference alive until release; the file serves stray reads.
    Passthrough { _backing: BackingId, file: File },
    /// A verified standalone blob read with pread (no passthrough).
    File(File),
    /// A packed (small) blob, read and verified at the first `read`: with
    /// FOPEN_KEEP_CACHE a warm open whose pages the kernel holds costs nothing.
    Packed(Arc<LazyBlob>),
    /// A directory listing, built at the first `readdir` and then kept so
    /// offsets stay valid; generation directories are cached by the kernel.
    Dir(Arc<LazyListing>),
}

/// Content of one packed blob, loaded once per open handle.
struct LazyBlob {
    row: Arc<Row>,
    what: String,
    data: OnceLock<Reply<Vec<u8>>>,
}

/// Listing of one directory, built once per open handle.
struct LazyListing {
    node: Node,
    items: OnceLock<Reply<Vec<DirItem>>>,
}

struct DirItem {
    ino: u64,
    kind: FileType,
    name: OsString,
}

/// Live counters the control socket reports.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) inodes: AtomicU64,
    pub(crate) handles: AtomicU64,
    pub(crate) verified: AtomicU64,
}

pub(crate) struct StrataFs {
    stats: Arc<Stats>,
    gens: Arc<Gens>,
    /// Sets served; empty means every set of the store.
    only: Vec<String>,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    passthrough: bool,
    /// Standalone blobs verified in full during this daemon run.
    verified: Mutex<HashSet<[u8; 32]>>,
    uid: u32,
    gid: u32,
    started: SystemTime,
}

type Reply<T> = Result<T, Errno>;

/// Map a core error to an errno, logging what failed.
fn errno(e: &Error, what: &str) -> Errno {
    match e {
        Error::NotFound { .. } => Errno::ENOENT,
        Error::Invalid(_) | Error::TooLarge { .. } => Errno::EINVAL,
        _ => {
            eprintln!("strata-mountd: error: {what}: {}", strata::cli_chain(e));
            Errno::EIO
        }
    }
}

fn guarded<T>(what: &str, f: impl FnOnce() -> Reply<T>) -> Reply<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("strata-mountd: error: {what}: handler panicked; answered EIO");
            Err(Errno::EIO)
        }
    }
}

fn time_of(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

impl StrataFs {
    pub(crate) fn new(gens: Arc<Gens>, only: Vec<String>, stats: Arc<Stats>) -> StrataFs {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        StrataFs {
            stats,
            gens,
            only,
            inodes: Mutex::new(Inodes::default()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            passthrough: false,
            verified: Mutex::new(HashSet::new()),
            uid,
            gid,
            started: SystemTime::now(),
        }
    }

    fn sets(&self) -> Reply<Vec<String>> {
        let all = self
            .gens
            .store()
            .sets()
            .map_err(|e| errno(&e, "list sets"))?;
        Ok(all
            .into_iter()
            .filter(|s| self.only.is_empty() || self.only.contains(s))
            .collect())
    }

    fn node(&self, ino: INodeNo) -> Reply<Node> {
        self.inodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(ino.0)
            .ok_or(Errno::ENOENT)
    }

    fn synthetic_attr(&self, ino: u64, kind: FileType, size: u64) -> FileAttr {
        let perm = if kind == FileType::Symlink {
            0o777
        } else {
            0o555
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn entry_attr(&self, ino: u64, row: &Row) -> FileAttr {
        let t = time_of(row.mtime_ns);
        let kind = file_type(row.kind);
        FileAttr {
            ino: INodeNo(ino),
            size: row.size,
            blocks: row.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: time_of(row.ctime_ns.max(row.mtime_ns)),
            crtime: t,
            kind,
            perm: (row.mode & 0o7777) as u16,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn latest_target(&self, set: &str) -> Reply<Vec<u8>> {
        let g = self
            .gens
            .latest(set)
            .map_err(|e| errno(&e, "resolve latest"))?
            .ok_or(Errno::ENOENT)?;
        Ok(format!("gens/{}", g.generation).into_bytes())
    }

    fn attr(&self, ino: u64, node: &Node) -> Reply<(FileAttr, Duration)> {
        Ok(match node {
            Node::Root | Node::Set(_) | Node::Gens(_) => {
                (self.synthetic_attr(ino, FileType::Directory, 0), LIVE_TTL)
            }
            Node::Latest(s) => {
                let len = self.latest_target(s)?.len() as u64;
                (self.synthetic_attr(ino, FileType::Symlink, len), LIVE_TTL)
            }
            Node::Entry { row, .. } => (self.entry_attr(ino, row), IMMUTABLE_TTL),
        })
    }

    fn generation_root(&self, set: &str, name: &OsStr) -> Reply<Node> {
        let text = name.to_str().ok_or(Errno::ENOENT)?;
        let n: u64 = text.parse().map_err(|_| Errno::ENOENT)?;
        if n.to_string() != text {
            return Err(Errno::ENOENT);
        }
        let gen = self
            .gens
            .get(set, n)
            .map_err(|e| errno(&e, &format!("open {set}@{n}")))?;
        let row = gen
            .view
            .lookup(b"")
            .map_err(|e| errno(&e, &format!("{set}@{n} root")))?
            .ok_or(Errno::ENOENT)?;
        Ok(Node::Entry {
            gen,
            path: Vec::new(),
            row: Arc::new(row),
        })
    }

    fn child(&self, parent: &Node, name: &OsStr) -> Reply<Node> {
        match parent {
            Node::Root => {
                let set = name.to_str().ok_or(Errno::ENOENT)?;
                self.sets()?
                    .iter()
                    .find(|s| *s == set)
                    .map(|s| Node::Set(s.clone()))
                    .ok_or(Errno::ENOENT)
            }
            Node::Set(s) => match name.as_bytes() {
                b"latest" => Ok(Node::Latest(s.clone())),
                b"gens" => Ok(Node::Gens(s.clone())),
                _ => Err(Errno::ENOENT),
            },
            Node::Gens(s) => self.generation_root(s, name),
            Node::Entry { gen, path, row } if row.kind == Kind::Dir => {
                let child_path = join(path, name.as_bytes());
                let what = || {
                    format!(
                        "{}@{} {}",
                        gen.set,
                        gen.generation,
                        strata::row::show(&child_path)
                    )
                };
                let row = gen
                    .view
                    .lookup(&child_path)
                    .map_err(|e| errno(&e, &what()))?
                    .ok_or(Errno::ENOENT)?;
                Ok(Node::Entry {
                    gen: gen.clone(),
                    path: child_path,
                    row: Arc::new(row),
                })
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Reply<(FileAttr, Duration)> {
        let parent = self.node(parent)?;
        let child = self.child(&parent, name)?;
        let (mut attr, ttl) = self.attr(0, &child)?;
        let mut inodes = self.inodes.lock().unwrap_or_else(PoisonError::into_inner);
        attr.ino = INodeNo(inodes.remember(child));
        self.stats
            .inodes
            .store(inodes.len() as u64, Ordering::Relaxed);
        Ok((attr, ttl))
    }

    fn listing(&self, node: &Node) -> Reply<Vec<DirItem>> {
        let item = |n: Node, kind: FileType, name: &[u8]| DirItem {
            ino: ino_of(&n),
            kind,
            name: OsString::from_vec(name.to_vec()),
        };
        Ok(match node {
            Node::Root => self
                .sets()?
                .into_iter()
                .map(|s| item(Node::Set(s.clone()), FileType::Directory, s.as_bytes()))
                .collect(),
            Node::Set(s) => vec![
                item(Node::Latest(s.clone()), FileType::Symlink, b"latest"),
                item(Node::Gens(s.clone()), FileType::Directory, b"gens"),
            ],
            Node::Gens(s) => self.generation_items(s)?,
            Node::Entry { gen, path, row } if row.kind == Kind::Dir => {
                self.entry_items(gen, path)?
            }
            _ => return Err(Errno::ENOTDIR),
        })
    }

    fn generation_items(&self, set: &str) -> Reply<Vec<DirItem>> {
        let all = GenIndex::new(self.gens.store(), set)
            .all()
            .map_err(|e| errno(&e, "list generations"))?;
        Ok(all
            .into_iter()
            .filter(|(_, r)| r.state == State::Committed)
            .map(|(g, _)| DirItem {
                ino: crate::node::entry_ino(set, g, b""),
                kind: FileType::Directory,
                name: OsString::from(g.to_string()),
            })
            .collect())
    }

    fn entry_items(&self, gen: &Arc<Gen>, path: &[u8]) -> Reply<Vec<DirItem>> {
        let what = || format!("{}@{} {}", gen.set, gen.generation, strata::row::show(path));
        let rows = gen.view.list_dir(path).map_err(|e| errno(&e, &what()))?;
        Ok(rows
            .into_iter()
            .map(|r| DirItem {
                ino: crate::node::entry_ino(&gen.set, gen.generation, &r.path()),
                kind: file_type(r.kind),
                name: OsString::from_vec(r.name),
            })
            .collect())
    }

    fn new_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, h);
        self.stats.handles.fetch_add(1, Ordering::Relaxed);
        fh
    }

    /// Forget an open file or directory handle (release / releasedir).
    fn drop_handle(&self, fh: FileHandle) {
        let removed = self
            .handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh.0);
        if removed.is_some() {
            self.stats.handles.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Verify a whole standalone blob once per daemon run.
    fn verify_standalone(&self, file: &File, digest: [u8; 32], what: &str) -> Reply<()> {
        if self
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&digest)
        {
            return Ok(());
        }
        let mut hasher = blake3::Hasher::new();
        let mut reader = file;
        std::io::copy(&mut reader, &mut hasher).map_err(|e| {
            eprintln!("strata-mountd: error: {what}: read blob: {e}");
            Errno::EIO
        })?;
        if hasher.finalize().as_bytes() != &digest {
            eprintln!(
                "strata-mountd: error: {what}: blob {} fails its BLAKE3 check; answered EIO",
                hex::encode(digest)
            );
            return Err(Errno::EIO);
        }
        self.verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest);
        self.stats.verified.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// What `open` decided to do.
enum Opened {
    Passthrough(File),
    Handle(Handle, FopenFlags),
}

impl StrataFs {
    fn do_open(&self, ino: INodeNo, flags: OpenFlags) -> Reply<Opened> {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return Err(Errno::EROFS);
        }
        let Node::Entry { gen, path, row } = self.node(ino)? else {
            return Err(Errno::EISDIR);
        };
        if row.kind != Kind::File {
            return Err(Errno::EISDIR);
        }
        let what = format!(
            "{}@{} {}",
            gen.set,
            gen.generation,
            strata::row::show(&path)
        );
        match (row.blob, row.digest) {
            (BlobLoc::Standalone, Some(digest)) => self.open_standalone(digest, &what),
            _ => {
                let blob = LazyBlob {
                    row,
                    what,
                    data: OnceLock::new(),
                };
                Ok(Opened::Handle(
                    Handle::Packed(Arc::new(blob)),
                    FopenFlags::FOPEN_KEEP_CACHE,
                ))
            }
        }
    }

    fn open_standalone(&self, digest: [u8; 32], what: &str) -> Reply<Opened> {
        let key = keys::blob(&hex::encode(digest));
        let path = self
            .gens
            .store()
            .storage()
            .local_path(&key)
            .ok_or(Errno::EIO)?;
        let file = File::open(&path).map_err(|e| {
            eprintln!(
                "strata-mountd: error: {what}: open blob {}: {e}",
                path.display()
            );
            Errno::EIO
        })?;
        self.verify_standalone(&file, digest, what)?;
        if self.passthrough {
            return Ok(Opened::Passthrough(file));
        }
        Ok(Opened::Handle(
            Handle::File(file),
            FopenFlags::FOPEN_KEEP_CACHE,
        ))
    }

    fn do_read(&self, fh: FileHandle, offset: u64, size: u32) -> Reply<Vec<u8>> {
        let blob = {
            let handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
            match handles.get(&fh.0) {
                Some(Handle::Packed(b)) => b.clone(),
                Some(Handle::File(f)) | Some(Handle::Passthrough { file: f, .. }) => {
                    let mut buf = vec![0u8; size as usize];
                    let n = f.read_at(&mut buf, offset).map_err(Errno::from)?;
                    buf.truncate(n);
                    return Ok(buf);
                }
                _ => return Err(Errno::EBADF),
            }
        };
        let data = blob.data.get_or_init(|| {
            strata::blob::read(self.gens.store(), &blob.row).map_err(|e| errno(&e, &blob.what))
        });
        let b = data.as_ref().map_err(|e| *e)?;
        let start = (offset as usize).min(b.len());
        let end = start.saturating_add(size as usize).min(b.len());
        Ok(b[start..end].to_vec())
    }
}

impl Filesystem for StrataFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough = true;
        }
        let _ = config.set_max_readahead(1 << 20);
        // Cache symlink targets: `latest` is invalidated by the refresher when it moves.
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        eprintln!(
            "strata-mountd: kernel passthrough {}",
            if self.passthrough {
                "on"
            } else {
                "unavailable; serving reads"
            }
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match guarded("lookup", || self.do_lookup(parent, name)) {
            Ok((attr, ttl)) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut inodes = self.inodes.lock().unwrap_or_else(PoisonError::into_inner);
        inodes.forget(ino.0, nlookup);
        self.stats
            .inodes
            .store(inodes.len() as u64, Ordering::Relaxed);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match guarded("getattr", || {
            self.node(ino).and_then(|n| self.attr(ino.0, &n))
        }) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = guarded("readlink", || match self.node(ino)? {
            Node::Latest(s) => self.latest_target(&s),
            Node::Entry { row, .. } if row.kind == Kind::Symlink => {
                row.target.clone().ok_or(Errno::EIO)
            }
            _ => Err(Errno::EINVAL),
        });
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match guarded("open", || self.do_open(ino, flags)) {
            Ok(Opened::Passthrough(file)) => match reply.open_backing(&file) {
                Ok(id) => {
                    let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                    self.stats.handles.fetch_add(1, Ordering::Relaxed);
                    let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
                    let h = handles
                        .entry(fh)
                        .or_insert(Handle::Passthrough { _backing: id, file });
                    let Handle::Passthrough { _backing: id, .. } = h else {
                        unreachable!("just inserted")
                    };
                    reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), id);
                }
                Err(e) => {
                    eprintln!("strata-mountd: warning: passthrough refused ({e}); serving reads for this file");
                    let fh = self.new_handle(Handle::File(file));
                    reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
                }
            },
            Ok(Opened::Handle(h, flags)) => reply.opened(FileHandle(self.new_handle(h)), flags),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match guarded("read", || self.do_read(fh, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.drop_handle(fh);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match guarded("opendir", || self.node(ino)) {
            Ok(node) => {
                // Generation directories never change: let the kernel keep their listings.
                let immutable = matches!(node, Node::Entry { .. });
                let flags = if immutable {
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR
                } else {
                    FopenFlags::empty()
                };
                let listing = LazyListing {
                    node,
                    items: OnceLock::new(),
                };
                reply.opened(
                    FileHandle(self.new_handle(Handle::Dir(Arc::new(listing)))),
                    flags,
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = match self
            .handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fh.0)
        {
            Some(Handle::Dir(l)) => l.clone(),
            _ => return reply.error(Errno::EBADF),
        };
        let items = listing
            .items
            .get_or_init(|| guarded("readdir", || self.listing(&listing.node)));
        let items = match items {
            Ok(items) => items,
            Err(e) => return reply.error(*e),
        };
        // The kernel resolves `..` itself; the parent is not tracked, so both
        // dot entries carry this directory's number (informational only).
        let dots = [(ino.0, "."), (ino.0, "..")];
        let total = items.len() as u64 + 2;
        for i in offset..total {
            let full = match i {
                0 | 1 => reply.add(
                    INodeNo(dots[i as usize].0),
                    i + 1,
                    FileType::Directory,
                    dots[i as usize].1,
                ),
                _ => {
                    let it = &items[(i - 2) as usize];
                    reply.add(INodeNo(it.ino), i + 1, it.kind, &it.name)
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.drop_handle(fh);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(
            0,
            0,
            0,
            self.inodes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len() as u64,
            0,
            4096,
            255,
            4096,
        );
    }
}
