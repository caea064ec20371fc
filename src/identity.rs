//! Identity: a BLAKE3 digest over the canonical, sorted live rows of a
//! generation (path, kind, mode, size, content digest, link target).
//!
//! Rows must be fed in key order; equal trees give equal identities whatever
//! their representation, mtimes or provenance. Encoding: docs/FORMAT.md.

use crate::row::{Kind, Row};

const DOMAIN: &[u8] = b"strata-identity-v1\n";

pub struct IdentityHasher {
    hasher: blake3::Hasher,
}

impl Default for IdentityHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl IdentityHasher {
    pub fn new() -> IdentityHasher {
        let mut hasher = blake3::Hasher::new();
        hasher.update(DOMAIN);
        IdentityHasher { hasher }
    }

    /// Feed one live row (tombstones are not part of a tree).
    pub fn push(&mut self, row: &Row) {
        debug_assert!(row.kind != Kind::Tombstone);
        let h = &mut self.hasher;
        let path_len = match row.parent.len() {
            0 => row.name.len(),
            p => p + 1 + row.name.len(),
        };
        h.update(&(path_len as u32).to_le_bytes());
        if !row.parent.is_empty() {
            h.update(&row.parent);
            h.update(b"/");
        }
        h.update(&row.name);
        h.update(&[row.kind.code()]);
        h.update(&row.mode.to_le_bytes());
        h.update(&row.size.to_le_bytes());
        h.update(row.digest.as_ref().unwrap_or(&[0u8; 32]));
        let target = row.target.as_deref().unwrap_or(&[]);
        h.update(&(target.len() as u32).to_le_bytes());
        h.update(target);
    }

    pub fn finish(self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}
