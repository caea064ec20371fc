//! The mount's virtual tree: what the mount daemon serves, in plain Rust
//! types (no FUSE types; inode numbers, replies, TTLs, caches and threads
//! stay in the daemon, which only adapts this tree to the kernel).
//!
//! - [`layout`]: the namespace and its resolution. `<set>/latest ->
//!   gens/<N>`, `<set>/gens/<N>/…` (a generation's rows),
//!   `<set>/tags/<name> -> ../gens/<N>`, `<set>/history/<path>` (the
//!   directories of the latest generation; a file's versions as links
//!   `<N> -> ../…/gens/<N>/<path>`). [`Tree::child`] resolves a name in a
//!   directory, [`Tree::readlink`] a link, [`Tree::attrs`] a node's
//!   attributes.
//! - [`listing`]: listings of synthetic directories ([`Tree::list`], with
//!   their offsets) and their stamps: a synthetic directory's mtime carries
//!   a fingerprint of what it lists ([`Tree::listing_mtime`]), so a kept
//!   copy of a listing can be checked by its attributes alone.
//! - [`served`]: the served generations, pinned views shared by every user.
//! - [`verification`]: when a blob may be served and when it must be
//!   verified first (`--verify` first-open, always, off), piece trees for
//!   remote blobs, and dropping then refetching a bad cached copy.
//!
//! Errors: [`TreeError::NotFound`] means only "no such name" (a lookup
//! that finds no row, no generation, tag or set of that name); a store
//! failure is [`TreeError::Store`] with the core's [`Error`] (a missing
//! pack, blob or segment of a served generation is `Error::MissingObject`,
//! of kind Unavailable, never `NotFound`).

pub mod assembled;
pub mod layout;
pub mod listing;
pub mod served;
pub mod verification;

pub use layout::{Attrs, Dir, Node, NodeKind};
pub use listing::DirItem;
pub use served::{Gen, Gens, PinRetaken};
pub use verification::{OpenedBlob, Verifier, VerifyCounts, VerifyPolicy};

use crate::error::Error;
use crate::Store;
use std::sync::Arc;
use std::time::SystemTime;

/// Why the tree answers no node or value.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// No such name (ENOENT to a FUSE caller).
    #[error("no such name")]
    NotFound,
    /// A name was looked up or a listing asked of something that is not a
    /// directory.
    #[error("not a directory")]
    NotADirectory,
    /// A link target was asked of something that is not a link.
    #[error("not a link")]
    NotALink,
    /// A listing was resumed from a position that is not one of its entries.
    #[error("not a position of this directory")]
    BadOffset,
    /// The store failed while serving `what` (set, generation and path, or
    /// what was being read).
    #[error("{what}")]
    Store {
        what: String,
        #[source]
        error: Error,
    },
}

pub type TreeResult<T> = std::result::Result<T, TreeError>;

impl TreeError {
    /// A store failure while serving `what`.
    pub fn store(what: impl Into<String>, error: Error) -> TreeError {
        TreeError::Store {
            what: what.into(),
            error,
        }
    }
}

/// A name of the mount's namespace the core reports as not existing: a
/// generation the index has no committed record of (never was, not yet, or
/// retired), a tag, a set without generations: `Ok(None)`. Everything else
/// stays an error, a missing stored object (`Error::MissingObject`)
/// included.
pub fn absent_as_none<T>(r: crate::Result<T>) -> crate::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The virtual tree of a store: its sets (all, or the ones named), their
/// served generations, and the time its synthetic nodes carry.
pub struct Tree {
    gens: Arc<Gens>,
    /// Sets served; empty means every set of the store.
    only: Vec<String>,
    /// The time of synthetic nodes (whole seconds; a synthetic directory's
    /// stamp is in the nanoseconds).
    started: SystemTime,
}

impl Tree {
    /// The tree of `gens`' store serving the sets `only` (empty: all),
    /// with `started` as the time of its synthetic nodes.
    pub fn new(gens: Arc<Gens>, only: Vec<String>, started: SystemTime) -> Tree {
        Tree {
            gens,
            only,
            started,
        }
    }

    pub fn gens(&self) -> &Arc<Gens> {
        &self.gens
    }

    pub fn store(&self) -> &Store {
        self.gens.store()
    }

    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// The sets served, in the store's order.
    pub fn sets(&self) -> TreeResult<Vec<String>> {
        let all = self
            .store()
            .sets()
            .map_err(|e| TreeError::store("list sets", e))?;
        Ok(all
            .into_iter()
            .filter(|s| self.only.is_empty() || self.only.contains(s))
            .collect())
    }
}
