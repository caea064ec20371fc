//! The FUSE filesystem: translates kernel requests into reads of pinned
//! generations. No strata logic lives here; every handler resolves a node,
//! asks the core (`GenView::locate`, `dir_entries`, `blob::read`), and maps
//! errors to a deliberate errno, logging the cause. ENOENT means only "no
//! such name": a lookup that finds no row (or no generation, tag or set of
//! that name); an error from the core is mapped by its kind (`errno`), so a
//! missing pack, blob or segment of a generation being served is EIO, never
//! ENOENT. Every EIO is logged once, with what was being served (set,
//! generation, path) and the object that failed. Handler bodies run under
//! `catch_unwind`: a panic becomes EIO and a log line, never a dead mount;
//! locks tolerate poisoning so one caught panic cannot disable the others.
//!
//! Layout: `/<set>/latest -> gens/<N>`, `/<set>/gens/<N>/...`,
//! `/<set>/tags/<name> -> ../gens/<N>`.
//!
//! Generation directories are listed straight from row ranges: a directory
//! offset is the position of the last entry served, so `readdir` resumes
//! (and `seekdir` seeks) without any listing kept per open directory.
//! `readdirplus` answers attributes with the names, counting each entry as a
//! kernel lookup in its generation's slot (node.rs).

use crate::gen::{Gen, Gens};
use crate::listing_cache::ListingCache;
use crate::node::{dir_offset, ino_of, is_entry, offset_pos, pack_pos, Inodes, Node, Resolved};
use crate::read_ahead::ReadAhead;
use crate::stat_habits::StatHabits;
use crate::synthetic_listing::{self, DirItem, Snapshots};
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata::compose::RowPos;
use strata::error::{Error, ErrorKind};
use strata::format::record::State;
use strata::index::GenIndex;
use strata::row::{join, BlobLoc, Kind, Row};
use strata::storage::pieces::Pieces;
use strata::store::keys;
use tracing::{error, info, warn};

/// Generations never change: their entries and attributes live long.
const IMMUTABLE_TTL: Duration = Duration::from_secs(86_400);
/// Synthetic nodes (set list, generation list, `latest`, tags) follow commits.
const LIVE_TTL: Duration = Duration::from_millis(500);
/// `st_blksize` of directories (see [`blksize`]).
const DIR_BLKSIZE: u32 = 256 << 10;

/// When standalone blobs are hashed in full before they are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum VerifyMode {
    /// At the first open of each blob in this daemon run.
    FirstOpen,
    /// At every open.
    Always,
    /// Never (packed blobs are still checked: decoding includes the check).
    Off,
}

enum Handle {
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
    /// A packed (small) blob, read and verified at the first `read`: with
    /// FOPEN_KEEP_CACHE a warm open whose pages the kernel holds costs nothing.
    Packed(Arc<LazyBlob>),
}

/// Content of one packed blob, loaded once per open handle.
struct LazyBlob {
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
    pub(crate) verified: AtomicU64,
    pub(crate) verify_failures: AtomicU64,
    /// Lookups answered with an entry.
    pub(crate) lookups: AtomicU64,
    /// Entries listed by readdirplus without attributes.
    pub(crate) bare_entries: AtomicU64,
    /// READDIR and READDIRPLUS requests answered (listings the kernel did
    /// not serve from its cache).
    pub(crate) dir_reads: AtomicU64,
}

pub(crate) struct StrataFs {
    stats: Arc<Stats>,
    gens: Arc<Gens>,
    /// Sets served; empty means every set of the store.
    only: Vec<String>,
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
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    passthrough: bool,
    verify: VerifyMode,
    /// Serve stored owners instead of the mounting user.
    preserve_owner: bool,
    /// Backing ids of blobs open with passthrough. The kernel requires every
    /// passthrough open of an inode to use the same backing id, so all opens
    /// of a blob share one while any is open.
    backings: Mutex<HashMap<[u8; 32], Weak<BackingId>>>,
    /// Standalone blobs verified in full during this daemon run.
    verified: Mutex<HashSet<[u8; 32]>>,
    /// Verified piece trees of remote blobs read by ranged GETs, shared by
    /// their open handles.
    remote_pieces: Mutex<HashMap<[u8; 32], Weak<Pieces>>>,
    uid: u32,
    gid: u32,
    started: SystemTime,
}

type Reply<T> = Result<T, Errno>;

/// Where a directory walk stopped: the generation and its last row read.
type Stopped = (Arc<Gen>, RowPos);

/// Map an error from the core to an errno by its kind, logging it once
/// with `what` (the set, generation and path being served) and the object
/// that failed. Never ENOENT: a name that does not exist is a lookup's
/// `Ok(None)` (or [`absent_as_none`]), so an object the store lost (a
/// deleted pack or segment of a pinned generation) is EIO, not a file that
/// silently is not there.
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

/// A name of the mount's namespace the core reports as not existing: a
/// generation the index has no committed record of (never was, not yet, or
/// retired), a tag, a set without generations: `Ok(None)`, answered ENOENT.
/// Everything else stays an error, a missing stored object
/// (`Error::MissingObject`) included.
fn absent_as_none<T>(r: strata::Result<T>) -> strata::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
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

fn time_of(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
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

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

fn describe(gen: &Gen, path: &[u8]) -> String {
    format!(
        "set={} gen={} path={}",
        gen.set,
        gen.generation,
        if path.is_empty() {
            "/".into()
        } else {
            strata::row::show(path)
        }
    )
}

/// The node `history/<path>` stands for, given the kind of `path` in latest.
fn history_node(set: &str, path: Vec<u8>, kind: Kind) -> Node {
    let set = set.to_string();
    match kind {
        Kind::Dir => Node::History { set, path },
        _ => Node::Versions { set, path },
    }
}

/// `history/<path>/<N>` -> `../../gens/<N>/<path>`, one `..` per
/// component of `path` and one for `history`.
fn version_target(path: &[u8], generation: u64) -> Vec<u8> {
    let depth = path.split(|&b| b == b'/').count() + 1;
    let mut t = b"../".repeat(depth);
    t.extend_from_slice(format!("gens/{generation}/").as_bytes());
    t.extend_from_slice(path);
    t
}

fn tag_target(generation: u64) -> Vec<u8> {
    format!("../gens/{generation}").into_bytes()
}

impl StrataFs {
    pub(crate) fn new(
        gens: Arc<Gens>,
        only: Vec<String>,
        stats: Arc<Stats>,
        verify: VerifyMode,
        preserve_owner: bool,
        notifier: Arc<OnceLock<Notifier>>,
    ) -> StrataFs {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        StrataFs {
            stats,
            gens,
            only,
            inodes: Mutex::new(Inodes::default()),
            habits: StatHabits::default(),
            listings: ListingCache::default(),
            snapshots: Snapshots::default(),
            notifier,
            read_ahead: ReadAhead::start(),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            passthrough: false,
            verify,
            preserve_owner,
            backings: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashSet::new()),
            remote_pieces: Mutex::new(HashMap::new()),
            uid,
            gid,
            started: SystemTime::now(),
        }
    }

    fn inodes(&self) -> std::sync::MutexGuard<'_, Inodes> {
        self.inodes.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// What inode `ino` stands for, with an entry's row read from its view.
    fn node(&self, ino: INodeNo) -> Reply<Node> {
        let resolved = self.inodes().get(ino.0).ok_or(Errno::ENOENT)?;
        match resolved {
            Resolved::Synthetic(n) => Ok(n),
            Resolved::Entry(gen, pos) => {
                let row = gen
                    .view
                    .row_at(pos)
                    .map_err(|e| errno(&e, &describe(&gen, b"?")))?
                    .ok_or(Errno::ENOENT)?;
                let row = Box::new(row);
                Ok(Node::Entry { gen, pos, row })
            }
        }
    }

    /// Count one kernel lookup of `node`; returns its inode number.
    fn register(&self, node: Node) -> Reply<u64> {
        let mut inodes = self.inodes();
        let ino = match node {
            Node::Entry { gen, pos, .. } => inodes.remember_entry(&gen, pos).ok_or_else(|| {
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
            blksize: blksize(kind),
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
            uid: if self.preserve_owner {
                row.uid
            } else {
                self.uid
            },
            gid: if self.preserve_owner {
                row.gid
            } else {
                self.gid
            },
            rdev: 0,
            blksize: blksize(kind),
            flags: 0,
        }
    }

    /// The latest generation of `set` (pinned); ENOENT for an empty set.
    fn latest_gen(&self, set: &str) -> Reply<Arc<Gen>> {
        self.gens
            .latest(set)
            .map_err(|e| errno(&e, &format!("resolve latest set={set}")))?
            .ok_or(Errno::ENOENT)
    }

    fn latest_target(&self, set: &str) -> Reply<Vec<u8>> {
        let g = self.latest_gen(set)?;
        Ok(format!("gens/{}", g.generation).into_bytes())
    }

    fn attr(&self, ino: u64, node: &Node) -> Reply<(FileAttr, Duration)> {
        let link = |target: Vec<u8>| {
            let len = target.len() as u64;
            (self.synthetic_attr(ino, FileType::Symlink, len), LIVE_TTL)
        };
        Ok(match node {
            Node::Root
            | Node::Set(_)
            | Node::Gens(_)
            | Node::Tags(_)
            | Node::History { .. }
            | Node::Versions { .. } => {
                let mut attr = self.synthetic_attr(ino, FileType::Directory, 0);
                attr.mtime = self.listing_mtime(node);
                (attr, LIVE_TTL)
            }
            Node::Version {
                path, generation, ..
            } => link(version_target(path, *generation)),
            Node::GenRoot {
                set,
                generation,
                gen,
            } => {
                let gen = self.root_gen(set, *generation, gen)?;
                let root = gen
                    .view
                    .lookup(b"")
                    .map_err(|e| errno(&e, &describe(&gen, b"")))?
                    .ok_or_else(|| {
                        error!(
                            "{}: the generation has no root row; answered EIO",
                            describe(&gen, b"")
                        );
                        Errno::EIO
                    })?;
                (self.entry_attr(ino, &root), IMMUTABLE_TTL)
            }
            Node::Latest(s) => link(self.latest_target(s)?),
            Node::Tag(_, _, g) => link(tag_target(*g)),
            Node::Entry { row, .. } => (self.entry_attr(ino, row), IMMUTABLE_TTL),
        })
    }

    /// `gens/<name>`: the generation, opened (pinned) now.
    fn generation_root(&self, set: &str, name: &OsStr) -> Reply<Node> {
        let text = name.to_str().ok_or(Errno::ENOENT)?;
        let n: u64 = text.parse().map_err(|_| Errno::ENOENT)?;
        if n.to_string() != text {
            return Err(Errno::ENOENT);
        }
        let gen = absent_as_none(self.gens.get(set, n))
            .map_err(|e| errno(&e, &format!("open set={set} gen={n} path=/")))?
            .ok_or(Errno::ENOENT)?;
        Ok(Node::GenRoot {
            set: set.to_string(),
            generation: n,
            gen: Some(gen),
        })
    }

    /// The open generation of a generation root, opening it if needed.
    fn root_gen(&self, set: &str, generation: u64, gen: &Option<Arc<Gen>>) -> Reply<Arc<Gen>> {
        match gen {
            Some(g) => Ok(g.clone()),
            None => absent_as_none(self.gens.get(set, generation))
                .map_err(|e| errno(&e, &format!("open set={set} gen={generation} path=/")))?
                .ok_or(Errno::ENOENT),
        }
    }

    fn entry(&self, gen: Arc<Gen>, path: &[u8]) -> Reply<Node> {
        let (row, pos) = gen
            .view
            .locate(path)
            .map_err(|e| errno(&e, &describe(&gen, path)))?
            .ok_or(Errno::ENOENT)?;
        let row = Box::new(row);
        Ok(Node::Entry { gen, pos, row })
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
                b"tags" => Ok(Node::Tags(s.clone())),
                b"history" => Ok(Node::History {
                    set: s.clone(),
                    path: Vec::new(),
                }),
                _ => Err(Errno::ENOENT),
            },
            Node::History { set, path } => self.history_child(set, &join(path, name.as_bytes())),
            Node::Versions { set, path } => {
                let n = name.to_str().and_then(|t| t.parse::<u64>().ok());
                let n = n.ok_or(Errno::ENOENT)?;
                self.versions(set, path)?
                    .into_iter()
                    .find(|v| v.generation == n)
                    .map(|v| Node::Version {
                        set: set.clone(),
                        path: path.clone(),
                        generation: v.generation,
                    })
                    .ok_or(Errno::ENOENT)
            }
            Node::Gens(s) => self.generation_root(s, name),
            Node::Tags(s) => {
                let t = name.to_str().ok_or(Errno::ENOENT)?;
                let tag = absent_as_none(strata::tag::load(self.gens.store(), s, t))
                    .map_err(|e| errno(&e, &format!("tag set={s} name={t}")))?
                    .ok_or(Errno::ENOENT)?;
                Ok(Node::Tag(s.clone(), tag.name, tag.generation))
            }
            Node::GenRoot {
                set,
                generation,
                gen,
            } => {
                let gen = self.root_gen(set, *generation, gen)?;
                self.entry(gen, name.as_bytes())
            }
            Node::Entry { gen, row, .. } if row.kind == Kind::Dir => {
                self.entry(gen.clone(), &join(&row.path(), name.as_bytes()))
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Reply<(FileAttr, Duration)> {
        let parent = self.node(parent)?;
        let child = self.child(&parent, name)?;
        let (mut attr, ttl) = self.attr(0, &child)?;
        attr.ino = INodeNo(self.register(child)?);
        Ok((attr, ttl))
    }

    fn listing(&self, node: &Node) -> Reply<Vec<DirItem>> {
        let item = |node: Node, kind: FileType, name: &[u8]| DirItem {
            node,
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
                item(Node::Tags(s.clone()), FileType::Directory, b"tags"),
                item(
                    Node::History {
                        set: s.clone(),
                        path: Vec::new(),
                    },
                    FileType::Directory,
                    b"history",
                ),
            ],
            Node::History { set, path } => self.history_items(set, path)?,
            Node::Versions { set, path } => self
                .versions(set, path)?
                .into_iter()
                .map(|v| {
                    let name = v.generation.to_string();
                    let n = Node::Version {
                        set: set.clone(),
                        path: path.clone(),
                        generation: v.generation,
                    };
                    item(n, FileType::Symlink, name.as_bytes())
                })
                .collect(),
            Node::Gens(s) => self.generation_items(s)?,
            Node::Tags(s) => strata::tag::list(self.gens.store(), s)
                .map_err(|e| errno(&e, &format!("list tags of {s}")))?
                .into_iter()
                .map(|t| {
                    let n = Node::Tag(s.clone(), t.name.clone(), t.generation);
                    item(n, FileType::Symlink, t.name.as_bytes())
                })
                .collect(),
            _ => return Err(Errno::ENOTDIR),
        })
    }

    /// The mtime of a synthetic directory: it changes when its listing does
    /// (see synthetic_listing.rs). `gens/` and `history/…` follow the set's
    /// index: their stamp is its record names (one listing of the index
    /// directory, not a read of every record or generation, since a path
    /// walk through them asks for these attributes), with the generations
    /// this daemon holds for `gens/`. One that cannot be read now keeps the
    /// daemon's start time (its reading will report the error).
    fn listing_mtime(&self, node: &Node) -> SystemTime {
        let stamped = match node {
            Node::Gens(set) => self.index_stamp(set, true),
            Node::History { set, .. } | Node::Versions { set, .. } => self.index_stamp(set, false),
            _ => self
                .listing(node)
                .map(|items| synthetic_listing::mtime(self.started, &items)),
        };
        stamped.unwrap_or(self.started)
    }

    /// The stamp of the record names of `set`'s index, and of the
    /// generations of `set` this daemon holds if `held`.
    fn index_stamp(&self, set: &str, held: bool) -> Reply<SystemTime> {
        let storage = self.gens.store().storage();
        let mut names = storage
            .list(&keys::index_dir(set))
            .map_err(|e| errno(&e, &format!("list the index of set={set}")))?;
        names.sort();
        let mut parts: Vec<Vec<u8>> = names.into_iter().map(String::into_bytes).collect();
        if held {
            let mut gens: Vec<u64> = self
                .gens
                .held_views()
                .into_iter()
                .filter(|(s, _, _)| s == set)
                .map(|(_, g, _)| g)
                .collect();
            gens.sort();
            parts.push(b"held".to_vec());
            parts.extend(gens.iter().map(|g| g.to_le_bytes().to_vec()));
        }
        Ok(synthetic_listing::stamp(self.started, parts))
    }

    /// `history/<path>` for `path` of the latest generation: a directory
    /// there is another history directory, anything else its versions.
    fn history_child(&self, set: &str, path: &[u8]) -> Reply<Node> {
        let latest = self.latest_gen(set)?;
        let row = latest
            .view
            .lookup(path)
            .map_err(|e| errno(&e, &describe(&latest, path)))?
            .ok_or(Errno::ENOENT)?;
        Ok(history_node(set, path.to_vec(), row.kind))
    }

    /// The entries of directory `path` of the latest generation, as
    /// history nodes.
    fn history_items(&self, set: &str, path: &[u8]) -> Reply<Vec<DirItem>> {
        let latest = self.latest_gen(set)?;
        let rows = latest
            .view
            .list_dir(path)
            .map_err(|e| errno(&e, &describe(&latest, path)))?;
        Ok(rows
            .into_iter()
            .map(|r| DirItem {
                node: history_node(set, r.path(), r.kind),
                kind: FileType::Directory,
                name: OsString::from_vec(r.name),
            })
            .collect())
    }

    /// The versions of `path` in `set`, each looked up through this
    /// daemon's pinned views (a generation retired meanwhile is passed over).
    fn versions(&self, set: &str, path: &[u8]) -> Reply<Vec<strata::history::Version>> {
        let what = || format!("history set={set} path={}", strata::row::show(path));
        let committed = absent_as_none(strata::history::committed(self.gens.store(), set))
            .map_err(|e| errno(&e, &what()))?
            .ok_or(Errno::ENOENT)?;
        let gens: Vec<u64> = committed.into_iter().map(|(g, _)| g).collect();
        strata::history::versions_in(&gens, |g| match absent_as_none(self.gens.get(set, g))? {
            Some(gen) => gen.view.lookup(path),
            None => Ok(None),
        })
        .map_err(|e| errno(&e, &what()))
    }

    /// Committed generations of `set`, as unopened generation roots.
    fn generation_items(&self, set: &str) -> Reply<Vec<DirItem>> {
        let all = GenIndex::new(self.gens.store(), set)
            .all()
            .map_err(|e| errno(&e, &format!("list generations set={set}")))?;
        let held = self.gens.held_views();
        let pinned = |g: u64| held.iter().any(|(s, h, _)| s == set && *h == g);
        Ok(all
            .into_iter()
            .filter(|(g, r)| r.state == State::Committed || pinned(*g))
            .map(|(g, _)| DirItem {
                node: Node::GenRoot {
                    set: set.to_string(),
                    generation: g,
                    gen: None,
                },
                kind: FileType::Directory,
                name: OsString::from(g.to_string()),
            })
            .collect())
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

    /// Verify a whole standalone blob as the verify mode asks.
    fn must_verify(&self, digest: &[u8; 32]) -> bool {
        match self.verify {
            VerifyMode::Off => false,
            VerifyMode::FirstOpen => !self
                .verified
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(digest),
            VerifyMode::Always => true,
        }
    }

    fn verify_standalone(&self, file: &File, digest: [u8; 32], what: &str) -> Reply<()> {
        if !self.must_verify(&digest) {
            return Ok(());
        }
        let mut hasher = blake3::Hasher::new();
        let mut reader = file;
        std::io::copy(&mut reader, &mut hasher).map_err(|e| {
            let key = keys::blob(&hex::encode(digest));
            error!("{what} object={key}: read blob: {e}; answered EIO");
            Errno::EIO
        })?;
        self.verified_as(hasher, digest, what)
    }

    /// The verified piece tree of a remote blob served by ranged reads:
    /// shared while any handle holds it (with `first-open`), else built by
    /// hashing the blob in ranged reads; `None` when verification is off.
    fn remote_pieces(
        &self,
        key: &str,
        size: u64,
        digest: [u8; 32],
        what: &str,
    ) -> Reply<Option<Arc<Pieces>>> {
        if self.verify == VerifyMode::Off {
            return Ok(None);
        }
        let mut known = self
            .remote_pieces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.verify == VerifyMode::FirstOpen {
            if let Some(p) = known.get(&digest).and_then(Weak::upgrade) {
                return Ok(Some(p));
            }
        }
        drop(known);
        let storage = self.gens.store().storage();
        let pieces = match Pieces::verify(storage.as_ref(), key, size, &digest) {
            Ok(p) => Arc::new(p),
            Err(e) if e.kind() == strata::ErrorKind::Corrupt => {
                self.stats.verify_failures.fetch_add(1, Ordering::Relaxed);
                error!("{what} blob={key}: {}; answered EIO", strata::cli_chain(&e));
                return Err(Errno::EIO);
            }
            Err(e) => return Err(errno(&e, what)),
        };
        self.mark_verified(digest);
        known = self
            .remote_pieces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        known.retain(|_, w| w.strong_count() > 0);
        known.insert(digest, Arc::downgrade(&pieces));
        Ok(Some(pieces))
    }

    fn mark_verified(&self, digest: [u8; 32]) {
        let new = self
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest);
        if new {
            self.stats.verified.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn verified_as(&self, hasher: blake3::Hasher, digest: [u8; 32], what: &str) -> Reply<()> {
        if hasher.finalize().as_bytes() != &digest {
            self.stats.verify_failures.fetch_add(1, Ordering::Relaxed);
            error!(
                "{what} blob={}: content fails its BLAKE3 check; answered EIO",
                hex::encode(digest)
            );
            return Err(Errno::EIO);
        }
        self.mark_verified(digest);
        Ok(())
    }
}

impl StrataFs {
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
            (BlobLoc::Standalone, Some(digest)) => self.open_standalone(digest, row.size, &what),
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

    /// Open a standalone blob; a local copy of a remote blob that fails
    /// its check is dropped and fetched once more.
    fn open_standalone(&self, digest: [u8; 32], size: u64, what: &str) -> Reply<Opened> {
        let key = keys::blob(&hex::encode(digest));
        match self.open_blob(&key, digest, size, what) {
            Err(Errno::EIO) if self.gens.store().storage().evict_copy(&key) => {
                warn!("{what}: the local copy of {key} was dropped; fetching it again");
                self.open_blob(&key, digest, size, what)
            }
            r => r,
        }
    }

    fn open_blob(&self, key: &str, digest: [u8; 32], size: u64, what: &str) -> Reply<Opened> {
        let opened = self
            .gens
            .store()
            .storage()
            .open_file(key)
            .map_err(|e| errno(&e, what))?;
        let Some(file) = opened else {
            let pieces = self.remote_pieces(key, size, digest, what)?;
            return Ok(Opened::Handle(
                Handle::Remote {
                    key: key.to_string(),
                    size,
                    pieces,
                    what: what.to_string(),
                },
                FopenFlags::FOPEN_KEEP_CACHE,
            ));
        };
        let just_verified =
            self.verify == VerifyMode::FirstOpen && self.gens.store().storage().verified_copy(key);
        if just_verified {
            self.mark_verified(digest);
        } else {
            self.verify_standalone(&file, digest, what)?;
        }
        if self.passthrough {
            return Ok(Opened::Passthrough(file, digest));
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
                Some(Handle::Remote {
                    key,
                    size: total,
                    pieces,
                    what,
                }) => {
                    let (key, total, pieces) = (key.clone(), *total, pieces.clone());
                    let what = what.clone();
                    drop(handles);
                    let at = (offset, size);
                    return self.read_remote(&key, total, pieces.as_deref(), at, &what);
                }
                Some(Handle::File(f)) | Some(Handle::Passthrough { file: f, .. }) => {
                    let mut buf = vec![0u8; size as usize];
                    let n = f.read_at(&mut buf, offset).map_err(|e| {
                        error!("fh={} read of a standalone blob failed: {e}", fh.0);
                        Errno::from(e)
                    })?;
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

    /// One read of a blob served by ranged GETs (the lock is not held),
    /// checked piece by piece unless verification is off.
    fn read_remote(
        &self,
        key: &str,
        total: u64,
        pieces: Option<&Pieces>,
        (offset, size): (u64, u32),
        what: &str,
    ) -> Reply<Vec<u8>> {
        let storage = self.gens.store().storage();
        let read = match pieces {
            Some(p) => p.read(storage.as_ref(), offset, u64::from(size)),
            None => {
                let start = offset.min(total);
                let n = u64::from(size).min(total - start);
                if n == 0 {
                    return Ok(Vec::new());
                }
                storage.get_range_uncached(key, start, n)
            }
        };
        read.map_err(|e| {
            if e.kind() == strata::ErrorKind::Corrupt {
                self.stats.verify_failures.fetch_add(1, Ordering::Relaxed);
            }
            errno(&e, what)
        })
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
        enum Dir {
            Listing(Arc<Vec<DirItem>>),
            Gen(Arc<Gen>, Vec<u8>),
        }
        let dir = match self.node(ino)? {
            Node::GenRoot {
                set,
                generation,
                gen,
            } => Dir::Gen(self.root_gen(&set, generation, &gen)?, Vec::new()),
            Node::Entry { gen, row, .. } if row.kind == Kind::Dir => Dir::Gen(gen, row.path()),
            Node::Entry { .. } | Node::Latest(_) | Node::Tag(..) | Node::Version { .. } => {
                return Err(Errno::ENOTDIR)
            }
            node => Dir::Listing(
                self.snapshots
                    .get(ino.0, offset == 0, || self.listing(&node))?,
            ),
        };
        for (i, dot) in [".", ".."].into_iter().enumerate() {
            if offset <= i as u64 && emit(i as u64 + 1, Listed::Dot(dot))? {
                return Ok(None);
            }
        }
        match dir {
            Dir::Listing(items) => {
                let from = offset.saturating_sub(2) as usize;
                for (i, item) in items.iter().enumerate().skip(from) {
                    if emit(i as u64 + 3, Listed::Synthetic(item))? {
                        break;
                    }
                }
                Ok(None)
            }
            Dir::Gen(gen, path) => self.walk_gen_dir(&gen, &path, offset, emit),
        }
    }

    fn walk_gen_dir(
        &self,
        gen: &Arc<Gen>,
        path: &[u8],
        offset: u64,
        mut emit: impl FnMut(u64, Listed<'_>) -> Reply<bool>,
    ) -> Reply<Option<Stopped>> {
        let what = || describe(gen, path);
        let after = match offset_pos(offset) {
            None if offset <= 2 => None,
            // Not an offset this daemon handed out: nothing lies there.
            None => return Ok(None),
            Some(pos) => match gen.view.row_at(pos).map_err(|e| errno(&e, &what()))? {
                Some(r) if r.parent == path => Some(r.name),
                _ => return Err(Errno::EINVAL),
            },
        };
        let (mut last, mut failed) = (None, None);
        gen.view
            .visit_dir(path, after.as_deref(), |row, pos| {
                last = Some(pos);
                let emitted = dir_offset(pos)
                    .ok_or(Errno::EOVERFLOW)
                    .and_then(|off| emit(off, Listed::Entry(gen, row, pos)));
                emitted.unwrap_or_else(|e| {
                    failed = Some(e);
                    true
                })
            })
            .map_err(|e| errno(&e, &what()))?;
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
                    let attr = self.synthetic_attr(ino, FileType::Directory, 0);
                    return Ok((attr, Duration::ZERO, Duration::ZERO, true));
                }
                let fallback = || (self.synthetic_attr(ino, item.kind, 0), LIVE_TTL);
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

fn listed_name<'a>(item: &'a Listed<'_>) -> &'a OsStr {
    match item {
        Listed::Dot(d) => OsStr::new(d),
        Listed::Synthetic(i) => &i.name,
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
        match guarded("lookup", || self.do_lookup(parent, name)) {
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
            Node::Tag(_, _, g) => Ok(tag_target(g)),
            Node::Version {
                path, generation, ..
            } => Ok(version_target(&path, generation)),
            Node::Entry { gen, row, .. } if row.kind == Kind::Symlink => {
                row.target.clone().ok_or_else(|| {
                    error!(
                        "{}: symlink without a target; answered EIO",
                        describe(&gen, &row.path())
                    );
                    Errno::EIO
                })
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

    /// Opened directories keep no handle (listings are read by inode), and
    /// their listings are not kept by the kernel, until a directory of a
    /// generation is opened again: that opening is answered ENOSYS, and the
    /// kernel sends no `opendir` again and keeps every listing it reads
    /// (listing_cache.rs). Generation directories never change; synthetic
    /// ones carry their listing's fingerprint in their mtime
    /// (synthetic_listing.rs); a listing kept bare is dropped when a caller
    /// that stats comes (stat_habits.rs).
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let again = guarded("opendir", || {
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
        let r = guarded("readdir", || {
            self.walk_dir(ino, offset, |off, item| {
                let (child, kind) = match &item {
                    // The kernel resolves `..` itself; both dots carry this
                    // directory's number (informational only).
                    Listed::Dot(_) => (ino.0, FileType::Directory),
                    Listed::Synthetic(i) => (ino_of(&i.node), i.kind),
                    Listed::Entry(gen, row, pos) => {
                        (self.entry_ino(&mut base, gen, *pos)?, file_type(row.kind))
                    }
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
        let attrs = self.habits.wants_attrs(req.pid());
        let mut added = 0usize;
        let mut bare = 0u64;
        let mut base = None;
        let r = guarded("readdirplus", || {
            self.walk_dir(ino, offset, |off, item| {
                if let Listed::Entry(gen, row, pos) = &item {
                    if row.kind != Kind::Dir && !attrs {
                        let ino = self.entry_ino(&mut base, gen, *pos)?;
                        // Bare: the kernel links nothing and counts no
                        // lookup; only d_ino and d_type reach the reader
                        // (see stat_habits.rs).
                        let name = OsStr::from_bytes(&row.name);
                        let kind = file_type(row.kind);
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
