//! Opening what lies below the committed directory, and nothing else.
//!
//! Owns the rule that a commit never reads outside `DIR`, even while
//! someone swaps a directory or file for a symlink during the walk (issue
//! 7, ingest safety). The walk and ingest never resolve a path below `DIR`
//! by name from `/`: every open goes through
//! `openat2(root_fd, rel, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, so the kernel refuses (`ELOOP`, `EXDEV`) any
//! resolution that meets a symlink, including the last component, or that
//! leaves `DIR`. An entry is stat'ed and its link read relative to its
//! parent directory's open descriptor (`/proc/self/fd/N/name`: the magic
//! link is exactly that open directory, and the last component is not
//! followed), and a directory is listed through its own descriptor, whose
//! entries std stats with `statx(dirfd, name, AT_SYMLINK_NOFOLLOW)`.
//! Files are opened `O_NONBLOCK`, so a FIFO swapped in for a file cannot
//! block the commit in `open`.
//!
//! `DIR` itself may be a symlink to the directory: it is resolved once,
//! when the root descriptor is opened.

use std::ffi::{CString, OsStr};
use std::fs::{self, File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why a path below the root was not opened: a symlink on the way.
const SYMLINK_REFUSED: &str =
    "a symlink on the way (strata does not follow symlinks below the committed directory)";
/// Why a path below the root was not opened: it resolves outside.
const ESCAPE_REFUSED: &str = "the path leads outside the committed directory";

/// The kernel's `struct open_how` (linux/openat2.h), version 0.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The committed directory, held open.
pub(crate) struct Beneath {
    root: OwnedFd,
}

impl Beneath {
    /// Open `dir` (following it if it is a symlink) as the root of a walk.
    pub(crate) fn open(dir: &Path) -> io::Result<Beneath> {
        let path = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: `path` is a valid NUL-terminated string; the returned
        // descriptor is owned by nothing else.
        let fd = unsafe { libc::open(path.as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is not shared.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Beneath { root })
    }

    /// Open `rel` (a path below the root; empty for the root) with `flags`,
    /// refusing symlinks anywhere on the way and any escape from the root.
    fn open_at(&self, rel: &[u8], flags: libc::c_int) -> io::Result<File> {
        let rel = if rel.is_empty() { &b"."[..] } else { rel };
        let path = CString::new(rel).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: libc::RESOLVE_BENEATH
                | libc::RESOLVE_NO_SYMLINKS
                | libc::RESOLVE_NO_MAGICLINKS,
        };
        loop {
            // SAFETY: the arguments are a live descriptor, a NUL-terminated
            // path and an `open_how` of the size passed.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.root.as_raw_fd(),
                    path.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            if fd >= 0 {
                // SAFETY: the kernel returned a new descriptor we own.
                return Ok(unsafe { File::from_raw_fd(fd as libc::c_int) });
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                // A concurrent rename raced the resolution; the kernel asks
                // to retry.
                Some(libc::EAGAIN) => continue,
                Some(libc::ELOOP) => return Err(io::Error::other(SYMLINK_REFUSED)),
                Some(libc::EXDEV) => return Err(io::Error::other(ESCAPE_REFUSED)),
                _ => return Err(err),
            }
        }
    }

    /// A regular file below the root, for reading.
    pub(crate) fn open_file(&self, rel: &[u8]) -> io::Result<File> {
        self.open_at(rel, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK)
    }

    /// The entries of directory `rel`, read through its own descriptor.
    pub(crate) fn read_dir(&self, rel: &[u8]) -> io::Result<fs::ReadDir> {
        let dir = self.open_at(rel, libc::O_PATH | libc::O_DIRECTORY)?;
        fs::read_dir(fd_path(&dir, b""))
    }

    /// The metadata of `rel` itself (not of what a symlink names).
    pub(crate) fn lstat(&self, rel: &[u8]) -> io::Result<Metadata> {
        match rel.iter().rposition(|&b| b == b'/') {
            _ if rel.is_empty() => self.open_at(rel, libc::O_PATH)?.metadata(),
            Some(i) => self.lstat_in(&rel[..i], &rel[i + 1..]),
            None => self.lstat_in(b"", rel),
        }
    }

    fn lstat_in(&self, parent: &[u8], name: &[u8]) -> io::Result<Metadata> {
        let dir = self.open_at(parent, libc::O_PATH | libc::O_DIRECTORY)?;
        fs::symlink_metadata(fd_path(&dir, name))
    }

    /// The target of symlink `rel`.
    pub(crate) fn read_link(&self, rel: &[u8]) -> io::Result<PathBuf> {
        let (parent, name) = match rel.iter().rposition(|&b| b == b'/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => (&b""[..], rel),
        };
        let dir = self.open_at(parent, libc::O_PATH | libc::O_DIRECTORY)?;
        fs::read_link(fd_path(&dir, name))
    }
}

impl Beneath {
    /// The extended attributes of `rel` itself (a symlink's own, not its
    /// target's), read through an `O_PATH` descriptor of it.
    pub(crate) fn xattrs(&self, rel: &[u8]) -> io::Result<Vec<crate::xattr::Attr>> {
        let entry = self.open_at(rel, libc::O_PATH | libc::O_NOFOLLOW)?;
        crate::xattr::read(&fd_path(&entry, b""))
    }
}

/// `/proc/self/fd/N[/name]`: resolves to the open directory itself, never
/// to whatever now has its name.
fn fd_path(dir: &File, name: &[u8]) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    if !name.is_empty() {
        p.push(OsStr::from_bytes(name));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    #[test]
    fn symlinks_anywhere_below_the_root_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), b"s").unwrap();
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("d")).unwrap();
        fs::write(root.path().join("d/f"), b"f").unwrap();
        symlink(outside.path(), root.path().join("d/link")).unwrap();
        symlink(outside.path().join("secret"), root.path().join("s")).unwrap();
        let b = Beneath::open(root.path()).unwrap();
        let mut text = String::new();
        b.open_file(b"d/f")
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "f");
        let refused = |e: io::Error| e.to_string();
        assert_eq!(
            refused(b.open_file(b"d/link/secret").unwrap_err()),
            SYMLINK_REFUSED
        );
        assert_eq!(refused(b.open_file(b"s").unwrap_err()), SYMLINK_REFUSED);
        assert_eq!(refused(b.read_dir(b"d/link").unwrap_err()), SYMLINK_REFUSED);
        assert_eq!(refused(b.open_file(b"../x").unwrap_err()), ESCAPE_REFUSED);
        assert!(b.lstat(b"d/link").unwrap().file_type().is_symlink());
        assert_eq!(b.read_link(b"s").unwrap(), outside.path().join("secret"));
        assert!(b.lstat(b"d/link/secret").is_err());
        assert!(b.lstat(b"").unwrap().is_dir());
    }

    /// A FIFO where the walk saw a file (swapped in meanwhile) is opened
    /// without blocking, and its descriptor says it is no file.
    #[test]
    fn a_fifo_opens_without_blocking() {
        use std::os::unix::fs::FileTypeExt;
        let root = tempfile::tempdir().unwrap();
        let fifo = CString::new(root.path().join("f").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let b = Beneath::open(root.path()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(b.open_file(b"f").map(|f| f.metadata()));
        });
        let opened = rx.recv_timeout(std::time::Duration::from_secs(10));
        let md = opened.expect("open returned").unwrap().unwrap();
        assert!(md.file_type().is_fifo() && !md.is_file());
    }
}
