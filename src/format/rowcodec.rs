//! Compact binary encoding of one [`Row`], used by journals and spill runs.
//! Layout: docs/FORMAT.md ("Row record"). Decoding checks every length
//! against the remaining input and the path limits.

use crate::error::{Error, Result};
use crate::row::{check_path_len, BlobLoc, Codec, Kind, Meta, Row, MAX_NAME, MAX_PATH};

pub fn encode(row: &Row, out: &mut Vec<u8>) {
    put_bytes(out, &row.parent);
    put_bytes(out, &row.name);
    out.push(row.kind.code());
    out.extend_from_slice(&row.mode.to_le_bytes());
    out.extend_from_slice(&row.size.to_le_bytes());
    out.extend_from_slice(&row.mtime_ns.to_le_bytes());
    match &row.digest {
        Some(d) => {
            out.push(1);
            out.extend_from_slice(d);
        }
        None => out.push(0),
    }
    encode_blob(&row.blob, out);
    match &row.target {
        Some(t) => {
            out.push(1);
            put_bytes(out, t);
        }
        None => out.push(0),
    }
    for v in [row.first_gen, row.changed_gen, row.ino] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&row.ctime_ns.to_le_bytes());
    out.extend_from_slice(&row.uid.to_le_bytes());
    out.extend_from_slice(&row.gid.to_le_bytes());
    if let Some(meta) = &row.meta {
        encode_meta(meta, out);
    }
}

/// The optional tail of a record (journal v4): link group, link count,
/// device number, extended attributes. A record without it has none.
fn encode_meta(meta: &Meta, out: &mut Vec<u8>) {
    out.push(1);
    out.extend_from_slice(&meta.link.to_le_bytes());
    out.extend_from_slice(&meta.nlink.to_le_bytes());
    out.extend_from_slice(&meta.rdev.to_le_bytes());
    put_bytes(out, &meta.xattrs);
}

fn decode_meta(r: &mut Reader<'_>) -> Result<Option<Box<Meta>>> {
    if r.pos == r.buf.len() {
        return Ok(None);
    }
    if r.u8()? != 1 {
        return Err(r.bad("metadata tag"));
    }
    let link = r.u64()?;
    let nlink = u32::from_le_bytes(r.array()?);
    let rdev = r.u64()?;
    let xattrs = r.bytes(crate::format::xattrs::MAX_ENCODED)?;
    crate::format::xattrs::decode(&xattrs, r.file)?;
    Ok(Meta {
        link,
        nlink,
        rdev,
        xattrs,
    }
    .boxed())
}

fn encode_blob(blob: &BlobLoc, out: &mut Vec<u8>) {
    match blob {
        BlobLoc::None => out.push(0),
        BlobLoc::Standalone => out.push(1),
        BlobLoc::Chunked { list, data } => {
            out.push(3);
            out.extend_from_slice(list);
            out.extend_from_slice(&data.to_le_bytes());
        }
        BlobLoc::Packed {
            pack,
            offset,
            len,
            codec,
        } => {
            out.push(2);
            out.extend_from_slice(pack);
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.push(codec.code());
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Decode one row from exactly `buf`; `file` names the source in errors.
pub fn decode(buf: &[u8], file: &str) -> Result<Row> {
    let mut r = Reader { buf, pos: 0, file };
    let parent = r.bytes(MAX_PATH)?;
    let name = r.bytes(MAX_NAME)?;
    check_path_len(&parent)?;
    let kind = Kind::from_code(r.u8()?).ok_or_else(|| r.bad("kind"))?;
    let mode = u32::from_le_bytes(r.array()?);
    let size = r.u64()?;
    let mtime_ns = r.u64()? as i64;
    let digest = if r.flag()? { Some(r.array()?) } else { None };
    let blob = decode_blob(&mut r)?;
    let target = if r.flag()? {
        Some(r.bytes(MAX_PATH)?)
    } else {
        None
    };
    let (first_gen, changed_gen, ino) = (r.u64()?, r.u64()?, r.u64()?);
    let ctime_ns = r.u64()? as i64;
    let uid = u32::from_le_bytes(r.array()?);
    let gid = u32::from_le_bytes(r.array()?);
    let meta = decode_meta(&mut r)?;
    if r.pos != buf.len() {
        return Err(r.bad("trailing bytes"));
    }
    Ok(Row {
        parent,
        name,
        kind,
        mode,
        size,
        mtime_ns,
        digest,
        blob,
        target,
        first_gen,
        changed_gen,
        ino,
        ctime_ns,
        uid,
        gid,
        meta,
    })
}

fn decode_blob(r: &mut Reader<'_>) -> Result<BlobLoc> {
    Ok(match r.u8()? {
        0 => BlobLoc::None,
        1 => BlobLoc::Standalone,
        3 => BlobLoc::Chunked {
            list: r.array()?,
            data: r.u64()?,
        },
        2 => {
            let pack = r.array()?;
            let offset = r.u64()?;
            let len = r.u64()?;
            let codec = Codec::from_code(r.u8()?).ok_or_else(|| r.bad("codec"))?;
            BlobLoc::Packed {
                pack,
                offset,
                len,
                codec,
            }
        }
        _ => return Err(r.bad("blob tag")),
    })
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl Reader<'_> {
    fn bad(&self, what: &str) -> Error {
        Error::corrupt(
            "row record",
            self.file,
            format!("invalid {what} at offset {}", self.pos),
        )
    }

    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.buf.len() - self.pos < n {
            return Err(self.bad("length (truncated)"));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn flag(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.bad("flag")),
        }
    }

    fn bytes(&mut self, limit: usize) -> Result<Vec<u8>> {
        let n = u32::from_le_bytes(self.array()?) as usize;
        if n > limit {
            return Err(self.bad("length (over limit)"));
        }
        Ok(self.take(n)?.to_vec())
    }
}
