//! The FUSE adapter: kernel requests onto the [`Tree`], one lock for all.
//!
//! Every fsync, directory fsync and rename is written to the trace (when
//! one is configured), with whether a renamed file still had unsynced
//! data: the harness checks the write-fsync-rename order from it.

use crate::model::{Inode, Kind, Tree};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

const TTL: Duration = Duration::from_secs(1);

/// The tree and the trace, shared with the signal thread.
pub struct Shared {
    pub tree: Tree,
    pub trace: Option<std::fs::File>,
}

impl Shared {
    fn trace(&mut self, line: std::fmt::Arguments) {
        if let Some(t) = &mut self.trace {
            let _ = writeln!(t, "{line}");
        }
    }
}

pub struct LazyFs(pub Arc<Mutex<Shared>>);

impl LazyFs {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn attr(ino: u64, i: &Inode) -> FileAttr {
    let (kind, size) = match i.kind {
        Kind::File => (FileType::RegularFile, i.data.len() as u64),
        Kind::Symlink => (FileType::Symlink, i.data.len() as u64),
        Kind::Dir => (FileType::Directory, 4096),
        Kind::Special if i.mode & libc::S_IFMT == libc::S_IFSOCK => (FileType::Socket, 0),
        Kind::Special => (FileType::NamedPipe, 0),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: i.mtime,
        mtime: i.mtime,
        ctime: i.ctime,
        crtime: i.ctime,
        kind,
        perm: (i.mode & 0o7777) as u16,
        nlink: if i.kind == Kind::Dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl LazyFs {
    fn entry(&self, reply: ReplyEntry, made: Result<u64, i32>) {
        let s = self.lock();
        match made.and_then(|ino| s.tree.get(ino).map(|i| attr(ino, i))) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn make(
        &self,
        parent: INodeNo,
        name: &OsStr,
        kind: Kind,
        mode: u32,
        target: &[u8],
    ) -> Result<u64, i32> {
        self.lock()
            .tree
            .create(parent.0, name, kind, mode & 0o7777, target)
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.lock().tree.lookup(parent.0, name);
        self.entry(reply, found);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().tree.get(ino.0) {
            Ok(i) => reply.attr(&TTL, &attr(ino.0, i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.lock();
        let t = &mut s.tree;
        let done = (|| {
            if let Some(size) = size {
                t.truncate(ino.0, size)?;
            }
            if let Some(mode) = mode {
                t.chmod(ino.0, mode)?;
            }
            if let Some(m) = mtime {
                t.set_mtime(ino.0, time(m));
            }
            t.get(ino.0).map(|i| attr(ino.0, i))
        })();
        match done {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.lock().tree.get(ino.0) {
            Ok(i) if i.kind == Kind::Symlink => reply.data(&i.data),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.make(parent, name, Kind::Dir, mode, b"");
        self.entry(reply, made);
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFSOCK | libc::S_IFIFO => Kind::Special,
            _ => return reply.error(Errno::EPERM),
        };
        let keep = if kind == Kind::Special {
            mode & (libc::S_IFMT | 0o7777)
        } else {
            mode & 0o7777
        };
        let made = self.lock().tree.create(parent.0, name, kind, keep, b"");
        self.entry(reply, made);
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let made = self.make(
            parent,
            name,
            Kind::Symlink,
            0o777,
            target.as_os_str().as_bytes(),
        );
        self.entry(reply, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().tree.remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().tree.remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let mut s = self.lock();
        let unsynced = s
            .tree
            .lookup(parent.0, name)
            .and_then(|i| s.tree.get(i))
            .map_or(0, |i| i.unsynced());
        let from = format!("{}/{}", s.tree.path(parent.0), name.to_string_lossy());
        let res = s
            .tree
            .rename(parent.0, name, newparent.0, newname, noreplace);
        if res.is_ok() {
            let to = format!("{}/{}", s.tree.path(newparent.0), newname.to_string_lossy());
            s.trace(format_args!("rename {from} {to} unsynced={unsynced}"));
        }
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.lock();
        if flags.0 & libc::O_TRUNC != 0 {
            if let Err(e) = s.tree.truncate(ino.0, 0) {
                return reply.error(errno(e));
            }
        }
        match s.tree.get(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.lock();
        let made = s
            .tree
            .create(parent.0, name, Kind::File, mode & 0o7777, b"");
        match made.and_then(|ino| s.tree.get(ino).map(|i| attr(ino, i))) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.lock().tree.get(ino.0) {
            Ok(i) => {
                let start = (offset as usize).min(i.data.len());
                let end = (start + size as usize).min(i.data.len());
                reply.data(&i.data[start..end]);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.lock().tree.write(ino.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync(ino, reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = self.lock();
        let dir = match s.tree.get(ino.0) {
            Ok(d) if d.kind == Kind::Dir => d,
            Ok(_) => return reply.error(Errno::ENOTDIR),
            Err(e) => return reply.error(errno(e)),
        };
        let dots = [
            (ino.0, FileType::Directory, OsStr::new(".")),
            (dir.parent, FileType::Directory, OsStr::new("..")),
        ];
        let entries = dots.into_iter().chain(dir.entries.iter().map(|(n, c)| {
            let kind = s
                .tree
                .get(*c)
                .map_or(FileType::RegularFile, |i| attr(*c, i).kind);
            (*c, kind, n.as_os_str())
        }));
        for (k, (child, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), k as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync(ino, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = 1 << 28;
        reply.statfs(blocks, blocks, blocks, 1 << 24, 1 << 24, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

impl LazyFs {
    fn sync(&self, ino: INodeNo, reply: ReplyEmpty) {
        let mut s = self.lock();
        let what = match s.tree.get(ino.0).map(|i| i.kind) {
            Ok(Kind::Dir) => "fsyncdir",
            _ => "fsync",
        };
        let path = s.tree.path(ino.0);
        match s.tree.fsync(ino.0) {
            Ok(()) => {
                s.trace(format_args!("{what} {path}"));
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}
