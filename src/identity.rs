//! Identity: a BLAKE3 digest over the canonical, sorted live rows of a
//! generation (path, kind, mode, size, content digest, link target, and for
//! rows that have them the device number and extended attributes).
//! Hard-link grouping is not part of it: every member row carries its own
//! content digest, and grouping is how the source stored the bytes, like an
//! inode number (docs/FORMAT.md, "Identity").
//!
//! Rows must be fed in key order; equal trees give equal identities whatever
//! their representation, mtimes or provenance. Encoding: docs/FORMAT.md.

use crate::row::{Kind, Row};

const DOMAIN: &[u8] = b"strata-identity-v1\n";
/// Encoded rows are hashed in runs of about this many bytes: one large
/// update lets BLAKE3 hash many chunks at once, where an update per field
/// would hash one block at a time.
const RUN: usize = 64 << 10;

pub struct IdentityHasher {
    hasher: blake3::Hasher,
    run: Vec<u8>,
}

impl Default for IdentityHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl IdentityHasher {
    pub fn new() -> IdentityHasher {
        let mut run = Vec::with_capacity(RUN + 4096);
        run.extend_from_slice(DOMAIN);
        IdentityHasher {
            hasher: blake3::Hasher::new(),
            run,
        }
    }

    /// Feed one live row (tombstones are not part of a tree).
    pub fn push(&mut self, row: &Row) {
        encode_row(row, &mut self.run);
        if self.run.len() >= RUN {
            self.hasher.update(&self.run);
            self.run.clear();
        }
    }

    /// Feed rows encoded with [`encode_row`] elsewhere (in row order).
    pub fn push_encoded(&mut self, encoded: &[u8]) {
        self.hasher.update(&self.run);
        self.run.clear();
        self.hasher.update(encoded);
    }

    pub fn finish(mut self) -> String {
        self.hasher.update(&self.run);
        self.hasher.finalize().to_hex().to_string()
    }
}

/// Append what identity hashes of one live row to `out`.
pub fn encode_row(row: &Row, out: &mut Vec<u8>) {
    debug_assert!(row.kind != Kind::Tombstone);
    let path_len = match row.parent.len() {
        0 => row.name.len(),
        p => p + 1 + row.name.len(),
    };
    out.extend_from_slice(&(path_len as u32).to_le_bytes());
    if !row.parent.is_empty() {
        out.extend_from_slice(&row.parent);
        out.push(b'/');
    }
    out.extend_from_slice(&row.name);
    let meta = row.meta();
    let extended = meta.rdev != 0 || !meta.xattrs.is_empty();
    // The high bit of the kind marks a row followed by its extension, so
    // rows without one encode exactly as before it existed.
    out.push(row.kind.code() | if extended { 0x80 } else { 0 });
    out.extend_from_slice(&row.mode.to_le_bytes());
    out.extend_from_slice(&row.size.to_le_bytes());
    out.extend_from_slice(row.digest.as_ref().unwrap_or(&[0u8; 32]));
    let target = row.target.as_deref().unwrap_or(&[]);
    out.extend_from_slice(&(target.len() as u32).to_le_bytes());
    out.extend_from_slice(target);
    if extended {
        out.extend_from_slice(&meta.rdev.to_le_bytes());
        out.extend_from_slice(&(meta.xattrs.len() as u32).to_le_bytes());
        out.extend_from_slice(&meta.xattrs);
    }
}
