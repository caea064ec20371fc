//! Extended attributes on the local filesystem: read from a source entry,
//! written onto a restored one. What a row stores is
//! [`crate::format::xattrs`].

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub use crate::format::xattrs::Attr;

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Every attribute of `path` as the caller may read it. `path` is followed
/// (the walk passes `/proc/self/fd/N` of an `O_PATH` descriptor, which
/// names the entry itself, symlinks included). A filesystem without
/// attributes reads as none.
pub fn read(path: &Path) -> io::Result<Vec<Attr>> {
    let c = cpath(path)?;
    read_with(
        // SAFETY: `c` is NUL-terminated; `buf` has room for `len` bytes
        // (null with zero length to ask the size).
        |buf, len| unsafe { libc::listxattr(c.as_ptr(), buf, len) },
        // SAFETY: as above; `name` is NUL-terminated.
        |name, buf, len| unsafe { libc::getxattr(c.as_ptr(), name, buf.cast(), len) },
    )
}

/// Every attribute of the open file `file` (no path is resolved: the
/// commit's hash workers read each file's attributes through the
/// descriptor they read its content from).
pub fn read_fd(file: &std::fs::File) -> io::Result<Vec<Attr>> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    read_with(
        // SAFETY: a live descriptor; `buf` has room for `len` bytes.
        |buf, len| unsafe { libc::flistxattr(fd, buf, len) },
        // SAFETY: as above; `name` is NUL-terminated.
        |name, buf, len| unsafe { libc::fgetxattr(fd, name, buf.cast(), len) },
    )
}

/// A size-then-fill syscall: called with a null buffer for the size.
type SizedCall<'a> = &'a dyn Fn(*mut libc::c_char, usize) -> isize;

fn read_with(
    list: impl Fn(*mut libc::c_char, usize) -> isize,
    get: impl Fn(*const libc::c_char, *mut libc::c_char, usize) -> isize,
) -> io::Result<Vec<Attr>> {
    let names = match read_sized(&list) {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut attrs = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        match read_sized(&|buf, len| get(cname.as_ptr(), buf, len)) {
            Ok(v) => attrs.push((name.to_vec(), v)),
            // Removed between list and get.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(attrs)
}

fn unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOTSUP)
}

/// Call a size-then-fill xattr syscall until the buffer fits (a set may
/// grow between the two calls).
fn read_sized(call: SizedCall<'_>) -> io::Result<Vec<u8>> {
    for _ in 0..8 {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize];
        let got = call(buf.as_mut_ptr().cast(), buf.len());
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
    Err(io::Error::other(
        "extended attributes kept changing while read",
    ))
}

/// Set one attribute on `path` itself (not what a symlink names).
pub fn set(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let c = cpath(path)?;
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: both strings are NUL-terminated; `value` is live for the call.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            cname.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
