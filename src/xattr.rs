//! Extended attributes: the canonical encoding a row stores (`Meta::xattrs`)
//! and reading and writing them on the local filesystem.
//!
//! POSIX ACLs are the `system.posix_acl_access` and
//! `system.posix_acl_default` attributes and travel like any other. The
//! encoding is sorted by name, so equal attribute sets encode equally and
//! enter the generation identity the same way (docs/FORMAT.md,
//! "Extended attributes"). Limits are checked on read from the source and on
//! decode from the store, so an oversized set is refused, never truncated.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Longest attribute name, in bytes (the kernel's `XATTR_NAME_MAX`).
pub const MAX_NAME: usize = 255;
/// Largest single value, in bytes (the kernel's `XATTR_SIZE_MAX`).
pub const MAX_VALUE: usize = 64 << 10;
/// Largest encoded set per row: it must fit one journal record with the
/// row's path and fields.
pub const MAX_ENCODED: usize = 48 << 10;

/// One attribute: name (without NUL) and value.
pub type Attr = (Vec<u8>, Vec<u8>);

/// Encode `attrs` canonically: a `u32` count, then per attribute sorted by
/// name a `u8` name length, the name, a `u32` value length and the value
/// (little-endian). An empty set encodes as nothing.
pub fn encode(mut attrs: Vec<Attr>) -> Result<Vec<u8>> {
    if attrs.is_empty() {
        return Ok(Vec::new());
    }
    attrs.sort();
    let mut out = Vec::new();
    out.extend_from_slice(&(attrs.len() as u32).to_le_bytes());
    for (name, value) in &attrs {
        check(name, value.len())?;
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    if out.len() > MAX_ENCODED {
        return Err(Error::TooLarge {
            what: "extended attributes",
            size: out.len() as u64,
            limit: MAX_ENCODED as u64,
        });
    }
    Ok(out)
}

fn check(name: &[u8], value_len: usize) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains(&0) {
        return Err(Error::Invalid(format!(
            "extended attribute name `{}` is empty, contains NUL or is over {MAX_NAME} bytes",
            String::from_utf8_lossy(name)
        )));
    }
    if value_len > MAX_VALUE {
        return Err(Error::TooLarge {
            what: "extended attribute value",
            size: value_len as u64,
            limit: MAX_VALUE as u64,
        });
    }
    Ok(())
}

/// Decode an encoded set; `what` names its source in errors. Refuses
/// truncation, trailing bytes, names out of order and anything over the
/// limits.
pub fn decode(buf: &[u8], what: &str) -> Result<Vec<Attr>> {
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |why: &str| Error::corrupt("extended attributes", what, why.to_string());
    if buf.len() > MAX_ENCODED {
        return Err(bad("over the size limit"));
    }
    let mut pos = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let s = buf.get(pos..pos + n).ok_or_else(|| bad("truncated"))?;
        pos += n;
        Ok(s)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default());
    let mut attrs: Vec<Attr> = Vec::new();
    for _ in 0..count {
        let name_len = take(1)?[0] as usize;
        let name = take(name_len)?.to_vec();
        let value_len = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
        check(&name, value_len).map_err(|_| bad("attribute over a limit"))?;
        let value = take(value_len)?.to_vec();
        if attrs.last().is_some_and(|(prev, _)| *prev >= name) {
            return Err(bad("names out of order"));
        }
        attrs.push((name, value));
    }
    if pos != buf.len() || count == 0 {
        return Err(bad("trailing bytes or empty set"));
    }
    Ok(attrs)
}

/// The names in an encoded set, each NUL-terminated, as `listxattr` returns.
pub fn list(buf: &[u8], what: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (name, _) in decode(buf, what)? {
        out.extend_from_slice(&name);
        out.push(0);
    }
    Ok(out)
}

/// The value of `name` in an encoded set.
pub fn get(buf: &[u8], name: &[u8], what: &str) -> Result<Option<Vec<u8>>> {
    Ok(decode(buf, what)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v))
}

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
    let names = read_sized(|buf, len| {
        // SAFETY: `c` is NUL-terminated; `buf` has room for `len` bytes
        // (null with zero length to ask the size).
        unsafe { libc::listxattr(c.as_ptr(), buf, len) }
    });
    let names = match names {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut attrs = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        let value = read_sized(|buf, len| {
            // SAFETY: as above; `cname` is NUL-terminated.
            unsafe { libc::getxattr(c.as_ptr(), cname.as_ptr(), buf.cast(), len) }
        });
        match value {
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
fn read_sized(call: impl Fn(*mut libc::c_char, usize) -> isize) -> io::Result<Vec<u8>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(n: &str, v: &[u8]) -> Attr {
        (n.as_bytes().to_vec(), v.to_vec())
    }

    #[test]
    fn encoding_is_sorted_and_round_trips() {
        let a = encode(vec![attr("user.b", b"2"), attr("user.a", b"")]).unwrap();
        let b = encode(vec![attr("user.a", b""), attr("user.b", b"2")]).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            decode(&a, "t").unwrap(),
            vec![attr("user.a", b""), attr("user.b", b"2")]
        );
        assert_eq!(list(&a, "t").unwrap(), b"user.a\0user.b\0");
        assert_eq!(get(&a, b"user.b", "t").unwrap(), Some(b"2".to_vec()));
        assert!(encode(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn corrupt_or_oversized_sets_are_refused() {
        let a = encode(vec![attr("user.a", b"xyz")]).unwrap();
        assert!(decode(&a[..a.len() - 1], "t").is_err());
        let mut longer = a.clone();
        longer.push(0);
        assert!(decode(&longer, "t").is_err());
        let big = vec![0u8; 40 << 10];
        assert!(encode(vec![attr("user.a", &big), attr("user.b", &big)]).is_err());
        assert!(encode(vec![attr("user.a", &vec![0u8; MAX_VALUE + 1])]).is_err());
    }
}
