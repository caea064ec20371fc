//! Listings of the synthetic directories (the sets, a set, its generation
//! list, tags and history) and their stamps.
//!
//! A reader that keeps a listing (the kernel, once it keeps every listing
//! it reads) compares the directory's mtime with the one it saw when it
//! fetched that listing before it serves its copy from the start. A
//! synthetic directory's mtime is the tree's start time with a fingerprint
//! of what it lists in the nanoseconds ([`listing_stamp`]; for the
//! directories that follow a set's index, `gens/` and `history/…`, a
//! fingerprint of the index's record names, which change whenever those
//! listings can: [`Tree::index_stamp`]), so that reading the attributes
//! stays cheap where a path walk passes, a listing that changed gets a new
//! mtime, and one that did not keeps its own.
//!
//! Offsets: `.` and `..` end at 1 and 2, the listing's item `i` at `i + 3`
//! ([`items_from`]); the offsets of a generation directory are positions of
//! its rows (see `Tree::visit_gen_dir`).

use super::layout::{Node, NodeKind};
use super::{Tree, TreeError, TreeResult};
use crate::format::record::State;
use crate::index::GenIndex;
use crate::store::keys;
use std::time::{Duration, SystemTime};

/// One entry of a synthetic directory.
#[derive(Clone)]
pub struct DirItem {
    pub node: Node,
    pub kind: NodeKind,
    pub name: Vec<u8>,
}

/// The names every directory starts with, ending at offsets 1 and 2.
pub const DOTS: [&str; 2] = [".", ".."];

/// The items of a synthetic listing after `offset`, each with the offset
/// that follows it (dots aside: see [`DOTS`]).
pub fn items_from(items: &[DirItem], offset: u64) -> impl Iterator<Item = (u64, &DirItem)> {
    let from = usize::try_from(offset.saturating_sub(2)).unwrap_or(usize::MAX);
    items
        .iter()
        .enumerate()
        .skip(from)
        .map(|(i, item)| (i as u64 + 3, item))
}

/// The stamp of a synthetic directory listing `items`: `base` (whole
/// seconds kept) with a fingerprint of the listing as its nanoseconds.
pub fn listing_stamp(base: SystemTime, items: &[DirItem]) -> SystemTime {
    stamp(
        base,
        items.iter().map(|item| {
            let identity = item.node.identity();
            let mut part = (identity.len() as u64).to_le_bytes().to_vec();
            part.extend_from_slice(&identity);
            part.push(item.kind as u8);
            part.extend_from_slice(&item.name);
            part
        }),
    )
}

/// `base` (whole seconds kept) with a fingerprint of `parts` (in order) as
/// its nanoseconds.
pub fn stamp(base: SystemTime, parts: impl IntoIterator<Item = Vec<u8>>) -> SystemTime {
    let mut h = blake3::Hasher::new();
    for part in parts {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(&part);
    }
    let mut first = [0u8; 4];
    first.copy_from_slice(&h.finalize().as_bytes()[..4]);
    let nanos = u32::from_le_bytes(first) % 1_000_000_000;
    let secs = base
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
}

impl Tree {
    /// The listing of synthetic directory `node` as it is now (dots
    /// aside); `NotADirectory` for anything else (a generation's
    /// directories are visited: `Tree::visit_gen_dir`).
    pub fn list(&self, node: &Node) -> TreeResult<Vec<DirItem>> {
        let item = |node: Node, kind: NodeKind, name: &[u8]| DirItem {
            node,
            kind,
            name: name.to_vec(),
        };
        Ok(match node {
            Node::Root => self
                .sets()?
                .into_iter()
                .map(|s| item(Node::Set(s.clone()), NodeKind::Dir, s.as_bytes()))
                .collect(),
            Node::Set(s) => vec![
                item(Node::Latest(s.clone()), NodeKind::Symlink, b"latest"),
                item(Node::Gens(s.clone()), NodeKind::Dir, b"gens"),
                item(Node::Tags(s.clone()), NodeKind::Dir, b"tags"),
                item(
                    Node::History {
                        set: s.clone(),
                        path: Vec::new(),
                    },
                    NodeKind::Dir,
                    b"history",
                ),
            ],
            Node::History { set, path } => self
                .history_entries(set, path)?
                .into_iter()
                .map(|(node, name)| DirItem {
                    node,
                    kind: NodeKind::Dir,
                    name,
                })
                .collect(),
            Node::Versions { set, path } => self
                .versions(set, path)?
                .into_iter()
                .map(|v| {
                    let name = v.generation.to_string();
                    let n = Node::Version {
                        set: set.clone(),
                        path: path.clone(),
                        generation: v.generation,
                    };
                    item(n, NodeKind::Symlink, name.as_bytes())
                })
                .collect(),
            Node::Gens(s) => self.generation_items(s)?,
            Node::Tags(s) => crate::tag::list(self.store(), s)
                .map_err(|e| TreeError::store(format!("list tags of {s}"), e))?
                .into_iter()
                .map(|t| {
                    let n = Node::Tag(s.clone(), t.name.clone(), t.generation);
                    item(n, NodeKind::Symlink, t.name.as_bytes())
                })
                .collect(),
            _ => return Err(TreeError::NotADirectory),
        })
    }

    /// Committed generations of `set` and the retired ones still served,
    /// as unopened generation roots.
    fn generation_items(&self, set: &str) -> TreeResult<Vec<DirItem>> {
        let all = GenIndex::new(self.store(), set)
            .all()
            .map_err(|e| TreeError::store(format!("list generations set={set}"), e))?;
        let held = self.gens().held(set);
        Ok(all
            .into_iter()
            .filter(|(g, r)| r.state == State::Committed || held.contains(g))
            .map(|(g, _)| DirItem {
                node: Node::GenRoot {
                    set: set.to_string(),
                    generation: g,
                    gen: None,
                },
                kind: NodeKind::Dir,
                name: g.to_string().into_bytes(),
            })
            .collect())
    }

    /// The mtime of a synthetic directory: it changes when its listing
    /// does. `gens/` and `history/…` follow the set's index: their stamp is
    /// its record names (one listing of the index directory, not a read of
    /// every record or generation, since a path walk through them asks for
    /// these attributes), with the generations served for `gens/`. One that
    /// cannot be read now keeps the tree's start time (its reading will
    /// report the error).
    pub fn listing_mtime(&self, node: &Node) -> SystemTime {
        let stamped = match node {
            Node::Gens(set) => self.index_stamp(set, true),
            Node::History { set, .. } | Node::Versions { set, .. } => self.index_stamp(set, false),
            _ => self
                .list(node)
                .map(|items| listing_stamp(self.started(), &items)),
        };
        stamped.unwrap_or(self.started())
    }

    /// The stamp of the record names of `set`'s index, and of the
    /// generations of `set` served if `held`.
    pub fn index_stamp(&self, set: &str, held: bool) -> TreeResult<SystemTime> {
        let mut names = self
            .store()
            .storage()
            .list(&keys::index_dir(set))
            .map_err(|e| TreeError::store(format!("list the index of set={set}"), e))?;
        names.sort();
        let mut parts: Vec<Vec<u8>> = names.into_iter().map(String::into_bytes).collect();
        if held {
            parts.push(b"held".to_vec());
            parts.extend(
                self.gens()
                    .held(set)
                    .iter()
                    .map(|g| g.to_le_bytes().to_vec()),
            );
        }
        Ok(stamp(self.started(), parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sets(names: &[&str]) -> Vec<DirItem> {
        names
            .iter()
            .map(|n| DirItem {
                node: Node::Set(n.to_string()),
                kind: NodeKind::Dir,
                name: n.as_bytes().to_vec(),
            })
            .collect()
    }

    #[test]
    fn the_stamp_follows_the_listing_and_keeps_the_seconds() {
        let base = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123);
        let ab = listing_stamp(base, &sets(&["a", "b"]));
        assert_eq!(ab, listing_stamp(base, &sets(&["a", "b"])));
        assert_ne!(ab, listing_stamp(base, &sets(&["a", "c"])));
        assert_ne!(ab, listing_stamp(base, &sets(&["ab"])));
        assert_ne!(ab, listing_stamp(base, &sets(&["a"])));
        let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs(ab), 1_700_000_000);
        let names = |n: &[&str]| n.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        let one = stamp(base, names(&["1.1", "2.1"]));
        assert_eq!(one, stamp(base, names(&["1.1", "2.1"])));
        assert_ne!(one, stamp(base, names(&["1.1", "2.1", "3.1"])));
        assert_ne!(one, stamp(base, names(&["1.1", "2.2"])));
    }

    #[test]
    fn offsets_follow_the_dots() {
        let items = sets(&["a", "b", "c"]);
        let from = |off| {
            items_from(&items, off)
                .map(|(o, i)| (o, String::from_utf8(i.name.clone()).unwrap()))
                .collect::<Vec<_>>()
        };
        let all = vec![(3, "a".into()), (4, "b".into()), (5, "c".into())];
        assert_eq!(from(0), all);
        assert_eq!(from(2), all);
        assert_eq!(from(3), all[1..]);
        assert_eq!(from(5), []);
        assert_eq!(from(u64::MAX), []);
    }
}
