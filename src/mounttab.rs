//! The kernel's mount table as strata sees it: what is mounted on a mount
//! point, whether a strata daemon still serves it, and recovering a stale
//! one.
//!
//! A strata mount is stale when no live daemon serves its FUSE connection:
//! after a SIGKILL the kernel usually ends the connection and leaves a dead
//! mount ("Transport endpoint is not connected"), and, rarely, a daemon
//! thread stuck in the kernel keeps the connection open so every access
//! hangs (docs/OPERATIONS.md). Whether a daemon serves a mount is asked,
//! never guessed: each live daemon of the mount's store answers `status`
//! on its control socket with the FUSE connection it serves. A daemon that
//! is alive but does not answer leaves the mount alone. Recovery aborts the
//! connection through fusectl, so every waiting request fails instead of
//! hanging, and then detaches the mount.
//!
//! Nothing here reads through the mount point itself, so none of it can
//! hang on the mount it inspects.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The file system type of a strata mount: `fuse` when mounted with
/// mount(2) directly (as root), `fuse.strata` through fusermount3.
const FSTYPES: [&str; 2] = ["fuse", "fuse.strata"];
/// Where the kernel's FUSE control file system is mounted.
const FUSECTL: &str = "/sys/fs/fuse/connections";
/// How long a live daemon has to answer `status` before the mount is left
/// alone as unresponsive.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub point: PathBuf,
    pub fstype: String,
    pub source: String,
    /// The device's minor number: for FUSE, the connection number that
    /// names its directory under `/sys/fs/fuse/connections`.
    pub minor: u32,
}

impl MountEntry {
    /// The store directory of a strata mount (its source is `strata:<dir>`).
    pub fn store_dir(&self) -> Option<PathBuf> {
        if !FSTYPES.contains(&self.fstype.as_str()) {
            return None;
        }
        self.source.strip_prefix("strata:").map(PathBuf::from)
    }
}

/// Who, if anyone, serves what is mounted on a mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Occupant {
    /// Nothing is mounted there.
    Free,
    /// Something other than strata is mounted there.
    Foreign(MountEntry),
    /// A live strata daemon answers for the mount.
    Served { entry: MountEntry, pid: u32 },
    /// A live daemon of the store does not answer, so whether it serves
    /// the mount cannot be told (a stopped or overloaded daemon).
    Unresponsive { entry: MountEntry, pids: Vec<u32> },
    /// A strata mount that no live daemon serves.
    Stale(MountEntry),
}

/// An absolute, symlink-free form of `path` found without looking up the
/// last component through a file system when it is a mount point: a hung
/// mount would hang `realpath` on it.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return std::fs::canonicalize(path).map_err(|e| Error::io("resolve", path, e));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let joined = std::fs::canonicalize(parent)
        .map_err(|e| Error::io("resolve", parent, e))?
        .join(name);
    if find(&joined)?.is_some() {
        return Ok(joined);
    }
    std::fs::canonicalize(&joined).map_err(|e| Error::io("resolve", &joined, e))
}

/// The topmost mount on `point` (an absolute, resolved path), if any.
pub fn find(point: &Path) -> Result<Option<MountEntry>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("read", "/proc/self/mountinfo", e))?;
    Ok(table
        .lines()
        .rev()
        .filter_map(parse_line)
        .find(|m| m.point == point))
}

/// Parse one mountinfo line: `id parent major:minor root point options
/// [optional...] - fstype source superoptions`, with `\NNN` octal escapes.
fn parse_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let dash = fields.iter().position(|f| *f == "-")?;
    let minor = fields.get(2)?.split_once(':')?.1.parse().ok()?;
    Some(MountEntry {
        point: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(fields.get(4)?))),
        fstype: String::from_utf8_lossy(&unescape(fields.get(dash + 1)?)).into_owned(),
        source: String::from_utf8_lossy(&unescape(fields.get(dash + 2)?)).into_owned(),
        minor,
    })
}

/// Undo the kernel's `\NNN` octal escaping of space, tab, newline and `\`.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| {
            b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)) && d[0] <= b'3'
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// Who serves the mount on `point` (resolved).
pub fn occupant(point: &Path) -> Result<Occupant> {
    let Some(entry) = find(point)? else {
        return Ok(Occupant::Free);
    };
    let Some(store) = entry.store_dir() else {
        return Ok(Occupant::Foreign(entry));
    };
    let mut silent = Vec::new();
    for socket in crate::control::sockets(&store) {
        let Some(pid) = socket_pid(&socket) else {
            continue;
        };
        if !alive(pid) {
            continue;
        }
        match crate::control::ask_within(
            &socket,
            &crate::control::Command::Status,
            Some(ASK_TIMEOUT),
        ) {
            Ok(Some(status)) if serves(&status, &entry) => {
                return Ok(Occupant::Served { entry, pid });
            }
            Ok(_) => {}
            Err(_) => silent.push(pid),
        }
    }
    if silent.is_empty() {
        Ok(Occupant::Stale(entry))
    } else {
        Ok(Occupant::Unresponsive {
            entry,
            pids: silent,
        })
    }
}

/// Whether a daemon's `status` says it serves this mount: by its FUSE
/// connection, or by mount point from a daemon that does not report one.
fn serves(status: &serde_json::Value, entry: &MountEntry) -> bool {
    match status["fuse_connection"].as_u64() {
        Some(c) => c == u64::from(entry.minor),
        None => status["mountpoint"].as_str().map(Path::new) == Some(entry.point.as_path()),
    }
}

/// The pid in a socket's name (`mountd-<pid>.sock`).
fn socket_pid(socket: &Path) -> Option<u32> {
    socket
        .file_stem()?
        .to_str()?
        .strip_prefix("mountd-")?
        .parse()
        .ok()
}

/// Whether process `pid` exists and is not exiting. A SIGKILLed daemon
/// with a thread stuck in the kernel shows as a zombie leader while its
/// sockets stay open: it will never answer.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// What [`recover`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// The connection was aborted through fusectl (false when it was
    /// already gone or fusectl is unavailable).
    pub aborted: bool,
}

/// Abort a stale mount's FUSE connection (failing every request that waits
/// on it) and detach the mount. Only for [`Occupant::Stale`].
pub fn recover(entry: &MountEntry) -> Result<Recovered> {
    let aborted = abort_connection(entry.minor);
    unmount(&entry.point, true).map_err(|e| Error::io("umount", &entry.point, e))?;
    Ok(Recovered { aborted })
}

/// Unmount `point`: lazily (`MNT_DETACH`: detached now, open files served
/// until their last close) or not (EBUSY while anything is open). Only
/// root may call umount2; a user unmounts a FUSE mount of their own
/// through the setuid `fusermount3 -u [-z]`, as libfuse does, and its
/// "busy" answer comes back as EBUSY.
pub fn unmount(point: &Path, lazy: bool) -> std::io::Result<()> {
    let c = CString::new(point.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    // SAFETY: geteuid has no preconditions.
    if e.raw_os_error() != Some(libc::EPERM) || unsafe { libc::geteuid() } == 0 {
        return Err(e);
    }
    fusermount_unmount(point, lazy)
}

fn fusermount_unmount(point: &Path, lazy: bool) -> std::io::Result<()> {
    let out = Command::new("fusermount3")
        .arg(if lazy { "-uz" } else { "-u" })
        .arg(point)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| std::io::Error::new(e.kind(), format!("fusermount3: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    if said.contains("busy") {
        return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
    }
    Err(std::io::Error::other(format!(
        "fusermount3 -u failed ({}): {}",
        out.status,
        said.trim()
    )))
}

/// Write `1` to the connection's fusectl `abort` file, mounting fusectl
/// first if needed. False when the connection is gone or fusectl cannot be
/// used (not root); detaching still works then, but a request already
/// stuck on the connection stays stuck.
fn abort_connection(minor: u32) -> bool {
    let conns = Path::new(FUSECTL);
    if !conns.join(minor.to_string()).exists() {
        mount_fusectl();
    }
    std::fs::write(conns.join(minor.to_string()).join("abort"), b"1").is_ok()
}

fn mount_fusectl() {
    let (Ok(src), Ok(dir), Ok(kind)) = (
        CString::new("fusectl"),
        CString::new(FUSECTL),
        CString::new("fusectl"),
    ) else {
        return;
    };
    // SAFETY: valid NUL-terminated strings; no data argument.
    unsafe {
        libc::mount(
            src.as_ptr(),
            dir.as_ptr(),
            kind.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
}

/// Make `point` (resolved) ready for a new strata mount: free, or stale and
/// recovered now. A served, unresponsive or foreign mount is a conflict
/// naming what is there.
pub fn prepare(point: &Path) -> Result<Option<Recovered>> {
    match occupant(point)? {
        Occupant::Free => Ok(None),
        Occupant::Stale(entry) => recover(&entry).map(Some),
        Occupant::Served { pid, .. } => Err(Error::Conflict(format!(
            "already mounted: strata-mountd pid {pid} serves mountpoint=`{}`",
            point.display()
        ))),
        Occupant::Unresponsive { pids, .. } => Err(Error::Conflict(format!(
            "already mounted, and strata-mountd pid(s) {pids:?} of its store do not answer; \
             stop them, then mount again: mountpoint=`{}`",
            point.display()
        ))),
        Occupant::Foreign(e) => Err(Error::Conflict(format!(
            "already mounted: fstype=`{}` source=`{}` mountpoint=`{}`",
            e.fstype,
            e.source,
            point.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mountinfo_line_with_escapes_and_optional_fields_parses() {
        let line = "36 35 0:52 / /tmp/a\\040b\\134c rw,nosuid shared:1 master:2 - fuse.strata strata:/st\\040x ro,user_id=0";
        let e = parse_line(line).unwrap();
        assert_eq!(e.point, Path::new("/tmp/a b\\c"));
        assert_eq!(e.fstype, "fuse.strata");
        assert_eq!(e.minor, 52);
        assert_eq!(e.store_dir(), Some(PathBuf::from("/st x")));
    }

    #[test]
    fn a_malformed_line_is_skipped_and_non_strata_mounts_have_no_store() {
        assert_eq!(parse_line("36 35 0:52 / /x rw"), None);
        assert_eq!(parse_line("36 35 nodev / /x rw - ext4 /dev/sda rw"), None);
        let e = parse_line("1 2 8:1 / /mnt rw - ext4 strata:/x rw").unwrap();
        assert_eq!(e.store_dir(), None);
        assert_eq!(unescape("\\0"), b"\\0");
        assert_eq!(unescape("a\\777"), b"a\\777");
    }

    #[test]
    fn the_root_is_mounted_and_a_fresh_directory_is_free() {
        assert!(find(Path::new("/")).unwrap().is_some());
        let dir = tempfile::tempdir().unwrap();
        let point = resolve(dir.path()).unwrap();
        assert_eq!(occupant(&point).unwrap(), Occupant::Free);
        assert_eq!(prepare(&point).unwrap(), None);
    }

    #[test]
    fn this_process_is_alive_and_a_socket_name_carries_its_pid() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX));
        assert_eq!(socket_pid(Path::new("/s/run/mountd-42.sock")), Some(42));
        assert_eq!(socket_pid(Path::new("/s/run/other-42.sock")), None);
    }
}
