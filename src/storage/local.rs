//! Local-directory backend: the embedded default.
//!
//! Durability assumptions (docs/FORMAT.md, "Media"): a file is durable after
//! `fsync`, a name after `fsync` of its directory; `renameat2(RENAME_NOREPLACE)`
//! (falling back to `link`+`unlink`) is the create-exclusive primitive; pointer
//! CAS holds an exclusive `flock` on `<key>.lock` around read-compare-replace.
//! Leases are `flock`ed files: the kernel drops the lock when the holder dies,
//! which is what makes a killed owner recognizably unheld.

use super::{CasOutcome, Lease, LeaseState, PutOutcome, Storage, TryLease};
use crate::error::{Error, IoContext, Result};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct LocalStorage {
    root: PathBuf,
    /// Directories known to be durable in their parents during this process.
    durable: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
}

impl LocalStorage {
    pub fn new(root: impl Into<PathBuf>) -> LocalStorage {
        LocalStorage {
            root: root.into(),
            durable: Default::default(),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Create the parent directory of `path` and make its name durable,
    /// also when it already existed (an earlier attempt may have died
    /// between mkdir and the fsync of its parent). Once per directory.
    fn ensure_parent(&self, path: &Path) -> Result<()> {
        let Some(dir) = path.parent() else {
            return Ok(());
        };
        if self
            .durable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(dir)
        {
            return Ok(());
        }
        ensure_dir(dir)?;
        if let Some(up) = dir.parent() {
            fsync_dir(up)?;
        }
        self.durable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(dir.to_path_buf());
        Ok(())
    }

    fn temp_path(&self, final_path: &Path) -> PathBuf {
        let name = final_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        final_path.with_file_name(format!(".tmp-{}-{}", crate::token::new_token(), name))
    }
}

/// Create `dir` (mode 0700) and fsync the parents of every directory created.
pub(crate) fn ensure_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        ensure_dir(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(Error::io("mkdir", dir, e)),
    }
    match dir.parent() {
        Some(parent) => fsync_dir(parent),
        None => Ok(()),
    }
}

pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    // The parent of a relative top-level name is the empty path: the cwd.
    let dir = match dir.as_os_str().is_empty() {
        true => Path::new("."),
        false => dir,
    };
    File::open(dir)
        .and_then(|f| f.sync_all())
        .ctx("fsync-dir", dir)
}

/// Write `bytes` to a new file at `path` (mode 0600) and fsync it.
pub(crate) fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .ctx("create", path)?;
    f.write_all(bytes).ctx("write", path)?;
    f.sync_all().ctx("fsync", path)
}

/// Write `bytes` to a new file at `path` (mode 0600), not yet synced.
fn write_unsynced(path: &Path, bytes: &[u8]) -> Result<File> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .ctx("create", path)?;
    f.write_all(bytes).ctx("write", path)?;
    Ok(f)
}

/// Filesystems whose `syncfs` makes every file written before it durable
/// (ext4, XFS, Btrfs, F2FS, ZFS). Elsewhere it can return having synced
/// nothing: a FUSE filesystem other than virtiofs never hears of it.
const SYNCFS_DURABLE: [i64; 5] = [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010, 0x2FC1_2FC1];

/// Whether one `syncfs` of `dir`'s filesystem makes its files durable.
fn syncfs_is_durable(dir: &Path) -> Result<bool> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid("nul in path".into()))?;
    // SAFETY: `c` is a valid path; `st` a valid out pointer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(Error::io("statfs", dir, io::Error::last_os_error()));
    }
    Ok(SYNCFS_DURABLE.contains(&(st.f_type as i64)))
}

/// Make the new files `written` (all under `root`) durable: one `syncfs`
/// where that is a barrier for them, an `fsync` each elsewhere.
fn sync_written(root: &Path, written: Vec<(File, &Path)>) -> Result<()> {
    if !syncfs_is_durable(root)? {
        for (f, path) in written {
            f.sync_all().ctx("fsync", path)?;
        }
        return Ok(());
    }
    drop(written);
    let f = File::open(root).ctx("open", root)?;
    // SAFETY: `f` is an open descriptor for the duration of the call.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(Error::io("syncfs", root, io::Error::last_os_error()));
    }
    Ok(())
}

/// Rename without replacing; `Ok(false)` when `to` exists.
fn rename_noreplace(from: &Path, to: &Path) -> Result<bool> {
    let c_from = CString::new(from.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid("nul in path".into()))?;
    let c_to = CString::new(to.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid("nul in path".into()))?;
    // SAFETY: both pointers are valid NUL-terminated strings for the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c_from.as_ptr(),
            libc::AT_FDCWD,
            c_to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(false),
        Some(libc::EINVAL) | Some(libc::ENOSYS) => link_then_unlink(from, to),
        _ => Err(Error::io("rename-noreplace", to, err)),
    }
}

fn link_then_unlink(from: &Path, to: &Path) -> Result<bool> {
    match fs::hard_link(from, to) {
        Ok(()) => {
            fs::remove_file(from).ctx("unlink", from)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io("link", to, e)),
    }
}

fn flock(file: &File, wait: bool) -> io::Result<bool> {
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock on a valid open descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// The entries of `path`, `None` when it does not exist.
fn read_dir_if_exists(path: &Path) -> Result<Option<fs::ReadDir>> {
    match fs::read_dir(path) {
        Ok(rd) => Ok(Some(rd)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("readdir", path, e)),
    }
}

/// A lease probe holds the lock for an instant, so a taker that does not
/// wait retries for a moment before it calls the lease busy.
const PROBE_RETRIES: usize = 10;

fn flock_past_probes(file: &File, wait: bool) -> io::Result<bool> {
    if wait {
        return flock(file, true);
    }
    for _ in 0..PROBE_RETRIES {
        if flock(file, false)? {
            return Ok(true);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    flock(file, false)
}

fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .ctx("open-lock", path)
}

fn read_holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = file.take(4096).read_to_string(&mut s);
    s.trim().to_string()
}

/// A lease backed by an exclusive `flock` on an open file.
#[derive(Debug)]
struct LocalLease {
    key: String,
    _file: File,
}

impl Lease for LocalLease {
    fn key(&self) -> &str {
        &self.key
    }
}

impl LocalStorage {
    /// Create a lease file that is locked before its final name exists, so a
    /// probe can never mistake a brand-new lease for a dead one. `None` when
    /// the name already exists (the caller then locks the existing file).
    fn try_create_locked(
        &self,
        key: &str,
        path: &Path,
        holder: &str,
    ) -> Result<Option<Box<dyn Lease>>> {
        if path.exists() {
            return Ok(None);
        }
        let tmp = self.temp_path(path);
        let file = crate::token::create_private(&tmp)?;
        flock(&file, false).ctx("flock", &tmp)?;
        file.write_all_at(holder.as_bytes(), 0).ctx("write", &tmp)?;
        // The holder's record is durable before its name: a power cut must
        // not leave a pin whose body names no one (docs/FORMAT.md, "Order of writes").
        file.sync_data().ctx("fsync", &tmp)?;
        if !rename_noreplace(&tmp, path)? {
            fs::remove_file(&tmp).ctx("unlink", &tmp)?;
            return Ok(None);
        }
        Ok(Some(Box::new(LocalLease {
            key: key.to_string(),
            _file: file,
        })))
    }
}

impl Storage for LocalStorage {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>> {
        let path = self.path(key);
        let f = File::open(&path).map_err(|e| not_found_or_io(e, key, &path))?;
        let size = f.metadata().ctx("stat", &path)?.len();
        if size > limit {
            return Err(Error::TooLarge {
                what: "stored object",
                size,
                limit,
            });
        }
        let buf = read_to_end_chunked(&f, size, limit).ctx("read", &path)?;
        if buf.len() as u64 > limit {
            return Err(Error::TooLarge {
                what: "stored object",
                size: buf.len() as u64,
                limit,
            });
        }
        Ok(buf)
    }

    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let path = self.path(key);
        let f = File::open(&path).map_err(|e| not_found_or_io(e, key, &path))?;
        read_range(&f, key, &path, offset, len)
    }

    fn size(&self, key: &str) -> Result<Option<u64>> {
        let path = self.path(key);
        match fs::symlink_metadata(&path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("stat", &path, e)),
        }
    }

    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome> {
        let path = self.path(key);
        self.ensure_parent(&path)?;
        let tmp = self.temp_path(&path);
        write_new_file(&tmp, bytes)?;
        let outcome = self.put_file_if_absent(key, &tmp)?;
        if outcome == PutOutcome::AlreadyExists {
            fs::remove_file(&tmp).ctx("unlink-staged", &tmp)?;
        }
        Ok(outcome)
    }

    fn put_many_if_absent(&self, items: &[(String, Vec<u8>)]) -> Result<Vec<PutOutcome>> {
        let mut temps = Vec::with_capacity(items.len());
        for (key, _) in items {
            let path = self.path(key);
            self.ensure_parent(&path)?;
            temps.push((self.temp_path(&path), path));
        }
        let mut written = Vec::with_capacity(items.len());
        for ((tmp, _), (_, bytes)) in temps.iter().zip(items) {
            written.push((write_unsynced(tmp, bytes)?, tmp.as_path()));
        }
        sync_written(&self.root, written)?;
        let mut outcomes = Vec::with_capacity(items.len());
        let mut dirs = std::collections::BTreeSet::new();
        for (tmp, path) in &temps {
            if rename_noreplace(tmp, path)? {
                outcomes.push(PutOutcome::Created);
            } else {
                fs::remove_file(tmp).ctx("unlink-staged", tmp)?;
                outcomes.push(PutOutcome::AlreadyExists);
            }
            dirs.insert(path.parent().unwrap_or(&self.root).to_path_buf());
        }
        for dir in dirs {
            fsync_dir(&dir)?;
        }
        Ok(outcomes)
    }

    fn put_file_if_absent(&self, key: &str, staged: &Path) -> Result<PutOutcome> {
        let path = self.path(key);
        self.ensure_parent(&path)?;
        let created = rename_noreplace(staged, &path)?;
        if !created {
            // The existing name may come from an attempt that died before
            // its directory fsync; make it durable before anyone relies on it.
            fsync_dir(path.parent().unwrap_or(&self.root))?;
            return Ok(PutOutcome::AlreadyExists);
        }
        fsync_dir(path.parent().unwrap_or(&self.root))?;
        Ok(PutOutcome::Created)
    }

    fn replace(&self, key: &str, bytes: &[u8]) -> Result<()> {
        let path = self.path(key);
        self.ensure_parent(&path)?;
        let tmp = self.temp_path(&path);
        write_new_file(&tmp, bytes)?;
        self.replace_file(key, &tmp)
    }

    /// A rename over the name: a reader that opened the old file keeps
    /// its inode; the directory is fsynced so the new one is what stays.
    fn replace_file(&self, key: &str, staged: &Path) -> Result<()> {
        let path = self.path(key);
        self.ensure_parent(&path)?;
        fs::rename(staged, &path).ctx("rename", &path)?;
        fsync_dir(path.parent().unwrap_or(&self.root))
    }

    fn cas(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<CasOutcome> {
        let path = self.path(key);
        self.ensure_parent(&path)?;
        let lock_path = self.path(&format!("{key}.lock"));
        let lock = open_lock_file(&lock_path)?;
        flock(&lock, true).ctx("flock", &lock_path)?;
        let current = match fs::read(&path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        if current.as_deref() != expected {
            return Ok(CasOutcome::Mismatch { current });
        }
        let tmp = self.temp_path(&path);
        write_new_file(&tmp, new)?;
        fs::rename(&tmp, &path).ctx("rename", &path)?;
        fsync_dir(path.parent().unwrap_or(&self.root))?;
        Ok(CasOutcome::Swapped)
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let path = self.path(dir);
        let Some(rd) = read_dir_if_exists(&path)? else {
            return Ok(Vec::new());
        };
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.ctx("readdir", &path)?;
            if let Some(name) = entry.file_name().to_str() {
                if !name.starts_with(".tmp-") {
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn list_sizes(&self, dir: &str) -> Result<Vec<(String, u64)>> {
        let path = self.path(dir);
        let Some(rd) = read_dir_if_exists(&path)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.ctx("readdir", &path)?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let md = match entry.metadata() {
                Ok(md) => md,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("stat", entry.path(), e)),
            };
            if md.is_file() && !name.starts_with(".tmp-") {
                out.push((name, md.len()));
            }
        }
        out.sort();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("unlink", &path, e)),
        }
    }

    fn delete_dir(&self, dir: &str) -> Result<()> {
        super::check_scratch_dir(dir)?;
        let path = self.path(dir);
        match fs::remove_dir_all(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("rmdir", &path, e)),
        }
    }

    fn local_path(&self, key: &str) -> Option<PathBuf> {
        Some(self.path(key))
    }

    fn open_file(&self, key: &str) -> Result<Option<File>> {
        let path = self.path(key);
        File::open(&path)
            .map(Some)
            .map_err(|e| not_found_or_io(e, key, &path))
    }

    fn scratch_dir(&self, key: &str) -> Result<PathBuf> {
        super::check_scratch_dir(key)?;
        let dir = self.path(key);
        ensure_dir(&dir)?;
        Ok(dir)
    }

    fn lease(&self, key: &str, holder: &str, wait: bool) -> Result<TryLease> {
        let path = self.path(key);
        self.ensure_parent(&path)?;
        if let Some(lease) = self.try_create_locked(key, &path, holder)? {
            return Ok(TryLease::Acquired(lease));
        }
        let mut file = open_lock_file(&path)?;
        if !flock_past_probes(&file, wait).ctx("flock", &path)? {
            return Ok(TryLease::Busy {
                holder: read_holder(&mut file),
            });
        }
        file.set_len(0).ctx("truncate", &path)?;
        file.write_all_at(holder.as_bytes(), 0)
            .ctx("write", &path)?;
        Ok(TryLease::Acquired(Box::new(LocalLease {
            key: key.to_string(),
            _file: file,
        })))
    }

    fn lease_holder(&self, key: &str) -> Result<Option<String>> {
        match self.get(key, 64 << 10) {
            Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn probe_lease(&self, key: &str) -> Result<LeaseState> {
        let path = self.path(key);
        let mut file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LeaseState::Missing),
            Err(e) => return Err(Error::io("open-lock", &path, e)),
        };
        if flock(&file, false).ctx("flock", &path)? {
            return Ok(LeaseState::Unheld);
        }
        Ok(LeaseState::Held {
            holder: read_holder(&mut file),
        })
    }
}

fn not_found_or_io(e: io::Error, key: &str, path: &Path) -> Error {
    if e.kind() == io::ErrorKind::NotFound {
        Error::missing_object(key)
    } else {
        Error::io("open", path, e)
    }
}

/// Most bytes one read syscall asks for. A kernel without preemption
/// (PREEMPT_NONE, the usual server configuration) copies all of one read
/// before anything else runs on that CPU, and a whole segment is tens of
/// MiB; in 1 MiB pieces (~0.1 ms each) the mount's cat p99 under
/// back-to-back sweeps was lower in alternated runs (docs/BENCHMARKS.md,
/// "Sweep").
pub(crate) const READ_CHUNK: usize = 1 << 20;

/// `f` (just opened) from its start to its end, or `limit + 1` bytes if
/// it is longer, [`READ_CHUNK`] bytes per syscall; `size` is its length
/// when opened. Read into spare capacity: zeroing the buffer first (a
/// `vec![0; size]` that the allocator serves from its heap) made the
/// mount's cold `stat` ~30% slower.
fn read_to_end_chunked(mut f: &File, size: u64, limit: u64) -> io::Result<Vec<u8>> {
    let cap = limit.saturating_add(1);
    let mut buf = Vec::with_capacity(size.min(cap) as usize);
    loop {
        let want = (cap - buf.len() as u64).min(READ_CHUNK as u64);
        let before = buf.len();
        Read::by_ref(&mut f).take(want).read_to_end(&mut buf)?;
        if want == 0 || ((buf.len() - before) as u64) < want {
            return Ok(buf);
        }
    }
}

/// Fill `buf` from `offset`, [`READ_CHUNK`] bytes per syscall.
pub(crate) fn read_exact_chunked(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut at = offset;
    for chunk in buf.chunks_mut(READ_CHUNK) {
        f.read_exact_at(chunk, at)?;
        at += chunk.len() as u64;
    }
    Ok(())
}

/// `len` bytes at `offset` of an open object file; a range past its end, or
/// a file that shrinks under the read, is corruption of `key`.
pub(crate) fn read_range(
    f: &File,
    key: &str,
    path: &Path,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>> {
    let size = f.metadata().ctx("stat", path)?.len();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::corrupt(
            "object",
            key,
            format!("range past the end: offset={offset} len={len} size={size}"),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    read_exact_chunked(f, &mut buf, offset).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Error::corrupt(
                "object",
                key,
                format!("short read: offset={offset} len={len}"),
            )
        } else {
            Error::io("pread", path, e)
        }
    })?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_reads_return_whole_files_and_stop_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        for len in [0, 1, 4097, READ_CHUNK, 2 * READ_CHUNK + 5] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            fs::write(&path, &data).unwrap();
            let open = || File::open(&path).unwrap();
            assert_eq!(
                read_to_end_chunked(&open(), len as u64, 1 << 30).unwrap(),
                data
            );
            // Opened when shorter: what was appended since is read too.
            assert_eq!(read_to_end_chunked(&open(), 0, 1 << 30).unwrap(), data);
            let over = read_to_end_chunked(&open(), len as u64, 100).unwrap();
            assert_eq!(over.len(), len.min(101), "limit + 1 bytes at most");
            let mut buf = vec![0u8; len];
            read_exact_chunked(&open(), &mut buf, 0).unwrap();
            assert_eq!(buf, data);
        }
    }
}
