//! Extended attributes as a row stores them (`Meta::xattrs`): the canonical
//! encoding and its limits (docs/FORMAT.md, "Extended attributes").
//!
//! POSIX ACLs are the `system.posix_acl_access` and
//! `system.posix_acl_default` attributes and travel like any other. The
//! encoding is sorted by name, so equal attribute sets encode equally and
//! enter the generation identity the same way. Limits are checked when a
//! set is encoded from the source and when it is decoded from the store, so
//! an oversized set is refused, never truncated. Reading and writing them on
//! a filesystem is `crate::xattr`.

use crate::error::{Error, Result};

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
