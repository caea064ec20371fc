//! The inode table: what each inode number the kernel holds stands for.
//!
//! Entries of a generation carry their meaning in the number itself: an
//! entry inode packs a generation slot and the row's position in the pinned
//! view ([`RowPos`]), so the daemon keeps no per-entry state and memory
//! follows the number of generations in use, not the entries walked. Each
//! generation slot counts the kernel's lookups of all its entries (FUSE
//! lookup, readdirplus, forget) and holds the generation (and so its pin)
//! while that count is above zero.
//!
//! Synthetic nodes (sets, `latest`, `gens`, `tags`, `history` and what it
//! lists, the generation roots) are few, or as many as the caller looks at;
//! their numbers are hashed from what they are (`Node::identity`) and they
//! live in a
//! small table, also counted by lookups. A generation root looked up by name
//! holds its generation and has its own number per representation; one only
//! listed by readdirplus holds nothing and has another number (it is handed
//! out with a zero entry TTL, so the kernel looks the name up, and so pins
//! it, before anything resolves through it).

use crate::gen::Gen;
use std::collections::HashMap;
use std::sync::Arc;
use strata::compose::{RepPos, RowPos};
/// What an inode stands for: a node of the mount's tree.
pub(crate) use strata::mount_tree::Node;

pub(crate) const ROOT: u64 = 1;
/// Entry inode numbers have this bit set; synthetic ones never do.
const ENTRY_BIT: u64 = 1 << 63;
const SLOT_BITS: u32 = 20;
const SEG_BITS: u32 = 18;
const GROUP_BITS: u32 = 12;
const IDX_BITS: u32 = 12;
/// Bits of a packed position (delta flag, segment, group, index).
const POS_BITS: u32 = 1 + SEG_BITS + GROUP_BITS + IDX_BITS;
/// Synthetic numbers at or above this come from the collision counter.
const FALLBACK_BASE: u64 = 1 << 62;

/// Whether `ino` names an entry of a generation (not a synthetic node).
pub(crate) fn is_entry(ino: u64) -> bool {
    ino & ENTRY_BIT != 0
}

/// The part of entry inode number `ino` that names its generation's slot
/// (`Inodes::entry_base`).
pub(crate) fn slot_base(ino: u64) -> u64 {
    ino & !((1 << POS_BITS) - 1)
}

/// The inode number a synthetic node would get, without registering it.
pub(crate) fn ino_of(node: &Node) -> u64 {
    if matches!(node, Node::Root) {
        return ROOT;
    }
    hashed(&node.identity())
}

fn hashed(key: &[u8]) -> u64 {
    let h = blake3::hash(key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    (u64::from_le_bytes(first) % (FALLBACK_BASE - 2)) + 2
}

/// A row position as the low [`POS_BITS`] bits; `None` if it does not fit.
pub(crate) fn pack_pos(pos: RowPos) -> Option<u64> {
    let fits =
        pos.at.seg < 1 << SEG_BITS && pos.at.group < 1 << GROUP_BITS && pos.at.idx < 1 << IDX_BITS;
    fits.then(|| {
        (u64::from(pos.delta) << (POS_BITS - 1))
            | (u64::from(pos.at.seg) << (GROUP_BITS + IDX_BITS))
            | (u64::from(pos.at.group) << IDX_BITS)
            | u64::from(pos.at.idx)
    })
}

pub(crate) fn unpack_pos(v: u64) -> RowPos {
    let field = |shift: u32, bits: u32| ((v >> shift) & ((1 << bits) - 1)) as u32;
    RowPos {
        delta: (v >> (POS_BITS - 1)) & 1 == 1,
        at: RepPos {
            seg: field(GROUP_BITS + IDX_BITS, SEG_BITS),
            group: field(IDX_BITS, GROUP_BITS),
            idx: field(0, IDX_BITS),
        },
    }
}

/// Marks a directory offset that names an entry position. Offsets are
/// `loff_t` to `lseek`/`seekdir`, so they must stay below 2^63.
const OFFSET_BIT: u64 = 1 << 62;

/// A directory offset for the entry at `pos`: above the two dot entries.
pub(crate) fn dir_offset(pos: RowPos) -> Option<u64> {
    pack_pos(pos).map(|p| p | OFFSET_BIT)
}

/// The position a directory offset from [`dir_offset`] names.
pub(crate) fn offset_pos(offset: u64) -> Option<RowPos> {
    (offset & OFFSET_BIT != 0).then(|| unpack_pos(offset & !OFFSET_BIT))
}

/// What an inode number resolves to.
pub(crate) enum Resolved {
    Synthetic(Node),
    Entry(Arc<Gen>, RowPos),
}

struct Synthetic {
    node: Node,
    key: Vec<u8>,
    lookups: u64,
}

/// A hard-link group of one generation: link key and content digest
/// (`Row::link_key`).
pub(crate) type LinkKey = (u64, Option<[u8; 32]>);

/// One generation's share of the inode space.
struct GenSlot {
    gen: Option<Arc<Gen>>,
    lookups: u64,
    /// The inode number each link group looked up is served as: the number
    /// of the member looked up first, so every name of the group is one
    /// inode. Dropped with the slot's last lookup.
    links: HashMap<LinkKey, u64>,
}

#[derive(Default)]
pub(crate) struct Inodes {
    synthetic: HashMap<u64, Synthetic>,
    by_key: HashMap<Vec<u8>, u64>,
    next_fallback: u64,
    slots: Vec<GenSlot>,
    /// Slot numbers are kept for the daemon's life, so an entry keeps its
    /// inode number whenever the same view of its generation serves it. A
    /// new representation (after materialization) gets its own slot: row
    /// positions differ between representations.
    slot_of: HashMap<(String, u64, String), u32>,
}

impl Inodes {
    pub(crate) fn get(&self, ino: u64) -> Option<Resolved> {
        if ino == ROOT {
            return Some(Resolved::Synthetic(Node::Root));
        }
        if ino & ENTRY_BIT == 0 {
            let s = self.synthetic.get(&ino)?;
            return Some(Resolved::Synthetic(s.node.clone()));
        }
        let slot = ((ino & !ENTRY_BIT) >> POS_BITS) as usize;
        let gen = self.slots.get(slot)?.gen.clone()?;
        Some(Resolved::Entry(gen, unpack_pos(ino)))
    }

    /// The inode number of the entry at `pos` of `gen`, without counting a
    /// lookup (for plain readdir). `None` if the number space is exhausted.
    pub(crate) fn entry_ino(&mut self, gen: &Arc<Gen>, pos: RowPos) -> Option<u64> {
        Some(self.entry_base(gen)? | pack_pos(pos)?)
    }

    /// The part of an entry's inode number that names `gen`'s slot: an
    /// entry at `pos` is `base | pack_pos(pos)`. `None` if the number space
    /// is exhausted.
    pub(crate) fn entry_base(&mut self, gen: &Arc<Gen>) -> Option<u64> {
        let top = gen.view.top().manifest_name.clone();
        let key = (gen.set.clone(), gen.generation, top);
        let slot = match self.slot_of.get(&key) {
            Some(&s) => s,
            None => {
                let s = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|s| *s < 1 << SLOT_BITS)?;
                self.slots.push(GenSlot {
                    gen: None,
                    lookups: 0,
                    links: HashMap::new(),
                });
                self.slot_of.insert(key, s);
                s
            }
        };
        Some(ENTRY_BIT | (u64::from(slot) << POS_BITS))
    }

    /// Count one kernel lookup of the entry at `pos` of `gen`.
    /// An entry in a link group is counted as the group's inode.
    pub(crate) fn remember_entry(
        &mut self,
        gen: &Arc<Gen>,
        pos: RowPos,
        link: Option<LinkKey>,
    ) -> Option<u64> {
        let own = self.entry_ino(gen, pos)?;
        let slot = &mut self.slots[((own & !ENTRY_BIT) >> POS_BITS) as usize];
        let ino = match link {
            Some(key) => *slot.links.entry(key).or_insert(own),
            None => own,
        };
        slot.lookups += 1;
        if slot.gen.is_none() {
            slot.gen = Some(gen.clone());
        }
        Some(ino)
    }

    /// Count one kernel lookup of a synthetic node; returns its number.
    pub(crate) fn remember(&mut self, node: Node) -> u64 {
        if matches!(node, Node::Root) {
            return ROOT;
        }
        let key = node.identity();
        if let Some(&ino) = self.by_key.get(&key) {
            if let Some(s) = self.synthetic.get_mut(&ino) {
                s.lookups += 1;
                return ino;
            }
        }
        let mut ino = hashed(&key);
        if self.synthetic.contains_key(&ino) {
            self.next_fallback += 1;
            ino = FALLBACK_BASE + self.next_fallback;
        }
        self.by_key.insert(key.clone(), ino);
        let s = Synthetic {
            node,
            key,
            lookups: 1,
        };
        self.synthetic.insert(ino, s);
        ino
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if ino & ENTRY_BIT != 0 {
            let slot = ((ino & !ENTRY_BIT) >> POS_BITS) as usize;
            if let Some(s) = self.slots.get_mut(slot) {
                s.lookups = s.lookups.saturating_sub(n);
                if s.lookups == 0 {
                    s.gen = None;
                    s.links.clear();
                }
            }
            return;
        }
        let Some(s) = self.synthetic.get_mut(&ino) else {
            return;
        };
        s.lookups = s.lookups.saturating_sub(n);
        if s.lookups == 0 {
            if let Some(s) = self.synthetic.remove(&ino) {
                self.by_key.remove(&s.key);
            }
        }
    }

    /// Inodes the kernel holds: synthetic nodes plus entry lookups.
    pub(crate) fn len(&self) -> u64 {
        let entries: u64 = self.slots.iter().map(|s| s.lookups).sum();
        self.synthetic.len() as u64 + entries
    }
}
