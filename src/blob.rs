//! Blob reads: content bytes are verified against their BLAKE3 digest before
//! they are served (invariant 2); a mismatch is `Error::Corrupt`, never
//! wrong bytes. Packed frames are bounded by the row's size before
//! decompression.

use crate::error::{Error, Result};
use crate::row::{BlobLoc, Codec, Kind, Row};
use crate::store::{keys, Store};
use std::io::Write;

/// Files up to this size are read whole, verified, then served.
const WHOLE_READ_LIMIT: u64 = 64 << 20;
const CHUNK: u64 = 8 << 20;

fn check_digest(row: &Row, bytes: &[u8], file: &str) -> Result<()> {
    check_digest_of(row, blake3::hash(bytes).as_bytes(), file)
}

fn check_digest_of(row: &Row, actual: &[u8; 32], file: &str) -> Result<()> {
    let want = row
        .digest
        .ok_or_else(|| Error::corrupt("row", file, "file row without digest"))?;
    if actual != &want {
        return Err(Error::corrupt(
            "blob",
            file,
            format!(
                "blake3 mismatch for path=`{}`",
                crate::row::show(&row.path())
            ),
        ));
    }
    Ok(())
}

/// Decode one pack frame into exactly `size` bytes.
pub fn decode_frame(codec: Codec, frame: Vec<u8>, size: u64, file: &str) -> Result<Vec<u8>> {
    let out = match codec {
        Codec::Raw => frame,
        Codec::Zstd => {
            crate::format::zstd_decode(&frame, size).map_err(|e| Error::corrupt("pack", file, e))?
        }
    };
    if out.len() as u64 != size {
        return Err(Error::corrupt(
            "pack",
            file,
            format!("frame decodes to size={} expected={size}", out.len()),
        ));
    }
    Ok(out)
}

/// The verified content of a small (packed or whole-readable) file.
pub fn read(store: &Store, row: &Row) -> Result<Vec<u8>> {
    if row.kind != Kind::File {
        return Err(Error::Invalid(format!(
            "not a file: path=`{}`",
            crate::row::show(&row.path())
        )));
    }
    match row.blob {
        BlobLoc::None if row.size == 0 => {
            check_digest(row, &[], "empty file")?;
            Ok(Vec::new())
        }
        BlobLoc::None => Err(Error::corrupt(
            "row",
            crate::row::show(&row.path()),
            "non-empty file without blob",
        )),
        BlobLoc::Packed { pack, .. } => {
            store.read_fresh(&keys::pack(&hex::encode(pack)), || packed(store, row))
        }
        BlobLoc::Chunked { .. } if row.size > WHOLE_READ_LIMIT => Err(Error::TooLarge {
            what: "chunked file read whole",
            size: row.size,
            limit: WHOLE_READ_LIMIT,
        }),
        BlobLoc::Chunked { .. } => {
            let mut out = Vec::with_capacity(row.size as usize);
            copy_chunked(store, row, &mut out)?;
            Ok(out)
        }
        BlobLoc::Standalone => {
            let name = hex::encode(row.digest.unwrap_or_default());
            let key = keys::blob(&name);
            store.read_fresh(&key, || {
                let bytes = store.storage().get(&key, row.size.max(WHOLE_READ_LIMIT))?;
                if bytes.len() as u64 != row.size {
                    return Err(Error::corrupt("blob", &name, "size differs from row"));
                }
                check_digest(row, &bytes, &name)?;
                Ok(bytes)
            })
        }
    }
}

/// The stored frame of a packed file (unverified), its codec and pack name.
fn fetch_frame(store: &Store, row: &Row) -> Result<(Vec<u8>, Codec, String)> {
    let BlobLoc::Packed {
        pack,
        offset,
        len,
        codec,
    } = row.blob
    else {
        return Err(Error::Invalid("not a packed file".into()));
    };
    let name = hex::encode(pack);
    if row.size >= crate::format::pack::STANDALONE_MIN || len > row.size {
        return Err(Error::corrupt(
            "row",
            &name,
            format!("packed frame out of bounds: len={len} size={}", row.size),
        ));
    }
    let frame = store.storage().get_range(&keys::pack(&name), offset, len)?;
    Ok((frame, codec, name))
}

fn packed(store: &Store, row: &Row) -> Result<Vec<u8>> {
    let (frame, codec, name) = fetch_frame(store, row)?;
    let bytes = decode_frame(codec, frame, row.size, &name)?;
    check_digest(row, &bytes, &name)?;
    Ok(bytes)
}

/// The stored frame of a packed file, verified against the row's digest
/// (for copying it into another pack unchanged).
pub fn packed_frame(store: &Store, row: &Row) -> Result<Vec<u8>> {
    let BlobLoc::Packed { pack, .. } = row.blob else {
        return Err(Error::Invalid("not a packed file".into()));
    };
    store.read_fresh(&keys::pack(&hex::encode(pack)), || {
        let (frame, codec, name) = fetch_frame(store, row)?;
        let bytes = decode_frame(codec, frame.clone(), row.size, &name)?;
        check_digest(row, &bytes, &name)?;
        Ok(frame)
    })
}

/// Write a file's verified content to `out`. Large standalone blobs are
/// verified in one pass and copied in a second; the copy is re-hashed and a
/// change between passes is reported as corruption.
pub fn copy_to(store: &Store, row: &Row, out: &mut dyn Write) -> Result<()> {
    if let BlobLoc::Chunked { .. } = row.blob {
        return copy_chunked(store, row, out);
    }
    let large = matches!(row.blob, BlobLoc::Standalone) && row.size > WHOLE_READ_LIMIT;
    if !large {
        let bytes = read(store, row)?;
        return out
            .write_all(&bytes)
            .map_err(|e| Error::io("write", "output", e));
    }
    let name = hex::encode(row.digest.unwrap_or_default());
    let key = keys::blob(&name);
    match store.storage().size(&key)? {
        Some(s) if s == row.size => {}
        _ => {
            return Err(Error::corrupt(
                "blob",
                &name,
                "missing or size differs from row",
            ))
        }
    }
    stream(store, row, &key, None)?;
    stream(store, row, &key, Some(out))
}

/// Copy a chunked file (each chunk checked as it is read), then check the
/// whole content against the row's digest.
fn copy_chunked(store: &Store, row: &Row, out: &mut dyn Write) -> Result<()> {
    let mut tee = HashingWriter {
        hasher: blake3::Hasher::new(),
        out,
    };
    crate::chunks::copy_to(store, row, &mut tee)?;
    let list = match row.blob {
        BlobLoc::Chunked { list, .. } => hex::encode(list),
        _ => String::new(),
    };
    check_digest_of(row, tee.hasher.finalize().as_bytes(), &list)
}

struct HashingWriter<'a> {
    hasher: blake3::Hasher,
    out: &'a mut dyn Write,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn stream(store: &Store, row: &Row, key: &str, mut out: Option<&mut dyn Write>) -> Result<()> {
    let mut hasher = blake3::Hasher::new();
    let mut off = 0;
    while off < row.size {
        let n = CHUNK.min(row.size - off);
        let chunk = store.storage().get_range(key, off, n)?;
        hasher.update(&chunk);
        if let Some(o) = out.as_mut() {
            o.write_all(&chunk)
                .map_err(|e| Error::io("write", "output", e))?;
        }
        off += n;
    }
    if Some(*hasher.finalize().as_bytes()) != row.digest {
        return Err(Error::corrupt(
            "blob",
            key,
            format!(
                "blake3 mismatch for path=`{}`",
                crate::row::show(&row.path())
            ),
        ));
    }
    Ok(())
}
