//! Export: a generation (or paths of it) as a POSIX tar stream (pax), so any
//! tool that takes a tar takes a generation.
//!
//! Each entry is a ustar header, preceded by a pax extended header whenever
//! a field does not fit ustar: a long or non-UTF-8 path or link target,
//! nanosecond mtimes (always), large ids or sizes,
//! and extended attributes (`SCHILY.xattr.NAME`, POSIX ACLs among them as
//! their `system.posix_acl_*` attributes). The first name of a hard-link
//! group carries the content; further names are link entries. A chunked
//! file with holes is written in GNU sparse format 1.0 (a map of its data
//! extents, then only their bytes), which GNU tar and libarchive extract as
//! a sparse file. Sockets have no tar form: they are counted and skipped.
//! Entries go depth first (a directory's entries right after it), the order
//! tar expects to set each directory's times once. Content is verified as
//! it is read, as everywhere else.

use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::format::chunk::Extent;
use crate::row::{BlobLoc, Kind, Row};
use crate::store::Store;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

const BLOCK: usize = 512;

/// What an export wrote.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExportSummary {
    pub entries: u64,
    pub bytes: u64,
    /// Sockets, which tar cannot hold.
    pub sockets_skipped: Vec<String>,
}

/// Write the rows of `view` under `paths` (all when empty) to `out` as a
/// tar stream, ended by its two zero blocks.
pub fn export(
    store: &Store,
    view: &GenView,
    paths: &[Vec<u8>],
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    let mut tar = Tar {
        out,
        summary: ExportSummary::default(),
        leaders: HashMap::new(),
    };
    let root = view
        .lookup(b"")?
        .ok_or_else(|| Error::corrupt("generation", "root", "it has a root row"))?;
    tar.entry(store, &root)?;
    // Depth first, each directory's entries right after it: tar sets a
    // directory's times once the stream leaves it.
    let mut stack = vec![view.list_dir(b"")?.into_iter()];
    while let Some(top) = stack.last_mut() {
        let Some(row) = top.next() else {
            stack.pop();
            continue;
        };
        let path = row.path();
        if !crate::browse::selected(paths, &path) {
            continue;
        }
        tar.entry(store, &row)?;
        if row.kind == Kind::Dir {
            stack.push(view.list_dir(&path)?.into_iter());
        }
    }
    tar.put(&[0u8; BLOCK * 2])?;
    Ok(tar.summary)
}

struct Tar<'a> {
    out: &'a mut dyn Write,
    summary: ExportSummary,
    /// The name each link group's content went out under.
    leaders: HashMap<(u64, Option<[u8; 32]>), Vec<u8>>,
}

/// What one header says.
struct Header {
    name: Vec<u8>,
    flag: u8,
    size: u64,
    link: Vec<u8>,
}

impl Tar<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.summary.bytes += bytes.len() as u64;
        self.out
            .write_all(bytes)
            .map_err(|e| Error::io("write", "the tar stream", e))
    }

    fn pad(&mut self, len: u64) -> Result<()> {
        let rest = (BLOCK - (len % BLOCK as u64) as usize) % BLOCK;
        self.put(&[0u8; BLOCK][..rest])
    }

    fn entry(&mut self, store: &Store, row: &Row) -> Result<()> {
        let path = row.path();
        let mut name = if path.is_empty() {
            b".".to_vec()
        } else {
            path.clone()
        };
        if row.kind == Kind::Socket {
            self.summary.sockets_skipped.push(crate::row::show(&path));
            return Ok(());
        }
        if let Some(key) = row.link_key() {
            if let Some(first) = self.leaders.get(&key).cloned() {
                return self.header(
                    row,
                    Header {
                        name,
                        flag: b'1',
                        size: 0,
                        link: first,
                    },
                    &[],
                );
            }
            self.leaders.insert(key, name.clone());
        }
        let (flag, link) = match row.kind {
            Kind::Dir => {
                name.push(b'/');
                (b'5', Vec::new())
            }
            Kind::Symlink => (b'2', row.target.clone().unwrap_or_default()),
            Kind::Fifo => (b'6', Vec::new()),
            Kind::CharDev => (b'3', Vec::new()),
            Kind::BlockDev => (b'4', Vec::new()),
            Kind::File | Kind::Socket | Kind::Tombstone => (b'0', Vec::new()),
        };
        if row.kind != Kind::File {
            return self.header(
                row,
                Header {
                    name,
                    flag,
                    size: 0,
                    link,
                },
                &[],
            );
        }
        self.file(store, row, name)
    }

    /// A file's header and content: sparse when its chunk list has holes.
    fn file(&mut self, store: &Store, row: &Row, name: Vec<u8>) -> Result<()> {
        let list = match row.blob {
            BlobLoc::Chunked { .. } => Some(crate::chunks::list(store, row)?),
            _ => None,
        };
        let holes = list
            .as_ref()
            .is_some_and(|l| l.extents.iter().any(|e| matches!(e, Extent::Hole { .. })));
        let Some(list) = list.filter(|_| holes) else {
            let header = Header {
                name,
                flag: b'0',
                size: row.size,
                link: Vec::new(),
            };
            self.header(row, header, &[])?;
            let mut w = Counted {
                out: &mut *self.out,
                n: 0,
            };
            crate::blob::copy_to(store, row, &mut w)?;
            let n = w.n;
            self.summary.bytes += n;
            return self.pad(n);
        };
        let map = sparse_map(&list.extents, &list.offsets);
        let data: u64 = list
            .extents
            .iter()
            .map(|e| match e {
                Extent::Data { len, .. } => *len,
                Extent::Hole { .. } => 0,
            })
            .sum();
        let real = name.clone();
        let stored = sparse_name(&name);
        let size = map.len() as u64 + data;
        let records = [
            pax(b"GNU.sparse.major", b"1"),
            pax(b"GNU.sparse.minor", b"0"),
            pax(b"GNU.sparse.name", &real),
            pax(b"GNU.sparse.realsize", row.size.to_string().as_bytes()),
        ]
        .concat();
        self.header(
            row,
            Header {
                name: stored,
                flag: b'0',
                size,
                link: Vec::new(),
            },
            &records,
        )?;
        self.put(&map)?;
        for e in &list.extents {
            if let Extent::Data { len, digest } = e {
                let bytes = crate::chunks::chunk(store, digest, *len)?;
                self.put(&bytes)?;
            }
        }
        self.pad(size)
    }

    /// A pax header when needed (always: the ns mtime), then the ustar one.
    fn header(&mut self, row: &Row, h: Header, extra: &[u8]) -> Result<()> {
        let mut records = extra.to_vec();
        // Non-UTF-8 names go in pax records as their bytes, which GNU tar
        // writes back unchanged (it does not know `hdrcharset`).
        let binary = std::str::from_utf8(&h.name).is_err() || std::str::from_utf8(&h.link).is_err();
        if h.name.len() > 100 || binary {
            records.extend(pax(b"path", &h.name));
        }
        if h.link.len() > 100 || binary {
            records.extend(pax(b"linkpath", &h.link));
        }
        records.extend(pax(b"mtime", mtime_text(row.mtime_ns).as_bytes()));
        for (id, key) in [(row.uid, &b"uid"[..]), (row.gid, &b"gid"[..])] {
            if u64::from(id) > 0o7777777 {
                records.extend(pax(key, id.to_string().as_bytes()));
            }
        }
        if h.size > 0o77777777777 {
            records.extend(pax(b"size", h.size.to_string().as_bytes()));
        }
        let what = crate::row::show(&row.path());
        for (name, value) in crate::format::xattrs::decode(&row.meta().xattrs, &what)? {
            records.extend(pax(&[&b"SCHILY.xattr."[..], &name].concat(), &value));
        }
        let mut pax_name = b"PaxHeaders/".to_vec();
        pax_name.extend(h.name.iter().rev().take(80).rev());
        let pax_header = ustar(&pax_name, b'x', records.len() as u64, &[], row, 0o644);
        self.put(&pax_header)?;
        self.put(&records)?;
        self.pad(records.len() as u64)?;
        self.summary.entries += 1;
        self.put(&ustar(&h.name, h.flag, h.size, &h.link, row, row.mode))
    }
}

/// A ustar header block. Fields that do not fit are left for the pax
/// header before it (a truncated name, zero for an oversized number).
fn ustar(name: &[u8], flag: u8, size: u64, link: &[u8], row: &Row, mode: u32) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    let put = |b: &mut [u8; BLOCK], at: usize, len: usize, v: &[u8]| {
        let n = v.len().min(len);
        b[at..at + n].copy_from_slice(&v[..n]);
    };
    let num = |b: &mut [u8; BLOCK], at: usize, len: usize, v: u64| {
        let text = format!("{v:0width$o}", width = len - 1);
        if text.len() < len {
            b[at..at + text.len()].copy_from_slice(text.as_bytes());
        }
    };
    put(&mut b, 0, 100, name);
    num(&mut b, 100, 8, u64::from(mode & 0o7777));
    num(&mut b, 108, 8, u64::from(row.uid));
    num(&mut b, 116, 8, u64::from(row.gid));
    num(&mut b, 124, 12, size);
    num(
        &mut b,
        136,
        12,
        row.mtime_ns.div_euclid(1_000_000_000).max(0) as u64,
    );
    b[156] = flag;
    put(&mut b, 157, 100, link);
    put(&mut b, 257, 8, b"ustar\x0000");
    if matches!(flag, b'3' | b'4') {
        let rdev = row.meta().rdev;
        num(&mut b, 329, 8, u64::from(libc::major(rdev)));
        num(&mut b, 337, 8, u64::from(libc::minor(rdev)));
    }
    b[148..156].copy_from_slice(b"        ");
    let sum: u32 = b.iter().map(|&c| u32::from(c)).sum();
    let text = format!("{sum:06o}\0 ");
    b[148..156].copy_from_slice(text.as_bytes());
    b
}

/// One pax record: `"<len> <key>=<value>\n"`, its length counting itself.
fn pax(key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len.to_string().len() + body != len {
        len = len.to_string().len() + body;
    }
    let mut r = format!("{len} ").into_bytes();
    r.extend_from_slice(key);
    r.push(b'=');
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// A pax time: seconds and nanoseconds, negative before 1970.
fn mtime_text(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let abs = ns.unsigned_abs();
    format!("{sign}{}.{:09}", abs / 1_000_000_000, abs % 1_000_000_000)
}

/// GNU sparse 1.0's map: the count of data extents, then each one's offset
/// and length, one decimal per line, padded to a block.
fn sparse_map(extents: &[Extent], offsets: &[u64]) -> Vec<u8> {
    let mut lines = Vec::new();
    let mut last_end = 0;
    for (e, &at) in extents.iter().zip(offsets) {
        if let Extent::Data { len, .. } = e {
            lines.push(format!("{at}\n{len}\n"));
        }
        last_end = at
            + match e {
                Extent::Data { len, .. } | Extent::Hole { len } => *len,
            };
    }
    // A file ending in a hole ends with an empty extent at its size.
    if !matches!(extents.last(), Some(Extent::Data { .. })) {
        lines.push(format!("{last_end}\n0\n"));
    }
    let mut map = format!("{}\n", lines.len()).into_bytes();
    map.extend(lines.concat().into_bytes());
    map.resize(map.len().div_ceil(BLOCK) * BLOCK, 0);
    map
}

/// The stored name of a sparse member (`dir/GNUSparseFile.0/name`); its
/// real name is in `GNU.sparse.name`.
fn sparse_name(name: &[u8]) -> Vec<u8> {
    let (parent, base) = crate::row::split(name);
    let mut n = parent;
    if !n.is_empty() {
        n.push(b'/');
    }
    n.extend_from_slice(b"GNUSparseFile.0/");
    n.extend_from_slice(&base);
    n
}

/// A writer that counts what passes through.
struct Counted<'a> {
    out: &'a mut dyn Write,
    n: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        assert_eq!(pax(b"a", b"b"), b"6 a=b\n");
        let r = pax(b"path", &[b'x'; 95]);
        assert_eq!(r.len().to_string(), String::from_utf8_lossy(&r[..3]));
        assert_eq!(mtime_text(-1_500_000_000), "-1.500000000");
        assert_eq!(mtime_text(1_000_000_001), "1.000000001");
    }

    #[test]
    fn a_sparse_map_lists_data_extents_and_a_trailing_hole() {
        let d = [0u8; 32];
        let ex = [
            Extent::Hole { len: 10 },
            Extent::Data { len: 5, digest: d },
            Extent::Hole { len: 7 },
        ];
        let map = sparse_map(&ex, &[0, 10, 15]);
        assert_eq!(map.len(), BLOCK);
        assert!(map.starts_with(b"2\n10\n5\n22\n0\n\0"));
    }
}
