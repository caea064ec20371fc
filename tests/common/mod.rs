//! The test kit, shared by every integration test binary: `tests/*.rs`
//! (`mod common;`) and `mountd/tests/mount.rs` (through `#[path]`).
//!
//! - `store.rs`: new stores (local, or on the S3 test server), commits,
//!   snapshots of real trees and of generations, prepared stores.
//! - `trees.rs`: writing source trees: files, modes, deterministic noise,
//!   a tree with every kind of entry, copies, listings.
//! - `cli.rs`: running the `strata` binary (plain, with an environment
//!   variable, with failpoints, on S3) and watching the processes it starts.
//! - `mount.rs`: mounts that are detached when dropped (through the CLI or a
//!   daemon started directly), and `Scratch`, a temporary directory with a
//!   store, a source tree and a mount point.

// Each test binary uses a different subset of the kit; what one binary does
// not use would otherwise be a dead-code warning in that binary (and clippy
// runs with `-D warnings` on all targets). For the same reason the
// re-exports below allow being unused.
#![allow(dead_code)]

mod cli;
mod mount;
mod store;
mod trees;

#[allow(unused_imports)]
pub use {cli::*, mount::*, store::*, trees::*};
