//! Restore: write a generation (or paths of it) into a local directory with
//! every attribute it stores.
//!
//! Rows arrive in key order, so a directory's row comes before its entries.
//! Directories are created as they come (owner-writable), files are written
//! by a pool of workers, each into a temporary name in its directory
//! ([`TEMP_PREFIX`]) and renamed into place only once its content (verified
//! as it is read from the store), owner, attributes, mode and mtime are set.
//! A file under its own name is therefore complete, and a rerun after an
//! interruption skips every file whose size, mtime, mode (and owner, as
//! root) already match. Further names of a hard-link group are linked to the
//! first one once the files are written. Directories get their metadata
//! last, deepest first, so writing into them does not move their mtimes.
//!
//! A marker (`.strata-restore`) names the generation while a restore runs; a
//! non-empty destination is refused unless it holds the marker of the same
//! generation (a resume) or `--overwrite` is given.

use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::row::{BlobLoc, Kind, Row};
use crate::store::Store;
use crossbeam_channel::{bounded, Receiver};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Files being written carry this prefix until they are complete.
pub const TEMP_PREFIX: &str = ".strata-restore-";
/// The marker naming the generation a restore in progress writes.
pub const MARKER: &str = ".strata-restore";

/// What to restore and how.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// Restore only these paths (and what is below them); empty: all.
    pub paths: Vec<Vec<u8>>,
    /// Write into a non-empty destination, replacing what differs.
    pub overwrite: bool,
    /// File-writing workers.
    pub jobs: usize,
}

/// Live counts for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    pub files: AtomicU64,
    pub bytes: AtomicU64,
}

/// What a restore did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RestoreSummary {
    pub set: String,
    pub generation: u64,
    pub identity: String,
    pub destination: String,
    /// The run continued an interrupted restore of the same generation.
    pub resumed: bool,
    pub dirs: u64,
    /// Files written (content read, verified and written).
    pub files_written: u64,
    /// Files already identical in the destination (not rewritten).
    pub files_skipped: u64,
    pub bytes_written: u64,
    pub symlinks: u64,
    /// Names made as hard links to an earlier name of their group.
    pub hard_links: u64,
    /// FIFOs, sockets and device nodes made.
    pub special: u64,
    /// Device nodes not made: only root may.
    pub devices_skipped: Vec<String>,
    /// Owners were set (the restore ran as root).
    pub owners: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Marker {
    set: String,
    generation: u64,
    identity: String,
}

/// Restore the generation `view` of `set` into `dest`.
pub fn restore(
    store: &Store,
    set: &str,
    view: &GenView,
    dest: &Path,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<RestoreSummary> {
    let started = Instant::now();
    let marker = Marker {
        set: set.to_string(),
        generation: view.generation(),
        identity: view.pin.record.identity.clone(),
    };
    let resumed = prepare_dest(dest, &marker, opts.overwrite)?;
    let writer = Writer {
        store,
        // SAFETY: geteuid has no preconditions.
        owners: unsafe { libc::geteuid() } == 0,
        halfway: view.top().manifest.counts.files / 2,
        progress,
    };
    let mut run = Run {
        writer: &writer,
        dest,
        summary: RestoreSummary {
            set: set.to_string(),
            generation: view.generation(),
            identity: marker.identity.clone(),
            destination: dest.display().to_string(),
            resumed,
            ..RestoreSummary::default()
        },
        dirs: Vec::new(),
        leaders: HashMap::new(),
        followers: Vec::new(),
    };
    run.summary.owners = writer.owners;
    run.rows(view, opts)?;
    run.link_followers()?;
    remove_marker(dest, &marker)?;
    run.finish_dirs()?;
    run.summary.duration_ms = started.elapsed().as_millis() as u64;
    Ok(run.summary)
}

/// Create `dest` or check it may be written; true when it holds the marker
/// of the same generation (an interrupted restore to resume).
fn prepare_dest(dest: &Path, marker: &Marker, overwrite: bool) -> Result<bool> {
    fs::create_dir_all(dest).map_err(|e| Error::io("create", dest, e))?;
    let marker_path = dest.join(MARKER);
    let found = fs::read(&marker_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Marker>(&b).ok());
    let resumed = found.as_ref() == Some(marker);
    let empty = fs::read_dir(dest)
        .map_err(|e| Error::io("list", dest, e))?
        .filter_map(|e| e.ok())
        .all(|e| e.file_name() == MARKER);
    if !empty && !resumed && !overwrite {
        return Err(Error::Invalid(format!(
            "destination is not empty: dest=`{}` (pass --overwrite to write into it, \
             or rerun an interrupted restore of the same generation to resume it)",
            dest.display()
        )));
    }
    let body = serde_json::to_vec(marker)
        .map_err(|e| Error::internal_from("encode the restore marker", e))?;
    fs::write(&marker_path, body).map_err(|e| Error::io("write", &marker_path, e))?;
    Ok(resumed)
}

/// Remove the marker, unless the generation's own file of that name took
/// its place.
fn remove_marker(dest: &Path, marker: &Marker) -> Result<()> {
    let p = dest.join(MARKER);
    let ours = fs::read(&p)
        .ok()
        .and_then(|b| serde_json::from_slice::<Marker>(&b).ok())
        .is_some_and(|m| &m == marker);
    match ours {
        true => fs::remove_file(&p).map_err(|e| Error::io("remove", &p, e)),
        false => Ok(()),
    }
}

/// What file workers share: the store, whether owners are set, progress.
struct Writer<'a> {
    store: &'a Store,
    owners: bool,
    /// The file count at which the `restore-halfway` failpoint fires.
    halfway: u64,
    progress: &'a Progress,
}

struct Run<'a> {
    writer: &'a Writer<'a>,
    dest: &'a Path,
    summary: RestoreSummary,
    /// Directory rows, in key order, for their metadata at the end.
    dirs: Vec<Row>,
    /// First restored name of each link group.
    leaders: HashMap<(u64, Option<[u8; 32]>), Vec<u8>>,
    /// Further names of link groups: (row path, leader path).
    followers: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A file for the workers.
struct FileJob {
    row: Row,
    path: PathBuf,
}

impl Run<'_> {
    fn abs(&self, rel: &[u8]) -> PathBuf {
        match rel.is_empty() {
            true => self.dest.to_path_buf(),
            false => self.dest.join(OsStr::from_bytes(rel)),
        }
    }

    /// Walk the generation's rows: directories, links and special files
    /// here, files on `opts.jobs` workers.
    fn rows(&mut self, view: &GenView, opts: &RestoreOptions) -> Result<()> {
        let (tx, rx) = bounded::<FileJob>(opts.jobs.max(1) * 16);
        let abort = AtomicBool::new(false);
        let written = AtomicU64::new(0);
        let (skipped, walk) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..opts.jobs.max(1))
                .map(|_| {
                    let rx = rx.clone();
                    let (abort, written, writer) = (&abort, &written, self.writer);
                    s.spawn(move || writer.work(rx, abort, written))
                })
                .collect();
            drop(rx);
            let walk = self.walk(view, opts, &tx, &abort);
            drop(tx);
            let mut skipped = 0;
            let mut first_err = None;
            for w in workers {
                match w.join() {
                    Ok(Ok(n)) => skipped += n,
                    Ok(Err(e)) => first_err = first_err.or(Some(e)),
                    Err(_) => {
                        first_err = first_err.or(Some(Error::internal("a restore worker panicked")))
                    }
                }
            }
            (first_err.map_or(Ok(skipped), Err), walk)
        });
        let skipped = skipped?;
        walk?;
        self.summary.files_skipped = skipped;
        self.summary.files_written = written.load(Relaxed);
        self.summary.bytes_written = self.writer.progress.bytes.load(Relaxed);
        Ok(())
    }

    fn walk(
        &mut self,
        view: &GenView,
        opts: &RestoreOptions,
        tx: &crossbeam_channel::Sender<FileJob>,
        abort: &AtomicBool,
    ) -> Result<()> {
        for row in view.rows()? {
            let row = row?;
            if abort.load(Relaxed) {
                return Ok(());
            }
            let rel = row.path();
            if !crate::browse::selected(&opts.paths, &rel) {
                continue;
            }
            if let Some(key) = row.link_key() {
                if let Some(leader) = self.leaders.get(&key) {
                    self.followers.push((rel, leader.clone()));
                    continue;
                }
                self.leaders.insert(key, rel.clone());
            }
            match row.kind {
                Kind::Dir => self.dir(row)?,
                Kind::File => {
                    let path = self.abs(&rel);
                    if tx.send(FileJob { row, path }).is_err() {
                        return Ok(());
                    }
                }
                Kind::Symlink => self.symlink(&row)?,
                Kind::Tombstone => {}
                _ => self.special(&row)?,
            }
        }
        Ok(())
    }

    /// Make directory `row` (owner-writable until [`Run::finish_dirs`]).
    fn dir(&mut self, row: Row) -> Result<()> {
        let path = self.abs(&row.path());
        match fs::symlink_metadata(&path) {
            // Writable by its owner until its own metadata is set, last.
            Ok(md) if md.is_dir() => fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io("chmod", &path, e))?,
            Ok(_) => {
                remove(&path)?;
                mkdir(&path)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => mkdir(&path)?,
            Err(e) => return Err(Error::io("stat", &path, e)),
        }
        self.summary.dirs += 1;
        self.dirs.push(row);
        Ok(())
    }

    fn symlink(&mut self, row: &Row) -> Result<()> {
        let path = self.abs(&row.path());
        let target = OsStr::from_bytes(row.target.as_deref().unwrap_or_default());
        remove(&path)?;
        std::os::unix::fs::symlink(target, &path).map_err(|e| Error::io("symlink", &path, e))?;
        self.writer.set_meta(row, &path, None)?;
        self.summary.symlinks += 1;
        Ok(())
    }

    /// A FIFO, socket or device node; a device is skipped unless root.
    fn special(&mut self, row: &Row) -> Result<()> {
        let rel = row.path();
        let path = self.abs(&rel);
        let (kind, dev) = match row.kind {
            Kind::Fifo => (libc::S_IFIFO, 0),
            Kind::Socket => (libc::S_IFSOCK, 0),
            Kind::CharDev => (libc::S_IFCHR, row.meta().rdev),
            _ => (libc::S_IFBLK, row.meta().rdev),
        };
        let device = matches!(row.kind, Kind::CharDev | Kind::BlockDev);
        if device && !self.writer.owners {
            self.summary.devices_skipped.push(crate::row::show(&rel));
            return Ok(());
        }
        remove(&path)?;
        let c = cpath(&path)?;
        // SAFETY: `c` is NUL-terminated.
        let rc = unsafe { libc::mknod(c.as_ptr(), kind | 0o600, dev) };
        check(rc, "mknod", &path)?;
        self.writer.set_meta(row, &path, None)?;
        self.summary.special += 1;
        Ok(())
    }

    /// Link the further names of each link group to its first.
    fn link_followers(&mut self) -> Result<()> {
        for (rel, leader) in std::mem::take(&mut self.followers) {
            let (path, first) = (self.abs(&rel), self.abs(&leader));
            let same = match (fs::symlink_metadata(&path), fs::symlink_metadata(&first)) {
                (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
                _ => false,
            };
            if !same {
                remove(&path)?;
                fs::hard_link(&first, &path).map_err(|e| Error::io("link", &path, e))?;
            }
            self.summary.hard_links += 1;
        }
        Ok(())
    }

    /// Directory metadata, deepest first.
    fn finish_dirs(&mut self) -> Result<()> {
        for row in std::mem::take(&mut self.dirs).iter().rev() {
            self.writer.set_meta(row, &self.abs(&row.path()), None)?;
        }
        Ok(())
    }
}

impl Writer<'_> {
    /// Run file jobs until the channel closes; returns the files skipped as
    /// identical. The first error stops every worker.
    fn work(&self, rx: Receiver<FileJob>, abort: &AtomicBool, written: &AtomicU64) -> Result<u64> {
        let mut skipped = 0;
        for job in rx {
            if abort.load(Relaxed) {
                break;
            }
            match self.file(&job) {
                Ok(true) => {
                    let n = written.fetch_add(1, Relaxed) + 1;
                    if n == self.halfway {
                        self.store.failpoints().hit(Step::RestoreHalfway)?;
                    }
                }
                Ok(false) => skipped += 1,
                Err(e) => {
                    abort.store(true, Relaxed);
                    return Err(e);
                }
            }
            self.progress.files.fetch_add(1, Relaxed);
        }
        Ok(skipped)
    }

    /// Write one file; false if it was already identical.
    fn file(&self, job: &FileJob) -> Result<bool> {
        let (row, path) = (&job.row, &job.path);
        if self.identical(row, path) {
            return Ok(false);
        }
        let temp = temp_name(path);
        let written = self.write_temp(row, &temp).and_then(|()| {
            if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
                remove(path)?;
            }
            fs::rename(&temp, path).map_err(|e| Error::io("rename", path, e))
        });
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(Error::Restore {
                path: path.display().to_string(),
                source: Box::new(e),
            });
        }
        self.progress.bytes.fetch_add(row.size, Relaxed);
        Ok(true)
    }

    /// Whether `path` already holds `row`'s file: same size, mtime, mode
    /// and, as root, owner (content is not re-read).
    fn identical(&self, row: &Row, path: &Path) -> bool {
        let Ok(md) = fs::symlink_metadata(path) else {
            return false;
        };
        md.is_file()
            && md.size() == row.size
            && md.mtime() * 1_000_000_000 + md.mtime_nsec() == row.mtime_ns
            && md.mode() & 0o7777 == row.mode
            && (!self.owners || (md.uid(), md.gid()) == (row.uid, row.gid))
    }

    /// Content and metadata into `temp`.
    fn write_temp(&self, row: &Row, temp: &Path) -> Result<()> {
        let _ = fs::remove_file(temp);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(temp)
            .map_err(|e| Error::io("create", temp, e))?;
        let shown = temp.display().to_string();
        match row.blob {
            BlobLoc::Chunked { .. } => {
                let list = crate::chunks::list(self.store, row)?;
                crate::chunks::write_sparse(self.store, &list, &file, &shown)?;
            }
            BlobLoc::None => {}
            _ => {
                let mut out = BufWriter::with_capacity(1 << 20, &file);
                crate::blob::copy_to(self.store, row, &mut out)?;
                out.flush().map_err(|e| Error::io("write", temp, e))?;
            }
        }
        self.set_meta(row, temp, Some(&file))
    }

    /// Owner, attributes, mode and times of `path` (not following a
    /// symlink), in the order that keeps each: chown clears set-id bits and
    /// an ACL sets the group bits, so the mode comes after both.
    fn set_meta(&self, row: &Row, path: &Path, file: Option<&File>) -> Result<()> {
        let c = cpath(path)?;
        if self.owners {
            // SAFETY: `c` is NUL-terminated.
            check(
                unsafe { libc::lchown(c.as_ptr(), row.uid, row.gid) },
                "chown",
                path,
            )?;
        }
        let what = path.display().to_string();
        for (name, value) in crate::format::xattrs::decode(&row.meta().xattrs, &what)? {
            crate::xattr::set(path, &name, &value).map_err(|e| {
                let name = String::from_utf8_lossy(&name).into_owned();
                Error::io("set extended attribute", format!("{what} ({name})"), e)
            })?;
        }
        if row.kind != Kind::Symlink {
            let mode = row.mode & 0o7777;
            let rc = match file {
                // SAFETY: a live descriptor.
                Some(f) => unsafe { libc::fchmod(std::os::fd::AsRawFd::as_raw_fd(f), mode) },
                // SAFETY: `c` is NUL-terminated.
                None => unsafe { libc::chmod(c.as_ptr(), mode) },
            };
            check(rc, "chmod", path)?;
        }
        set_mtime(&c, row.mtime_ns, path)
    }
}

/// The temporary name `path`'s content is written under, in its directory.
fn temp_name(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().as_bytes();
    let tag = &blake3::hash(name).to_hex()[..16];
    path.with_file_name(format!("{TEMP_PREFIX}{tag}"))
}

fn cpath(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid(format!("path holds NUL: `{}`", path.display())))
}

fn check(rc: libc::c_int, op: &'static str, path: &Path) -> Result<()> {
    match rc {
        0 => Ok(()),
        _ => Err(Error::io(op, path, io::Error::last_os_error())),
    }
}

fn set_mtime(c: &CString, mtime_ns: i64, path: &Path) -> Result<()> {
    let t = libc::timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000),
    };
    let times = [t, t];
    // SAFETY: `c` is NUL-terminated and `times` holds two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    check(rc, "set times", path)
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(|e| Error::io("create directory", path, e))
}

/// Remove whatever is at `path`, a directory tree included.
fn remove(path: &Path) -> Result<()> {
    let r = match fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    r.map_err(|e| Error::io("remove", path, e))
}
