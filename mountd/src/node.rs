//! The inode table: what each inode number the kernel holds stands for.
//!
//! Inode numbers are derived from what a node is (set, generation, path), so
//! the same entry has the same number in `readdir`, `lookup` and across
//! forgets; a hash collision falls back to a counter in a reserved range.
//! Entries exist only while the kernel holds a lookup count on them (FUSE
//! forget), so memory follows what is in use, not what was ever walked.
//! A node of a generation holds that generation (and so its pin) alive.

use crate::gen::Gen;
use std::collections::HashMap;
use std::sync::Arc;
use strata::row::Row;

pub(crate) const ROOT: u64 = 1;
/// Inode numbers at or above this come from the collision counter.
const FALLBACK_BASE: u64 = 1 << 63;

/// What an inode stands for.
#[derive(Clone)]
pub(crate) enum Node {
    Root,
    Set(String),
    Latest(String),
    Gens(String),
    /// An entry of a generation; the row is shared, nodes are cloned per request.
    Entry {
        gen: Arc<Gen>,
        path: Vec<u8>,
        row: Arc<Row>,
    },
}

impl Node {
    /// The identity an inode number is derived from.
    pub(crate) fn key(&self) -> Vec<u8> {
        match self {
            Node::Root => key(0, "", 0, b""),
            Node::Set(s) => key(1, s, 0, b""),
            Node::Latest(s) => key(2, s, 0, b""),
            Node::Gens(s) => key(3, s, 0, b""),
            Node::Entry { gen, path, .. } => key(4, &gen.set, gen.generation, path),
        }
    }
}

fn key(tag: u8, set: &str, gen: u64, path: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(13 + set.len() + path.len());
    k.push(tag);
    k.extend_from_slice(&(set.len() as u32).to_le_bytes());
    k.extend_from_slice(set.as_bytes());
    k.extend_from_slice(&gen.to_le_bytes());
    k.extend_from_slice(path);
    k
}

/// Inode number of an entry of a generation, as `readdir` reports it.
pub(crate) fn entry_ino(set: &str, gen: u64, path: &[u8]) -> u64 {
    hashed(&key(4, set, gen, path))
}

/// The inode number a node would get, without registering it (for readdir).
pub(crate) fn ino_of(node: &Node) -> u64 {
    if matches!(node, Node::Root) {
        return ROOT;
    }
    hashed(&node.key())
}

fn hashed(key: &[u8]) -> u64 {
    let h = blake3::hash(key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    let v = u64::from_le_bytes(first);
    (v % (FALLBACK_BASE - 2)) + 2
}

struct Slot {
    node: Node,
    key: Vec<u8>,
    lookups: u64,
}

#[derive(Default)]
pub(crate) struct Inodes {
    slots: HashMap<u64, Slot>,
    by_key: HashMap<Vec<u8>, u64>,
    next_fallback: u64,
}

impl Inodes {
    pub(crate) fn get(&self, ino: u64) -> Option<Node> {
        if ino == ROOT {
            return Some(Node::Root);
        }
        self.slots.get(&ino).map(|s| s.node.clone())
    }

    /// Register one kernel lookup of `node`; returns its inode number.
    pub(crate) fn remember(&mut self, node: Node) -> u64 {
        if matches!(node, Node::Root) {
            return ROOT;
        }
        let key = node.key();
        if let Some(&ino) = self.by_key.get(&key) {
            if let Some(slot) = self.slots.get_mut(&ino) {
                slot.lookups += 1;
                return ino;
            }
        }
        let mut ino = hashed(&key);
        if self.slots.contains_key(&ino) {
            self.next_fallback += 1;
            ino = FALLBACK_BASE + self.next_fallback;
        }
        self.by_key.insert(key.clone(), ino);
        self.slots.insert(
            ino,
            Slot {
                node,
                key,
                lookups: 1,
            },
        );
        ino
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        let Some(slot) = self.slots.get_mut(&ino) else {
            return;
        };
        slot.lookups = slot.lookups.saturating_sub(n);
        if slot.lookups == 0 {
            if let Some(slot) = self.slots.remove(&ino) {
                self.by_key.remove(&slot.key);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}
