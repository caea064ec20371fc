//! The namespace of the mount and its resolution:
//!
//! ```text
//! <set>/latest            -> gens/<N>          (the set's latest generation)
//! <set>/gens/<N>/…                             (generation N's rows)
//! <set>/tags/<name>       -> ../gens/<N>
//! <set>/history/<dir>/…                        (directories of latest)
//! <set>/history/<file>/<N> -> ../…/gens/<N>/<file>  (one link per version)
//! ```
//!
//! Everything but a generation's rows is synthetic: made from the index,
//! the tags and the latest generation when asked.

use super::{absent_as_none, Gen, Tree, TreeError, TreeResult};
use crate::compose::RowPos;
use crate::error::Error;
use crate::row::{join, BlobLoc, Kind, Row};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A node of the tree.
#[derive(Clone)]
pub enum Node {
    /// The mount's root: the sets.
    Root,
    Set(String),
    /// `<set>/latest`, a link to the latest generation.
    Latest(String),
    /// `<set>/gens`: the committed generations.
    Gens(String),
    /// `<set>/tags`.
    Tags(String),
    /// `tags/<name>`, pointing at a generation; a moved tag is a new node.
    Tag(String, String, u64),
    /// `gens/<N>`; `gen` is present once the generation is open (a listing
    /// of `gens/` opens none).
    GenRoot {
        set: String,
        generation: u64,
        gen: Option<Arc<Gen>>,
    },
    /// `history/<path>`: a directory of the latest generation, listing
    /// its subdirectories (as more of these) and the versions directory of
    /// each other entry. `path` is empty for `history` itself.
    History {
        set: String,
        path: Vec<u8>,
    },
    /// `history/<path>` of a file or symlink: one link per version.
    Versions {
        set: String,
        path: Vec<u8>,
    },
    /// `history/<path>/<N>`: a link to `gens/<N>/<path>`, the oldest
    /// committed generation holding that version.
    Version {
        set: String,
        path: Vec<u8>,
        generation: u64,
    },
    /// An entry below a generation root: its row, at `pos` of the view.
    Entry {
        gen: Arc<Gen>,
        pos: RowPos,
        row: Box<Row>,
    },
}

/// What a node is to a reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    Symlink,
    File,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl NodeKind {
    /// The kind an entry of `kind` is served as.
    pub fn of(kind: Kind) -> NodeKind {
        match kind {
            Kind::Dir => NodeKind::Dir,
            Kind::Symlink => NodeKind::Symlink,
            Kind::Fifo => NodeKind::Fifo,
            Kind::Socket => NodeKind::Socket,
            Kind::CharDev => NodeKind::CharDev,
            Kind::BlockDev => NodeKind::BlockDev,
            Kind::File | Kind::Tombstone => NodeKind::File,
        }
    }
}

/// A node's attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attrs {
    pub kind: NodeKind,
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Access and creation time.
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub perm: u16,
    /// The stored owner (uid, gid) of an entry; `None` for synthetic nodes.
    pub owner: Option<(u32, u32)>,
    /// Link count as committed; 0 serves the kind's usual count.
    pub nlink: u32,
    /// Device number of a device node.
    pub rdev: u64,
    /// Whether the node follows commits (synthetic directories, `latest`,
    /// tags, history links); a generation's nodes never change.
    pub live: bool,
}

/// Where a directory's entries come from.
pub enum Dir {
    /// A synthetic directory: [`Tree::list`].
    Synthetic,
    /// Directory `path` (empty: the root) of a generation:
    /// [`Tree::visit_gen_dir`].
    Gen(Arc<Gen>, Vec<u8>),
}

impl Node {
    /// The identity of a node, stable for the life of the process: equal
    /// for equal nodes, different for different ones. A generation root
    /// that is open is per representation (after a materialization the new
    /// view is another node); an entry is its generation and path.
    pub fn identity(&self) -> Vec<u8> {
        match self {
            Node::Root => identity(0, "", 0, b""),
            Node::Set(s) => identity(1, s, 0, b""),
            Node::Latest(s) => identity(2, s, 0, b""),
            Node::Gens(s) => identity(3, s, 0, b""),
            Node::Tags(s) => identity(5, s, 0, b""),
            Node::Tag(s, t, g) => identity(6, s, *g, t.as_bytes()),
            Node::GenRoot {
                set,
                generation,
                gen,
            } => {
                let rep = gen.as_ref().map(|g| g.view.top().manifest_name.as_bytes());
                identity(7, set, *generation, rep.unwrap_or_default())
            }
            Node::Entry { gen, row, .. } => identity(4, &gen.set, gen.generation, &row.path()),
            Node::History { set, path } => identity(8, set, 0, path),
            Node::Versions { set, path } => identity(9, set, 0, path),
            Node::Version {
                set,
                path,
                generation,
            } => identity(10, set, *generation, path),
        }
    }

    /// Whether this is a directory of a generation (its root or an entry),
    /// as opposed to a synthetic one.
    pub fn is_generation_dir(&self) -> bool {
        match self {
            Node::GenRoot { .. } => true,
            Node::Entry { row, .. } => row.kind == Kind::Dir,
            _ => false,
        }
    }
}

fn identity(tag: u8, set: &str, gen: u64, path: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(13 + set.len() + path.len());
    k.push(tag);
    k.extend_from_slice(&(set.len() as u32).to_le_bytes());
    k.extend_from_slice(set.as_bytes());
    k.extend_from_slice(&gen.to_le_bytes());
    k.extend_from_slice(path);
    k
}

/// `set=… gen=… path=…`: what a log line names for a generation's path.
pub fn describe(gen: &Gen, path: &[u8]) -> String {
    format!(
        "set={} gen={} path={}",
        gen.set,
        gen.generation,
        if path.is_empty() {
            "/".into()
        } else {
            crate::row::show(path)
        }
    )
}

/// The node `history/<path>` stands for, given the kind of `path` in latest.
fn history_node(set: &str, path: Vec<u8>, kind: Kind) -> Node {
    let set = set.to_string();
    match kind {
        Kind::Dir => Node::History { set, path },
        _ => Node::Versions { set, path },
    }
}

/// `history/<path>/<N>` -> `../../gens/<N>/<path>`, one `..` per
/// component of `path` and one for `history`.
pub fn version_target(path: &[u8], generation: u64) -> Vec<u8> {
    let depth = path.split(|&b| b == b'/').count() + 1;
    let mut t = b"../".repeat(depth);
    t.extend_from_slice(format!("gens/{generation}/").as_bytes());
    t.extend_from_slice(path);
    t
}

/// `tags/<name>` -> `../gens/<N>`.
pub fn tag_target(generation: u64) -> Vec<u8> {
    format!("../gens/{generation}").into_bytes()
}

fn time_of(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// A generation number as `gens/` names it (canonical decimal only).
fn generation_name(name: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(name).ok()?;
    let n: u64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

impl Tree {
    /// The latest generation of `set` (pinned); `NotFound` for a set
    /// without generations.
    pub fn latest(&self, set: &str) -> TreeResult<Arc<Gen>> {
        self.gens()
            .latest(set)
            .map_err(|e| TreeError::store(format!("resolve latest set={set}"), e))?
            .ok_or(TreeError::NotFound)
    }

    /// The open generation of a generation root, opening (pinning) it if
    /// needed; `NotFound` if the index has no committed record of it.
    pub fn root_gen(
        &self,
        set: &str,
        generation: u64,
        gen: &Option<Arc<Gen>>,
    ) -> TreeResult<Arc<Gen>> {
        match gen {
            Some(g) => Ok(g.clone()),
            None => self.open_gen(set, generation),
        }
    }

    fn open_gen(&self, set: &str, generation: u64) -> TreeResult<Arc<Gen>> {
        absent_as_none(self.gens().get(set, generation))
            .map_err(|e| TreeError::store(format!("open set={set} gen={generation} path=/"), e))?
            .ok_or(TreeError::NotFound)
    }

    /// The entry at `pos` of `gen` (a position handed out earlier);
    /// `NotFound` if no row is there.
    pub fn entry_at(&self, gen: Arc<Gen>, pos: RowPos) -> TreeResult<Node> {
        let row = gen
            .view
            .row_at(pos)
            .map_err(|e| TreeError::store(describe(&gen, b"?"), e))?
            .ok_or(TreeError::NotFound)?;
        Ok(Node::Entry {
            gen,
            pos,
            row: Box::new(row),
        })
    }

    fn entry(&self, gen: Arc<Gen>, path: &[u8]) -> TreeResult<Node> {
        let (row, pos) = gen
            .view
            .locate(path)
            .map_err(|e| TreeError::store(describe(&gen, path), e))?
            .ok_or(TreeError::NotFound)?;
        Ok(Node::Entry {
            gen,
            pos,
            row: Box::new(row),
        })
    }

    /// The node named `name` in directory `parent`. `NotFound` only when
    /// there is no such name; `NotADirectory` if `parent` is not one.
    pub fn child(&self, parent: &Node, name: &[u8]) -> TreeResult<Node> {
        match parent {
            Node::Root => {
                let set = std::str::from_utf8(name).map_err(|_| TreeError::NotFound)?;
                self.sets()?
                    .into_iter()
                    .find(|s| s == set)
                    .map(Node::Set)
                    .ok_or(TreeError::NotFound)
            }
            Node::Set(s) => match name {
                b"latest" => Ok(Node::Latest(s.clone())),
                b"gens" => Ok(Node::Gens(s.clone())),
                b"tags" => Ok(Node::Tags(s.clone())),
                b"history" => Ok(Node::History {
                    set: s.clone(),
                    path: Vec::new(),
                }),
                _ => Err(TreeError::NotFound),
            },
            Node::History { set, path } => self.history_child(set, &join(path, name)),
            Node::Versions { set, path } => {
                let n = std::str::from_utf8(name)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok())
                    .ok_or(TreeError::NotFound)?;
                self.versions(set, path)?
                    .into_iter()
                    .find(|v| v.generation == n)
                    .map(|v| Node::Version {
                        set: set.clone(),
                        path: path.clone(),
                        generation: v.generation,
                    })
                    .ok_or(TreeError::NotFound)
            }
            Node::Gens(s) => {
                let n = generation_name(name).ok_or(TreeError::NotFound)?;
                let gen = self.open_gen(s, n)?;
                Ok(Node::GenRoot {
                    set: s.clone(),
                    generation: n,
                    gen: Some(gen),
                })
            }
            Node::Tags(s) => {
                let t = std::str::from_utf8(name).map_err(|_| TreeError::NotFound)?;
                let tag = absent_as_none(crate::tag::load(self.store(), s, t))
                    .map_err(|e| TreeError::store(format!("tag set={s} name={t}"), e))?
                    .ok_or(TreeError::NotFound)?;
                Ok(Node::Tag(s.clone(), tag.name, tag.generation))
            }
            Node::GenRoot {
                set,
                generation,
                gen,
            } => {
                let gen = self.root_gen(set, *generation, gen)?;
                self.entry(gen, name)
            }
            Node::Entry { gen, row, .. } if row.kind == Kind::Dir => {
                self.entry(gen.clone(), &join(&row.path(), name))
            }
            _ => Err(TreeError::NotADirectory),
        }
    }

    /// `history/<path>` for `path` of the latest generation: a directory
    /// there is another history directory, anything else its versions.
    fn history_child(&self, set: &str, path: &[u8]) -> TreeResult<Node> {
        let latest = self.latest(set)?;
        let row = latest
            .view
            .lookup(path)
            .map_err(|e| TreeError::store(describe(&latest, path), e))?
            .ok_or(TreeError::NotFound)?;
        Ok(history_node(set, path.to_vec(), row.kind))
    }

    /// The entries of directory `path` of the latest generation, as
    /// history nodes with their names.
    pub(super) fn history_entries(
        &self,
        set: &str,
        path: &[u8],
    ) -> TreeResult<Vec<(Node, Vec<u8>)>> {
        let latest = self.latest(set)?;
        let rows = latest
            .view
            .list_dir(path)
            .map_err(|e| TreeError::store(describe(&latest, path), e))?;
        Ok(rows
            .into_iter()
            .map(|r| (history_node(set, r.path(), r.kind), r.name))
            .collect())
    }

    /// The versions of `path` in `set`, each looked up through the served
    /// views (a generation retired meanwhile is passed over).
    pub(super) fn versions(
        &self,
        set: &str,
        path: &[u8],
    ) -> TreeResult<Vec<crate::history::Version>> {
        let what = || format!("history set={set} path={}", crate::row::show(path));
        let committed = absent_as_none(crate::history::committed(self.store(), set))
            .map_err(|e| TreeError::store(what(), e))?
            .ok_or(TreeError::NotFound)?;
        let gens: Vec<u64> = committed.into_iter().map(|(g, _)| g).collect();
        crate::history::versions_in(&gens, |g| match absent_as_none(self.gens().get(set, g))? {
            Some(gen) => gen.view.lookup(path),
            None => Ok(None),
        })
        .map_err(|e| TreeError::store(what(), e))
    }

    /// The target of a link node; `NotALink` for anything else.
    pub fn readlink(&self, node: &Node) -> TreeResult<Vec<u8>> {
        match node {
            Node::Latest(s) => self.latest_target(s),
            Node::Tag(_, _, g) => Ok(tag_target(*g)),
            Node::Version {
                path, generation, ..
            } => Ok(version_target(path, *generation)),
            Node::Entry { gen, row, .. } if row.kind == Kind::Symlink => {
                row.target.clone().ok_or_else(|| {
                    let what = describe(gen, &row.path());
                    let e = Error::corrupt("row", what.clone(), "a symlink has a target");
                    TreeError::store(what, e)
                })
            }
            _ => Err(TreeError::NotALink),
        }
    }

    fn latest_target(&self, set: &str) -> TreeResult<Vec<u8>> {
        let g = self.latest(set)?;
        Ok(format!("gens/{}", g.generation).into_bytes())
    }

    /// Attributes of a synthetic node of `kind` and `size`, without a
    /// listing's stamp (everything at the tree's start time).
    pub fn synthetic_attrs(&self, kind: NodeKind, size: u64) -> Attrs {
        Attrs {
            kind,
            size,
            blocks: 0,
            atime: self.started(),
            mtime: self.started(),
            ctime: self.started(),
            perm: if kind == NodeKind::Symlink {
                0o777
            } else {
                0o555
            },
            owner: None,
            nlink: 0,
            rdev: 0,
            live: true,
        }
    }

    /// Attributes of an entry from its row.
    pub fn entry_attrs(row: &Row) -> Attrs {
        let t = time_of(row.mtime_ns);
        Attrs {
            kind: NodeKind::of(row.kind),
            size: row.size,
            blocks: match row.blob {
                BlobLoc::Chunked { data, .. } => data.div_ceil(512),
                _ => row.size.div_ceil(512),
            },
            atime: t,
            mtime: t,
            ctime: time_of(row.ctime_ns.max(row.mtime_ns)),
            perm: (row.mode & 0o7777) as u16,
            owner: Some((row.uid, row.gid)),
            nlink: row.meta().nlink,
            rdev: row.meta().rdev,
            live: false,
        }
    }

    /// The attributes of `node`: a synthetic directory's mtime is its
    /// stamp ([`Tree::listing_mtime`]), a link's size its target's length,
    /// a generation root and an entry their row's.
    pub fn attrs(&self, node: &Node) -> TreeResult<Attrs> {
        let link = |target: Vec<u8>| self.synthetic_attrs(NodeKind::Symlink, target.len() as u64);
        Ok(match node {
            Node::Root
            | Node::Set(_)
            | Node::Gens(_)
            | Node::Tags(_)
            | Node::History { .. }
            | Node::Versions { .. } => {
                let mut attrs = self.synthetic_attrs(NodeKind::Dir, 0);
                attrs.mtime = self.listing_mtime(node);
                attrs
            }
            Node::Version {
                path, generation, ..
            } => link(version_target(path, *generation)),
            Node::GenRoot {
                set,
                generation,
                gen,
            } => {
                let gen = self.root_gen(set, *generation, gen)?;
                let what = describe(&gen, b"");
                let root = gen
                    .view
                    .lookup(b"")
                    .map_err(|e| TreeError::store(what.clone(), e))?
                    .ok_or_else(|| {
                        let e = Error::corrupt("generation", what.clone(), "it has a root row");
                        TreeError::store(what, e)
                    })?;
                Tree::entry_attrs(&root)
            }
            Node::Latest(s) => link(self.latest_target(s)?),
            Node::Tag(_, _, g) => link(tag_target(*g)),
            Node::Entry { row, .. } => Tree::entry_attrs(row),
        })
    }

    /// Where the entries of directory `node` come from; `NotADirectory`
    /// for a file or a link. A generation root is opened (pinned) here.
    pub fn dir(&self, node: &Node) -> TreeResult<Dir> {
        match node {
            Node::GenRoot {
                set,
                generation,
                gen,
            } => Ok(Dir::Gen(self.root_gen(set, *generation, gen)?, Vec::new())),
            Node::Entry { gen, row, .. } if row.kind == Kind::Dir => {
                Ok(Dir::Gen(gen.clone(), row.path()))
            }
            Node::Entry { .. } | Node::Latest(_) | Node::Tag(..) | Node::Version { .. } => {
                Err(TreeError::NotADirectory)
            }
            Node::Root
            | Node::Set(_)
            | Node::Gens(_)
            | Node::Tags(_)
            | Node::History { .. }
            | Node::Versions { .. } => Ok(Dir::Synthetic),
        }
    }

    /// Visit the entries of directory `path` of `gen` in key order, after
    /// the entry at `after` (a position of this directory handed out by an
    /// earlier visit; `BadOffset` if it is not one), until `f` says stop.
    /// Straight from the row ranges: nothing is kept between visits.
    pub fn visit_gen_dir(
        &self,
        gen: &Gen,
        path: &[u8],
        after: Option<RowPos>,
        f: impl FnMut(&Row, RowPos) -> bool,
    ) -> TreeResult<()> {
        let what = || describe(gen, path);
        let after = match after {
            None => None,
            Some(pos) => match gen
                .view
                .row_at(pos)
                .map_err(|e| TreeError::store(what(), e))?
            {
                Some(r) if r.parent == path => Some(r.name),
                _ => return Err(TreeError::BadOffset),
            },
        };
        gen.view
            .visit_dir(path, after.as_deref(), f)
            .map_err(|e| TreeError::store(what(), e))
    }
}
