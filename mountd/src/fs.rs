//! The FUSE filesystem: adapts kernel requests to the mount's virtual tree
//! (`strata::mount_tree`: the layout, its resolution, synthetic listings
//! and their stamps, attributes, the blob verification policy). What lives
//! here is what only FUSE needs: inode numbers (node.rs), directory offsets
//! of generation directories, replies and their TTLs, open handles,
//! passthrough, the listing caches (listing_cache.rs, stat_habits.rs,
//! synthetic_listing.rs) and the read-ahead thread.
//!
//! Errors: ENOENT means only "no such name" (`TreeError::NotFound`); an
//! error from the core is mapped by its kind (`errno`), so a missing pack,
//! blob or segment of a generation being served is EIO, never ENOENT.
//! Every EIO is logged once, with what was being served (set, generation,
//! path) and the object that failed. Handler bodies run under
//! `catch_unwind`: a panic becomes EIO and a log line, never a dead mount;
//! locks tolerate poisoning so one caught panic cannot disable the others.
//!
//! Generation directories are listed straight from row ranges: a directory
//! offset is the position of the last entry served, so `readdir` resumes
//! (and `seekdir` seeks) without any listing kept per open directory.
//! `readdirplus` answers attributes with the names, counting each entry as a
//! kernel lookup in its generation's slot (node.rs).

use crate::gen::{Gen, Gens};
use crate::inode_reads::InodeReads;
use crate::listing_cache::ListingCache;
use crate::node::{
    dir_offset, ino_of, is_entry, offset_pos, pack_pos, slot_base, Inodes, Node, Resolved,
};
use crate::push_ahead::PushAhead;
use crate::read_ahead::ReadAhead;
use crate::stat_habits::StatHabits;
use crate::synthetic_listing::Snapshots;
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyXattr, Request,
};
use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime};
use strata::chunks::ChunkedReader;
use strata::compose::RowPos;
use strata::error::{Error, ErrorKind};
use strata::mount_tree::assembled::Assembled;
use strata::mount_tree::layout::describe;
use strata::mount_tree::listing::{items_from, DOTS};
use strata::mount_tree::{
    Attrs, Dir, DirItem, NodeKind, OpenedBlob, Tree, TreeError, Verifier, VerifyCounts,
    VerifyPolicy,
};
use strata::row::{BlobLoc, Kind, Row};
use strata::storage::pieces::Pieces;
use tracing::{error, info, warn};

/// Generations never change: their entries and attributes live long.
const IMMUTABLE_TTL: Duration = Duration::from_secs(86_400);
/// Synthetic nodes (set list, generation list, `latest`, tags) follow commits.
const LIVE_TTL: Duration = Duration::from_millis(500);
/// `st_blksize` of directories (see [`blksize`]).
const DIR_BLKSIZE: u32 = 256 << 10;

/// When standalone blobs are hashed in full before they are served
/// (`--verify`; the policy is `strata::mount_tree::VerifyPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum VerifyMode {
    /// At the first open of each blob in this daemon run.
    FirstOpen,
    /// At every open.
    Always,
    /// Never (packed blobs are still checked: decoding includes the check).
    Off,
}

impl From<VerifyMode> for VerifyPolicy {
    fn from(m: VerifyMode) -> VerifyPolicy {
        match m {
            VerifyMode::FirstOpen => VerifyPolicy::FirstOpen,
            VerifyMode::Always => VerifyPolicy::Always,
            VerifyMode::Off => VerifyPolicy::Off,
        }
    }
}

/// How files are opened (`--opens`). With `None` the daemon answers the
/// first `open` ENOSYS (FUSE no-open): the kernel then opens every file
/// itself, sends no `open` or `release`, keeps pages across opens, and its
/// reads name only the inode (inode_reads.rs keeps the state they need).
/// The choice is the kernel's per connection, so it excludes passthrough.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OpenMode {
    /// The kernel opens files itself; every read goes through the daemon.
    None,
    /// Every open reaches the daemon; large local files are read by kernel
    /// passthrough.
    Each,
}

pub(crate) enum Handle {
    /// Kernel passthrough to a standalone blob: the backing id (shared by
    /// every open of the same blob) keeps the kernel's reference alive until
    /// the last release; the file serves stray reads.
    Passthrough {
        _backing: Arc<BackingId>,
        file: File,
    },
    /// A verified standalone blob read with pread (no passthrough).
    File(File),
    /// A standalone blob of a remote store too large for its local cache,
    /// read with ranged GETs, each piece checked against the blob's verified
    /// BLAKE3 tree (`None`: verification is off).
    Remote {
        key: String,
        size: u64,
        pieces: Option<Arc<Pieces>>,
        /// Set, generation and path, for the log.
        what: String,
    },
    /// A chunked file not (yet) assembled, read chunk by chunk, each
    /// verified.
    Chunked {
        reader: Arc<ChunkedReader>,
        /// Set, generation and path, for the log.
        what: String,
    },
    /// A packed (small) blob, read and verified at the first `read`: with
    /// FOPEN_KEEP_CACHE a warm open whose pages the kernel holds costs nothing.
    Packed(Arc<LazyBlob>),
}

/// Content of one packed blob, loaded once per open handle.
pub(crate) struct LazyBlob {
    row: Box<Row>,
    what: String,
    data: OnceLock<Reply<Vec<u8>>>,
}

/// One entry on its way into a readdir reply.
enum Listed<'a> {
    Dot(&'static str),
    Synthetic(&'a DirItem),
    Entry(&'a Arc<Gen>, &'a Row, RowPos),
}

/// Live counters the control socket reports.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) inodes: AtomicU64,
    pub(crate) handles: AtomicU64,
    /// Blobs verified and verification failures (counted by the core's
    /// `Verifier`).
    pub(crate) verify: Arc<VerifyCounts>,
    /// Lookups answered with an entry.
    pub(crate) lookups: AtomicU64,
    /// Entries listed by readdirplus without attributes.
    pub(crate) bare_entries: AtomicU64,
    /// READDIR and READDIRPLUS requests answered (listings the kernel did
    /// not serve from its cache).
    pub(crate) dir_reads: AtomicU64,
    /// File reads answered by splicing a local file's pages into the reply.
    pub(crate) spliced_reads: AtomicU64,
    /// Small files put into the kernel's page cache ahead of their reads
    /// (push_ahead.rs).
    pub(crate) pushed_files: AtomicU64,
    /// FUSE requests handled (the refresher sheds caches when it stops
    /// moving).
    pub(crate) requests: AtomicU64,
}

pub(crate) struct StrataFs {
    stats: Arc<Stats>,
    /// The served tree: layout, listings, attributes.
    tree: Tree,
    inodes: Mutex<Inodes>,
    /// Which callers get attributes with every listed entry.
    habits: StatHabits,
    /// Whether the kernel keeps listings yet (it does once a directory is
    /// opened again).
    listings: ListingCache,
    /// Synthetic listings as they were when their current reading began.
    snapshots: Snapshots,
    /// Tells the kernel to drop what it keeps (set once the session exists).
    notifier: Arc<OnceLock<Notifier>>,
    /// Decodes the row groups after a listing's end, off the FUSE workers.
    read_ahead: ReadAhead,
    /// Pushes the small files that follow one being read into the kernel's
    /// page cache (`--opens none` only: it keeps pages across opens).
    push_ahead: Option<PushAhead>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    passthrough: bool,
    /// How files are opened (`--opens`).
    opens: OpenMode,
    /// Read state of files read without an open (`OpenMode::None`).
    inode_reads: InodeReads,
    /// When standalone blobs are verified, and what was.
    verifier: Verifier,
    /// Serve stored owners instead of the mounting user.
    preserve_owner: bool,
    /// POSIX ACLs served and enforced (off with `--no-acl`).
    acls: bool,
    /// Assembled copies of chunked files, served by passthrough.
    assembled: Option<Arc<Assembled>>,
    /// Backing ids of blobs open with passthrough. The kernel requires every
    /// passthrough open of an inode to use the same backing id, so all opens
    /// of a blob share one while any is open.
    backings: Mutex<HashMap<[u8; 32], Weak<BackingId>>>,
    uid: u32,
    gid: u32,
}

type Reply<T> = Result<T, Errno>;

/// Where a directory walk stopped: the generation and its last row read.
type Stopped = (Arc<Gen>, RowPos);

/// Map an error from the core to an errno by its kind, logging it once
/// with `what` (the set, generation and path being served) and the object
/// that failed. Never ENOENT: a name that does not exist is the tree's
/// `TreeError::NotFound`, so an object the store lost (a deleted pack or
/// segment of a pinned generation) is EIO, not a file that silently is not
/// there.
///
/// Conflict is EIO too, not EAGAIN: on a blocking descriptor EAGAIN means
/// "would block", which readers either report confusingly or retry in a
/// tight loop, and what reaches here has been retried already (pinning
/// retries a changing index; a lost pin is taken again by the refresher).
fn errno(e: &Error, what: &str) -> Errno {
    let object = e.object().unwrap_or("-");
    match e.kind() {
        ErrorKind::InvalidInput => {
            warn!(
                "{what} object={object}: {}; answered EINVAL",
                strata::cli_chain(e)
            );
            Errno::EINVAL
        }
        ErrorKind::Corrupt | ErrorKind::Unavailable | ErrorKind::Conflict | ErrorKind::Internal => {
            error!(
                "{what} object={object}: {}; answered EIO",
                strata::cli_chain(e)
            );
            Errno::EIO
        }
    }
}

/// The errno of the tree's answer: ENOENT only for "no such name".
fn tree_errno(e: TreeError) -> Errno {
    match e {
        TreeError::NotFound => Errno::ENOENT,
        TreeError::NotADirectory => Errno::ENOTDIR,
        TreeError::NotALink | TreeError::BadOffset => Errno::EINVAL,
        TreeError::Store { what, error } => errno(&error, &what),
    }
}

fn guarded<T>(what: &str, f: impl FnOnce() -> Reply<T>) -> Reply<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            error!("{what}: handler panicked; answered EIO");
            Err(Errno::EIO)
        }
    }
}

/// Directories advertise a large block size: glibc sizes its `getdents`
/// buffer from it, and the kernel asks for a listing in requests of that
/// size, so a directory of a thousand entries is one round trip, not six.
fn blksize(kind: FileType) -> u32 {
    if kind == FileType::Directory {
        DIR_BLKSIZE
    } else {
        4096
    }
}

fn file_type(kind: NodeKind) -> FileType {
    match kind {
        NodeKind::Dir => FileType::Directory,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::File => FileType::RegularFile,
        NodeKind::Fifo => FileType::NamedPipe,
        NodeKind::Socket => FileType::Socket,
        NodeKind::CharDev => FileType::CharDevice,
        NodeKind::BlockDev => FileType::BlockDevice,
    }
}

/// A device number as the kernel's FUSE attribute carries it: the 32-bit
/// encoding `new_encode_dev` (minor bits split around the major).
fn encode_dev(rdev: u64) -> u32 {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

fn ttl(attrs: &Attrs) -> Duration {
    if attrs.live {
        LIVE_TTL
    } else {
        IMMUTABLE_TTL
    }
}

/// How files are served: the daemon's `--verify`, `--opens`,
/// `--preserve-owner` and `--no-acl`.
pub(crate) struct Serving {
    pub(crate) verify: VerifyMode,
    pub(crate) opens: OpenMode,
    pub(crate) preserve_owner: bool,
    pub(crate) acls: bool,
}

impl StrataFs {
    pub(crate) fn new(
        gens: Arc<Gens>,
        only: Vec<String>,
        stats: Arc<Stats>,
        serving: Serving,
        notifier: Arc<OnceLock<Notifier>>,
        assembled: Option<Arc<Assembled>>,
    ) -> StrataFs {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let Serving {
            verify,
            opens,
            preserve_owner,
            acls,
        } = serving;
        let verifier = Verifier::new(verify.into(), stats.verify.clone());
        // Every open of `--verify always` hashes its blob: it needs opens.
        let opens = match verify {
            VerifyMode::Always => OpenMode::Each,
            _ => opens,
        };
        let push_ahead = (opens == OpenMode::None)
            .then(|| PushAhead::start(gens.store().clone(), notifier.clone(), stats.clone()));
        StrataFs {
            stats,
            tree: Tree::new(gens, only, SystemTime::now()),
            inodes: Mutex::new(Inodes::default()),
            habits: StatHabits::default(),
            listings: ListingCache::default(),
            snapshots: Snapshots::default(),
            notifier,
            read_ahead: ReadAhead::start(),
            push_ahead,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            passthrough: false,
            opens,
            inode_reads: InodeReads::default(),
            verifier,
            preserve_owner,
            acls,
            assembled,
            backings: Mutex::new(HashMap::new()),
            uid,
            gid,
        }
    }

    /// [`guarded`], counting the request.
    fn guarded<T>(&self, what: &str, f: impl FnOnce() -> Reply<T>) -> Reply<T> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        guarded(what, f)
    }

    fn inodes(&self) -> std::sync::MutexGuard<'_, Inodes> {
        self.inodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What inode `ino` stands for, with an entry's row read from its view.
    fn node(&self, ino: INodeNo) -> Reply<Node> {
        let resolved = self.inodes().get(ino.0).ok_or(Errno::ENOENT)?;
        match resolved {
            Resolved::Synthetic(n) => Ok(n),
            Resolved::Entry(gen, pos) => self.tree.entry_at(gen, pos).map_err(tree_errno),
        }
    }

    /// Count one kernel lookup of `node`; returns its inode number.
    fn register(&self, node: Node) -> Reply<u64> {
        let mut inodes = self.inodes();
        let ino = match node {
            Node::Entry { gen, pos, row } => inodes
                .remember_entry(&gen, pos, row.link_key())
                .ok_or_else(|| {
                    error!(
                        "inode space exhausted: set={} gen={}",
                        gen.set, gen.generation
                    );
                    Errno::EOVERFLOW
                })?,
            other => inodes.remember(other),
        };
        self.stats.inodes.store(inodes.len(), Ordering::Relaxed);
        Ok(ino)
    }

    /// The kernel's attributes of inode `ino` from the tree's.
    fn file_attr(&self, ino: u64, a: &Attrs) -> FileAttr {
        let kind = file_type(a.kind);
        let (uid, gid) = match a.owner {
            Some(owner) if self.preserve_owner => owner,
            _ => (self.uid, self.gid),
        };
        FileAttr {
            ino: INodeNo(ino),
            size: a.size,
            blocks: a.blocks,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            crtime: a.atime,
            kind,
            perm: a.perm,
            nlink: match (a.nlink, kind) {
                (0, FileType::Directory) => 2,
                (0, _) => 1,
                (n, _) => n,
            },
            uid,
            gid,
            // fuser's attribute holds the 32-bit `new_encode_dev` form.
            rdev: encode_dev(a.rdev),
            blksize: blksize(kind),
            flags: 0,
        }
    }

    fn attr(&self, ino: u64, node: &Node) -> Reply<(FileAttr, Duration)> {
        let a = self.tree.attrs(node).map_err(tree_errno)?;
        Ok((self.file_attr(ino, &a), ttl(&a)))
    }

    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Reply<(FileAttr, Duration)> {
        let parent = self.node(parent)?;
        let child = self
            .tree
            .child(&parent, name.as_bytes())
            .map_err(tree_errno)?;
        let (mut attr, ttl) = self.attr(0, &child)?;
        attr.ino = INodeNo(self.register(child)?);
        Ok((attr, ttl))
    }

    /// The encoded extended attributes of inode `ino` and a name for
    /// errors. Synthetic nodes and generation roots have none. `ls -l`
    /// asks for two attributes of every file it lists, so an entry without
    /// any is answered without building its name.
    fn xattrs_of(&self, ino: INodeNo) -> Reply<(Vec<u8>, String)> {
        match self.node(ino)? {
            Node::Entry { gen, row, .. } if !row.meta().xattrs.is_empty() => {
                let what = describe(&gen, &row.path());
                Ok((row.meta.map(|m| m.xattrs).unwrap_or_default(), what))
            }
            _ => Ok((Vec::new(), String::new())),
        }
    }

    /// Have the kernel drop the listings it keeps of directories `dirs`
    /// (and their attributes), so their next reading asks the daemon.
    fn drop_listings(&self, dirs: &[u64]) {
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        for &dir in dirs {
            // ENOENT: the kernel no longer holds that directory.
            let _ = notifier.inval_inode(INodeNo(dir), 0, 0);
        }
    }

    fn new_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, Arc::new(h));
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

    /// The backing id of `digest`: the one its current opens share, or a new one.
    fn backing(
        &self,
        reply: &ReplyOpen,
        file: &File,
        digest: [u8; 32],
    ) -> std::io::Result<Arc<BackingId>> {
        let mut backings = self.backings.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = backings.get(&digest).and_then(Weak::upgrade) {
            return Ok(id);
        }
        backings.retain(|_, w| w.strong_count() > 0);
        let id = Arc::new(reply.open_backing(file)?);
        backings.insert(digest, Arc::downgrade(&id));
        Ok(id)
    }
}

/// What `open` decided to do.
enum Opened {
    Passthrough(File, [u8; 32]),
    Handle(Handle, FopenFlags),
}

impl StrataFs {
    fn do_open(&self, ino: INodeNo, flags: OpenFlags) -> Reply<Opened> {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return Err(Errno::EROFS);
        }
        let Node::Entry { gen, row, .. } = self.node(ino)? else {
            return Err(Errno::EISDIR);
        };
        if row.kind != Kind::File {
            return Err(Errno::EISDIR);
        }
        let what = describe(&gen, &row.path());
        match (row.blob, row.digest) {
            (BlobLoc::Standalone, Some(digest)) => self.open_standalone(digest, row.size, what),
            (BlobLoc::Chunked { .. }, Some(digest)) => self.open_chunked(&row, digest, what),
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

    /// Open a standalone blob as the verification policy allows; a local
    /// copy of a remote blob that fails its check is dropped and fetched
    /// once more (logged).
    fn open_standalone(&self, digest: [u8; 32], size: u64, what: String) -> Reply<Opened> {
        let opened = self
            .verifier
            .open_standalone(self.tree.store(), digest, size, |e| {
                errno(e, &what);
                let key = e.object().unwrap_or("-");
                warn!("{what}: the local copy of {key} was dropped; fetching it again");
            })
            .map_err(|e| errno(&e, &what))?;
        Ok(match opened {
            OpenedBlob::Local(file) if self.passthrough => Opened::Passthrough(file, digest),
            OpenedBlob::Local(file) => {
                Opened::Handle(Handle::File(file), FopenFlags::FOPEN_KEEP_CACHE)
            }
            OpenedBlob::Remote { key, size, pieces } => Opened::Handle(
                Handle::Remote {
                    key,
                    size,
                    pieces,
                    what,
                },
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
        })
    }

    /// Open a chunked file: by passthrough of its assembled copy (checked
    /// as the policy asks), else by chunk reads while the copy is made.
    /// With `--verify always` every open reads the store's chunks, each
    /// verified, with no kept copy and no kept page cache.
    fn open_chunked(&self, row: &Row, digest: [u8; 32], what: String) -> Reply<Opened> {
        let always = self.verifier.policy() == VerifyPolicy::Always;
        let assembled = self
            .assembled
            .as_ref()
            .filter(|_| (self.passthrough || self.opens == OpenMode::None) && !always);
        if let Some(copy) = assembled.and_then(|a| a.open_copy(&digest)) {
            match self.verifier.check_copy(&copy.file, copy.made_here, digest) {
                Ok(()) => return Ok(Opened::Passthrough(copy.file, digest)),
                Err(e) => {
                    errno(&e, &what);
                    warn!("{what}: its assembled copy was dropped");
                    assembled.inspect(|a| a.drop_copy(&digest));
                }
            }
        }
        let store = self.tree.store();
        let list = strata::chunks::list(store, row).map_err(|e| errno(&e, &what))?;
        if let Some(assembled) = assembled {
            assembled.request(store, digest, &list);
        }
        let reader = Arc::new(ChunkedReader::new(list));
        let flags = match always {
            true => FopenFlags::empty(),
            false => FopenFlags::FOPEN_KEEP_CACHE,
        };
        Ok(Opened::Handle(Handle::Chunked { reader, what }, flags))
    }

    /// `SEEK_DATA`/`SEEK_HOLE` (the kernel answers the other whences): from
    /// a chunked file's list, a local file's own extents, or, for a file
    /// stored without holes, all data.
    fn do_lseek(&self, ino: INodeNo, fh: FileHandle, offset: i64, whence: i32) -> Reply<i64> {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Err(Errno::EINVAL),
        };
        let offset = u64::try_from(offset).map_err(|_| Errno::ENXIO)?;
        let found = match &*self.handle(ino, fh)? {
            Handle::Chunked { reader, .. } => reader.list().seek(offset, data),
            Handle::File(f) | Handle::Passthrough { file: f, .. } => {
                return seek_file(f, offset, whence)
            }
            Handle::Packed(blob) => {
                (offset < blob.row.size).then_some(if data { offset } else { blob.row.size })
            }
            Handle::Remote { size, .. } => {
                (offset < *size).then_some(if data { offset } else { *size })
            }
        };
        found
            .and_then(|at| i64::try_from(at).ok())
            .ok_or(Errno::ENXIO)
    }

    /// The state reads of `ino` use: the open handle `fh`, or without
    /// opens the inode's kept state, made at its first read.
    fn handle(&self, ino: INodeNo, fh: FileHandle) -> Reply<Arc<Handle>> {
        if self.opens == OpenMode::Each {
            let handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
            return handles.get(&fh.0).cloned().ok_or(Errno::EBADF);
        }
        if let Some(h) = self.inode_reads.get(ino.0) {
            return Ok(h);
        }
        let handle = match self.do_open(ino, OpenFlags(libc::O_RDONLY))? {
            Opened::Passthrough(file, _) => Handle::File(file),
            Opened::Handle(h, _) => h,
        };
        let bytes = match &handle {
            Handle::Packed(blob) => blob.row.size,
            _ => 0,
        };
        let handle = Arc::new(handle);
        self.inode_reads.keep(ino.0, handle.clone(), bytes);
        Ok(handle)
    }

    /// The bytes of a read: a packed blob's are a slice of its decoded
    /// bytes, kept for the inode, not copied.
    fn do_read<'h>(
        &self,
        ino: INodeNo,
        handle: &'h Handle,
        offset: u64,
        size: u32,
    ) -> Reply<Cow<'h, [u8]>> {
        let store = self.tree.store();
        let bytes = match handle {
            Handle::Packed(blob) => {
                let data = blob.data.get_or_init(|| {
                    strata::blob::read(store, &blob.row).map_err(|e| errno(&e, &blob.what))
                });
                // A failure is not kept for the inode: its next read tries
                // again (as a new open would), and logs again.
                let b = data.as_ref().map_err(|e| {
                    if self.opens == OpenMode::None {
                        self.inode_reads.forget(ino.0);
                    }
                    *e
                })?;
                let start = (offset as usize).min(b.len());
                let end = start.saturating_add(size as usize).min(b.len());
                return Ok(Cow::Borrowed(&b[start..end]));
            }
            Handle::Chunked { reader, what } => reader
                .read(store, offset, u64::from(size))
                .map_err(|e| errno(&e, what)),
            Handle::Remote {
                key,
                size: total,
                pieces,
                what,
            } => self
                .verifier
                .read_remote(
                    store,
                    key,
                    *total,
                    pieces.as_deref(),
                    offset,
                    u64::from(size),
                )
                .map_err(|e| errno(&e, what)),
            Handle::File(f) | Handle::Passthrough { file: f, .. } => pread(f, offset, size)
                .map_err(|e| {
                    error!("ino={} read of a standalone blob failed: {e}", ino.0);
                    Errno::from(e)
                }),
        };
        bytes.map(Cow::Owned)
    }

    /// After the first read of a packed file was answered, hand the
    /// push-ahead thread the files that may follow it.
    fn push_after(&self, pid: u32, ino: INodeNo, handle: &Handle) {
        let (Some(push), Handle::Packed(blob)) = (&self.push_ahead, handle) else {
            return;
        };
        if let Some(Resolved::Entry(gen, _)) = self.inodes().get(ino.0) {
            push.first_read(pid, &gen, slot_base(ino.0), &blob.row);
        }
    }

    /// Feed the entries of directory `ino` from `offset` on to `emit`
    /// (given each entry's own offset) until it reports a full reply.
    /// Returns where in a generation the walk stopped, if it read rows.
    /// Directories keep no handle, so everything comes from the inode: a
    /// generation directory from its rows (its generation is held by the
    /// kernel's lookups of it), a synthetic one from the snapshot of its
    /// listing taken when this reading began at offset 0.
    fn walk_dir(
        &self,
        ino: INodeNo,
        offset: u64,
        mut emit: impl FnMut(u64, Listed<'_>) -> Reply<bool>,
    ) -> Reply<Option<Stopped>> {
        enum Source {
            Listing(Arc<Vec<DirItem>>),
            Gen(Arc<Gen>, Vec<u8>),
        }
        let node = self.node(ino)?;
        let source = match self.tree.dir(&node).map_err(tree_errno)? {
            Dir::Gen(gen, path) => Source::Gen(gen, path),
            Dir::Synthetic => Source::Listing(
                self.snapshots
                    .get(ino.0, offset == 0, || self.tree.list(&node))
                    .map_err(tree_errno)?,
            ),
        };
        for (i, dot) in DOTS.into_iter().enumerate() {
            if offset <= i as u64 && emit(i as u64 + 1, Listed::Dot(dot))? {
                return Ok(None);
            }
        }
        match source {
            Source::Listing(items) => {
                for (off, item) in items_from(&items, offset) {
                    if emit(off, Listed::Synthetic(item))? {
                        break;
                    }
                }
                Ok(None)
            }
            Source::Gen(gen, path) => self.walk_gen_dir(&gen, &path, offset, emit),
        }
    }

    fn walk_gen_dir(
        &self,
        gen: &Arc<Gen>,
        path: &[u8],
        offset: u64,
        mut emit: impl FnMut(u64, Listed<'_>) -> Reply<bool>,
    ) -> Reply<Option<Stopped>> {
        let after = match offset_pos(offset) {
            None if offset <= 2 => None,
            // Not an offset this daemon handed out: nothing lies there.
            None => return Ok(None),
            Some(pos) => Some(pos),
        };
        let (mut last, mut failed) = (None, None);
        self.tree
            .visit_gen_dir(gen, path, after, |row, pos| {
                last = Some(pos);
                let emitted = dir_offset(pos)
                    .ok_or(Errno::EOVERFLOW)
                    .and_then(|off| emit(off, Listed::Entry(gen, row, pos)));
                emitted.unwrap_or_else(|e| {
                    failed = Some(e);
                    true
                })
            })
            .map_err(tree_errno)?;
        match failed {
            Some(e) => Err(e),
            None => Ok(last.map(|pos| (gen.clone(), pos))),
        }
    }

    /// After a listing's reply is sent: have the row groups that follow
    /// where it stopped decoded (see read_ahead.rs).
    fn read_ahead(&self, stopped: Option<Stopped>) {
        if let Some((gen, pos)) = stopped {
            self.read_ahead.after(gen, pos);
        }
    }

    /// The inode number of the entry at `pos` of `gen`, without counting a
    /// lookup. `base` keeps the generation's slot for the rest of a reply
    /// (every entry of one listing is of the same generation).
    fn entry_ino(&self, base: &mut Option<u64>, gen: &Arc<Gen>, pos: RowPos) -> Reply<u64> {
        let base = match *base {
            Some(b) => b,
            None => *base.insert(self.inodes().entry_base(gen).ok_or(Errno::EOVERFLOW)?),
        };
        Ok(base | pack_pos(pos).ok_or(Errno::EOVERFLOW)?)
    }

    /// Attributes and TTLs of one readdirplus entry, counted as a lookup
    /// unless it is a dot entry (the kernel does not link those).
    fn plus_entry(
        &self,
        dir: INodeNo,
        item: Listed<'_>,
    ) -> Reply<(FileAttr, Duration, Duration, bool)> {
        match item {
            Listed::Dot(_) => {
                let (attr, _) = self.attr(dir.0, &self.node(dir)?)?;
                Ok((attr, Duration::ZERO, Duration::ZERO, false))
            }
            Listed::Synthetic(item) => {
                let ino = self.register(item.node.clone())?;
                // An unopened generation root is not opened for a listing:
                // it gets placeholder attributes and zero TTLs, so the kernel
                // looks it up (and so pins it) before anything uses it.
                if let Node::GenRoot { gen: None, .. } = item.node {
                    let placeholder = self.tree.synthetic_attrs(NodeKind::Dir, 0);
                    let attr = self.file_attr(ino, &placeholder);
                    return Ok((attr, Duration::ZERO, Duration::ZERO, true));
                }
                let fallback = || {
                    let a = self.tree.synthetic_attrs(item.kind, 0);
                    (self.file_attr(ino, &a), LIVE_TTL)
                };
                let (mut attr, ttl) = self.attr(ino, &item.node).unwrap_or_else(|_| fallback());
                attr.ino = INodeNo(ino);
                Ok((attr, ttl, ttl, true))
            }
            Listed::Entry(gen, row, pos) => {
                let node = Node::Entry {
                    gen: gen.clone(),
                    pos,
                    row: Box::new(row.clone()),
                };
                let (mut attr, ttl) = self.attr(0, &node)?;
                attr.ino = INodeNo(self.register(node)?);
                Ok((attr, ttl, ttl, true))
            }
        }
    }
}

/// Send an attribute value or name list, or its size when asked (`size`
/// 0), or ERANGE when it does not fit the caller's buffer.
fn reply_xattr(data: Reply<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match data {
        Ok(d) if size == 0 => match u32::try_from(d.len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(Errno::E2BIG),
        },
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

/// A stored attribute set that fails to decode is corrupt: EIO, logged.
/// The answer for attribute `name` an entry does not have: ENODATA, but
/// ENOTSUP for an SELinux label. A kernel with SELinux answers that name
/// itself (FUSE files are labelled by the mount), so a request for it
/// comes from a system without labels; `ls -l` asks for it for every file
/// it lists, until an answer says labels are not supported on the device.
/// A label stored with an entry is still served.
fn missing_xattr(name: &OsStr) -> Errno {
    match name.as_bytes() {
        b"security.selinux" => Errno::ENOTSUP,
        _ => Errno::NO_XATTR,
    }
}

/// Whether `name` is a POSIX ACL's attribute.
fn is_acl(name: &[u8]) -> bool {
    matches!(
        name,
        b"system.posix_acl_access" | b"system.posix_acl_default"
    )
}

/// A `listxattr` answer (names, each ending in NUL) without the ACLs', as
/// `--no-acl` serves it.
fn without_acls(names: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(names.len());
    for name in names.split_inclusive(|&b| b == 0) {
        if !is_acl(name.strip_suffix(&[0]).unwrap_or(name)) {
            out.extend_from_slice(name);
        }
    }
    out
}

fn xattr_errno(e: &Error) -> Errno {
    error!("extended attributes: {e}");
    Errno::EIO
}

fn listed_name<'a>(item: &'a Listed<'_>) -> &'a OsStr {
    match item {
        Listed::Dot(d) => OsStr::new(d),
        Listed::Synthetic(i) => OsStr::from_bytes(&i.name),
        Listed::Entry(_, row, _) => OsStr::from_bytes(&row.name),
    }
}

impl Filesystem for StrataFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Opening a backing file needs CAP_SYS_ADMIN: a user's mount
        // serves reads instead.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough = true;
        }
        let _ = config.set_max_readahead(1 << 20);
        // Nothing is written to a read-only mount; this also bounds the
        // payload each FUSE ring entry must offer (`--io-uring`).
        let _ = config.set_max_write(1 << 20);
        // The kernel keeps each inode's POSIX ACLs (asked once, through
        // getxattr, then cached: `ls -l` asks for every file it lists) and
        // checks access against them, as on the committed tree.
        if self.acls {
            let _ = config.add_capabilities(InitFlags::FUSE_POSIX_ACL);
        }
        // Cache symlink targets: `latest` is invalidated by the refresher when it moves.
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        // Check a kept listing's mtime before serving it from the start
        // (synthetic directories change theirs with their listing).
        let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        let plus = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS)
            .is_ok();
        info!(
            "kernel passthrough {}; readdirplus {}",
            if self.passthrough {
                "on"
            } else {
                "unavailable; serving reads"
            },
            if plus { "on" } else { "unavailable" }
        );
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.guarded("lookup", || self.do_lookup(parent, name)) {
            Ok((attr, ttl)) => {
                self.stats.lookups.fetch_add(1, Ordering::Relaxed);
                let mut bare = Vec::new();
                if attr.kind != FileType::Directory && is_entry(attr.ino.0) {
                    bare = self.habits.looked_up(req.pid());
                }
                reply.entry(&ttl, &attr, Generation(0));
                self.drop_listings(&bare);
            }
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut inodes = self.inodes();
        inodes.forget(ino.0, nlookup);
        self.stats.inodes.store(inodes.len(), Ordering::Relaxed);
        drop(inodes);
        self.inode_reads.forget(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.guarded("getattr", || {
            self.node(ino).and_then(|n| self.attr(ino.0, &n))
        }) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let value = self.guarded("getxattr", || {
            if !self.acls && is_acl(name.as_bytes()) {
                return Err(Errno::ENOTSUP);
            }
            let (xattrs, what) = self.xattrs_of(ino)?;
            strata::format::xattrs::get(&xattrs, name.as_bytes(), &what)
                .map_err(|e| xattr_errno(&e))?
                .ok_or_else(|| missing_xattr(name))
        });
        reply_xattr(value, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = self.guarded("listxattr", || {
            let (xattrs, what) = self.xattrs_of(ino)?;
            let names =
                strata::format::xattrs::list(&xattrs, &what).map_err(|e| xattr_errno(&e))?;
            Ok(match self.acls {
                true => names,
                false => without_acls(&names),
            })
        });
        reply_xattr(names, size, reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self.guarded("readlink", || {
            let node = self.node(ino)?;
            self.tree.readlink(&node).map_err(tree_errno)
        });
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    /// With `--opens none` the first `open` is answered ENOSYS: the kernel
    /// then opens every file itself (inode_reads.rs).
    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.opens == OpenMode::None {
            return reply.error(Errno::ENOSYS);
        }
        match self.guarded("open", || self.do_open(ino, flags)) {
            Ok(Opened::Passthrough(file, digest)) => match self.backing(&reply, &file, digest) {
                Ok(id) => {
                    let shared = id.clone();
                    let fh = self.new_handle(Handle::Passthrough { _backing: id, file });
                    reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &shared);
                }
                Err(e) => {
                    warn!("passthrough refused ({e}); serving reads for this file");
                    let fh = self.new_handle(Handle::File(file));
                    reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
                }
            },
            Ok(Opened::Handle(h, flags)) => reply.opened(FileHandle(self.new_handle(h)), flags),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.guarded("lseek", || self.do_lseek(ino, fh, offset, whence)) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let handle = self.guarded("read", || {
            if offset == 0 {
                self.habits.read(req.pid());
            }
            self.handle(ino, fh)
        });
        let handle = match handle {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let Err(reply) = splice_file(&handle, offset, size, reply) else {
            self.stats.spliced_reads.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match guarded("read", || self.do_read(ino, &handle, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => return reply.error(e),
        }
        if offset == 0 {
            // The reply is sent: a panic here only costs the push.
            let _ = guarded("push-ahead", || {
                self.push_after(req.pid(), ino, &handle);
                Ok(())
            });
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

    /// Opened directories keep no handle (listings are read by inode), and
    /// their listings are not kept by the kernel, until a directory of a
    /// generation is opened again: that opening is answered ENOSYS, and the
    /// kernel sends no `opendir` again and keeps every listing it reads
    /// (listing_cache.rs). Generation directories never change; synthetic
    /// ones carry their listing's fingerprint in their mtime
    /// (synthetic_listing.rs); a listing kept bare is dropped when a caller
    /// that stats comes (stat_habits.rs).
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let again = self.guarded("opendir", || {
            let generation_dir = is_entry(ino.0)
                || matches!(
                    self.inodes().get(ino.0),
                    Some(Resolved::Synthetic(Node::GenRoot { .. }))
                );
            Ok(generation_dir && self.listings.opened_again(ino.0))
        });
        match again {
            Ok(true) => {
                info!("a directory was opened again: the kernel keeps listings from now on");
                reply.error(Errno::ENOSYS)
            }
            Ok(false) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.stats.dir_reads.fetch_add(1, Ordering::Relaxed);
        let mut base = None;
        let r = self.guarded("readdir", || {
            self.walk_dir(ino, offset, |off, item| {
                let (child, kind) = match &item {
                    // The kernel resolves `..` itself; both dots carry this
                    // directory's number (informational only).
                    Listed::Dot(_) => (ino.0, FileType::Directory),
                    Listed::Synthetic(i) => (ino_of(&i.node), file_type(i.kind)),
                    Listed::Entry(gen, row, pos) => (
                        self.entry_ino(&mut base, gen, *pos)?,
                        file_type(NodeKind::of(row.kind)),
                    ),
                };
                Ok(reply.add(INodeNo(child), off, kind, listed_name(&item)))
            })
        });
        match r {
            Ok(stopped) => {
                reply.ok();
                self.read_ahead(stopped);
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.stats.dir_reads.fetch_add(1, Ordering::Relaxed);
        let attrs = self.habits.wants_attrs(req.pid(), ino.0);
        let mut added = 0usize;
        let mut bare = 0u64;
        let mut base = None;
        let r = self.guarded("readdirplus", || {
            self.walk_dir(ino, offset, |off, item| {
                if let Listed::Entry(gen, row, pos) = &item {
                    // A link group's names go with attributes: their inode
                    // number is the group's, known once looked up.
                    if row.kind != Kind::Dir && !attrs && row.link_key().is_none() {
                        let ino = self.entry_ino(&mut base, gen, *pos)?;
                        // Bare: the kernel links nothing and counts no
                        // lookup; only d_ino and d_type reach the reader
                        // (see stat_habits.rs).
                        let name = OsStr::from_bytes(&row.name);
                        let kind = file_type(NodeKind::of(row.kind));
                        let full = reply.add_unlinked(INodeNo(ino), off, kind, name);
                        bare += u64::from(!full);
                        return Ok(full);
                    }
                }
                let name = listed_name(&item).to_os_string();
                let (attr, entry_ttl, attr_ttl, counted) = self.plus_entry(ino, item)?;
                // fuser sends one TTL for both entry and attributes.
                let ttl = entry_ttl.min(attr_ttl);
                let full = reply.add(attr.ino, off, &name, &ttl, &attr, Generation(0));
                if full && counted {
                    // Not sent: the kernel will not count this lookup.
                    self.forget(req, attr.ino, 1);
                }
                added += usize::from(!full);
                Ok(full)
            })
        });
        self.habits.listed_bare(req.pid(), ino.0, bare);
        self.stats.bare_entries.fetch_add(bare, Ordering::Relaxed);
        match r {
            // Entries already counted as lookups must reach the kernel (it
            // forgets only what it received); the error recurs at the next
            // offset.
            Err(_) if added > 0 => reply.ok(),
            Ok(stopped) => {
                reply.ok();
                self.read_ahead(stopped);
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, self.inodes().len(), 0, 4096, 255, 4096);
    }
}

/// Answer a read of a standalone blob or an assembled copy by splicing the
/// file's pages into the reply (one copy, not pread's two); the reply back,
/// unsent, for any other handle or when splicing cannot carry it.
fn splice_file(handle: &Handle, offset: u64, size: u32, reply: ReplyData) -> Result<(), ReplyData> {
    let (Handle::File(f) | Handle::Passthrough { file: f, .. }) = handle else {
        return Err(reply);
    };
    let Ok(meta) = f.metadata() else {
        return Err(reply);
    };
    let len = meta.len().saturating_sub(offset).min(u64::from(size));
    reply.splice(std::os::fd::AsFd::as_fd(f), offset, len as usize)
}

/// Up to `size` bytes of `file` at `offset`, into a buffer that is not
/// zeroed first (a large file read through the daemon moves every byte
/// once, not twice).
fn pread(file: &File, offset: u64, size: u32) -> std::io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(size as usize);
    let at = libc::off_t::try_from(offset)
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the kernel writes at most `size` bytes into the buffer's
    // capacity, and the length is set to what it wrote.
    let n = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().cast(), size as usize, at) };
    let n = usize::try_from(n).map_err(|_| std::io::Error::last_os_error())?;
    // SAFETY: `n` bytes were initialized by pread, and n <= size = capacity.
    unsafe { buf.set_len(n) };
    Ok(buf)
}

/// `lseek` on a local file serving a blob (its holes are the file's).
fn seek_file(file: &File, offset: u64, whence: i32) -> Reply<i64> {
    use std::os::fd::AsRawFd;
    let offset = libc::off_t::try_from(offset).map_err(|_| Errno::ENXIO)?;
    // SAFETY: lseek on a descriptor the handle keeps open; reads of it use
    // pread, so its file offset is not otherwise relied on.
    let at = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if at < 0 {
        return Err(Errno::from(std::io::Error::last_os_error()));
    }
    Ok(at)
}
