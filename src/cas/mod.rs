//! The two compare-and-swap primitives every durable record and pointer of
//! the store goes through (docs/FORMAT.md, "Commit protocol"):
//!
//! - [`versioned`]: an object whose changes are a chain of create-once
//!   records with zero-padded version numbers (index records, task records,
//!   tags, condemned lists). Creating the next version exclusively is the CAS;
//!   there is no ABA because a name is never written twice.
//! - [`pointer`]: a small mutable object replaced by CAS on its exact bytes
//!   (the `LATEST` hint, a set's retention policy, the disk budget). Every
//!   body carries a counter and a nonce, so A → B → A never matches.
//!
//! Callers check their named invariant predicates over (current, new) right
//! before the write these functions make.

pub mod pointer;
pub mod versioned;
