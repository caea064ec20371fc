//! Rows: one entry of a tree, and the key order every segment, journal run and
//! merge uses.
//!
//! A row's key is `(parent, name)` compared bytewise as a tuple, so the
//! children of a directory are contiguous and a directory listing is one range.
//! The root directory is the row `("", "")`, which sorts first. Paths are bytes
//! (never decoded), `/`-separated, relative to the set root.

use crate::error::{Error, Result};
use std::cmp::Ordering;

/// Longest accepted path, in bytes.
pub const MAX_PATH: usize = 4096;
/// Longest accepted name (one component), in bytes.
pub const MAX_NAME: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix socket (recreated as an unbound socket node on restore).
    Socket,
    /// A character device; its number is [`Meta::rdev`].
    CharDev,
    /// A block device; its number is [`Meta::rdev`].
    BlockDev,
    /// Inside a delta or a journal: this path and everything below it is gone.
    Tombstone,
}

impl Kind {
    pub fn code(self) -> u8 {
        match self {
            Kind::File => b'f',
            Kind::Dir => b'd',
            Kind::Symlink => b'l',
            Kind::Fifo => b'p',
            Kind::Socket => b's',
            Kind::CharDev => b'c',
            Kind::BlockDev => b'b',
            Kind::Tombstone => b'x',
        }
    }

    pub fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            b'f' => Kind::File,
            b'd' => Kind::Dir,
            b'l' => Kind::Symlink,
            b'p' => Kind::Fifo,
            b's' => Kind::Socket,
            b'c' => Kind::CharDev,
            b'b' => Kind::BlockDev,
            b'x' => Kind::Tombstone,
            _ => return None,
        })
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Fifo => "fifo",
            Kind::Socket => "socket",
            Kind::CharDev => "char device",
            Kind::BlockDev => "block device",
            Kind::Tombstone => "tombstone",
        }
    }

    /// A FIFO, socket or device node: no content, no target.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev
        )
    }
}

/// What a row carries beyond kind, mode, size, times and owner: its link
/// group, device number and extended attributes. Most rows have none, so a
/// row holds it boxed and optional (`Row::meta`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    /// Link group: nonzero for a non-directory whose source had more than
    /// one hard link. Rows of one generation with the same key and the same
    /// content digest are one file (see docs/FORMAT.md, "Link groups").
    pub link: u64,
    /// The source's link count at commit (`st_nlink`), served as such.
    pub nlink: u32,
    /// Device number (`st_rdev`) of a character or block device.
    pub rdev: u64,
    /// Extended attributes (POSIX ACLs included) in the canonical encoding
    /// of [`crate::xattr`]; empty for none.
    pub xattrs: Vec<u8>,
}

impl Meta {
    /// `None` for a row with nothing beyond the basic fields.
    pub fn boxed(self) -> Option<Box<Meta>> {
        (self != Meta::default()).then(|| Box::new(self))
    }
}

/// How a stored blob is encoded inside a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Raw,
    Zstd,
}

impl Codec {
    pub fn code(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Zstd => 1,
        }
    }

    pub fn from_code(c: u8) -> Option<Codec> {
        match c {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            _ => None,
        }
    }
}

/// Where a file's content lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobLoc {
    /// No stored bytes: directories, symlinks, empty files.
    None,
    /// A standalone raw blob named by the content digest.
    Standalone,
    /// Content-defined chunks, in the chunk list named by this BLAKE3
    /// (`format::chunk`).
    /// `data`: the bytes stored as data, not holes (for `st_blocks`).
    Chunked { list: [u8; 32], data: u64 },
    /// A frame inside a pack named by the pack's SHA-256.
    Packed {
        pack: [u8; 32],
        offset: u64,
        len: u64,
        codec: Codec,
    },
}

/// One entry of a tree (see DESIGN.md's word table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub parent: Vec<u8>,
    pub name: Vec<u8>,
    pub kind: Kind,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Content length; symlink target length; 0 for directories.
    pub size: u64,
    pub mtime_ns: i64,
    /// BLAKE3 of the content (files only).
    pub digest: Option<[u8; 32]>,
    pub blob: BlobLoc,
    pub target: Option<Vec<u8>>,
    /// Generation in which this path was first seen with this kind.
    pub first_gen: u64,
    /// Generation in which this row last changed.
    pub changed_gen: u64,
    /// Observation metadata for skipping unchanged files; not part of identity.
    pub ino: u64,
    pub ctime_ns: i64,
    /// Owner as observed (served with `--preserve-owner`); like mtime, not
    /// part of identity.
    pub uid: u32,
    pub gid: u32,
    /// Link group, device number and extended attributes, if any.
    pub meta: Option<Box<Meta>>,
}

const NO_META: &Meta = &Meta {
    link: 0,
    nlink: 0,
    rdev: 0,
    xattrs: Vec::new(),
};

impl Row {
    /// A tombstone for `(parent, name)`.
    pub fn tombstone(parent: Vec<u8>, name: Vec<u8>) -> Row {
        Row {
            parent,
            name,
            kind: Kind::Tombstone,
            mode: 0,
            size: 0,
            mtime_ns: 0,
            digest: None,
            blob: BlobLoc::None,
            target: None,
            first_gen: 0,
            changed_gen: 0,
            ino: 0,
            ctime_ns: 0,
            uid: 0,
            gid: 0,
            meta: None,
        }
    }

    /// This row's extra metadata (all zero and empty when it has none).
    pub fn meta(&self) -> &Meta {
        self.meta.as_deref().unwrap_or(NO_META)
    }

    /// The key of this row's link group, if it is in one.
    pub fn link_key(&self) -> Option<(u64, Option<[u8; 32]>)> {
        let link = self.meta().link;
        (link != 0 && self.kind != Kind::Dir).then_some((link, self.digest))
    }

    pub fn key_cmp(&self, other: &Row) -> Ordering {
        key_cmp(&self.parent, &self.name, &other.parent, &other.name)
    }

    pub fn path(&self) -> Vec<u8> {
        join(&self.parent, &self.name)
    }

    /// Same observation: equal in everything but provenance and blob
    /// location, so the older row stands (a re-hash that found nothing new).
    pub fn same_observation(&self, other: &Row) -> bool {
        self.same_content(other)
            && self.mtime_ns == other.mtime_ns
            && self.ino == other.ino
            && self.ctime_ns == other.ctime_ns
            && self.meta() == other.meta()
    }

    /// Same logical content (what identity covers) as `other`.
    pub fn same_content(&self, other: &Row) -> bool {
        self.kind == other.kind
            && self.mode == other.mode
            && self.size == other.size
            && self.digest == other.digest
            && self.target == other.target
            && self.meta().rdev == other.meta().rdev
            && self.meta().xattrs == other.meta().xattrs
    }
}

pub fn key_cmp(ap: &[u8], an: &[u8], bp: &[u8], bn: &[u8]) -> Ordering {
    ap.cmp(bp).then_with(|| an.cmp(bn))
}

/// `parent/name`, or `name` at the top level.
pub fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() {
        return name.to_vec();
    }
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    p.extend_from_slice(parent);
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

/// Split a normalized path into `(parent, name)`; `""` is the root.
pub fn split(path: &[u8]) -> (Vec<u8>, Vec<u8>) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (path[..i].to_vec(), path[i + 1..].to_vec()),
        None => (Vec::new(), path.to_vec()),
    }
}

/// Normalize a user-supplied relative path: strip `./`, repeated and trailing
/// slashes; refuse `..`, absolute paths, NUL and over-long names.
pub fn normalize(raw: &[u8]) -> Result<Vec<u8>> {
    if raw.first() == Some(&b'/') {
        return Err(Error::Invalid(format!(
            "path must be relative to the set root: path=`{}`",
            show(raw)
        )));
    }
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    for comp in raw.split(|&b| b == b'/') {
        if comp.is_empty() || comp == b"." {
            continue;
        }
        check_name(comp, raw)?;
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(comp);
    }
    check_path_len(&out)?;
    Ok(out)
}

/// Refuse a component that cannot be a stored name.
pub fn check_name(comp: &[u8], whole: &[u8]) -> Result<()> {
    if comp == b".." {
        return Err(Error::Invalid(format!(
            "path may not contain `..`: path=`{}`",
            show(whole)
        )));
    }
    if comp.contains(&0) || comp.contains(&b'/') || comp.is_empty() || comp == b"." {
        return Err(Error::Invalid(format!(
            "invalid name: path=`{}`",
            show(whole)
        )));
    }
    if comp.len() > MAX_NAME {
        return Err(Error::TooLarge {
            what: "name",
            size: comp.len() as u64,
            limit: MAX_NAME as u64,
        });
    }
    Ok(())
}

pub fn check_path_len(path: &[u8]) -> Result<()> {
    if path.len() > MAX_PATH {
        return Err(Error::TooLarge {
            what: "path",
            size: path.len() as u64,
            limit: MAX_PATH as u64,
        });
    }
    Ok(())
}

/// Printable form of a byte path (invalid UTF-8 shown lossily, for messages).
pub fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}
