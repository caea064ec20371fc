//! The key layout of a store (docs/FORMAT.md, "Layout"): every key and key
//! prefix anything reads or writes is built here, so the layout has one
//! source of truth. Object names are digests; versioned records carry
//! zero-padded numbers so listings sort by version.

/// The store's format marker.
pub const MARKER: &str = "STORE";
/// The disk budget pointer.
pub const BUDGET: &str = "budget.json";
/// Directory of every set.
pub const SETS: &str = "sets";
/// Directory of every task that is not yet compacted.
pub const TASKS: &str = "tasks";
/// Final records of compacted tasks, one per task, removed after a keep period.
pub const TASKS_DONE: &str = "tasks-done";
/// Task records moved aside by `strata tasks --quarantine`.
pub const TASKS_QUARANTINE: &str = "tasks-quarantine";
/// Directory of every set's pins.
pub const PINS: &str = "pins";
/// Staging directories and their owner leases.
pub const STAGING: &str = "staging";
/// Directory of every set's journals.
pub const JOURNALS: &str = "journals";
/// One sweeper at a time holds this.
pub const SWEEPER_LEASE: &str = "sweep/SWEEPER.lease";
/// Held by a sweep's deletion batch; writers wait while it is held.
pub const DELETING_LEASE: &str = "sweep/DELETING.lease";
/// Directories of content-named objects (what a store's size counts).
pub const OBJECT_DIRS: [&str; 6] = [MANIFESTS, SEGMENTS, PACKS, BLOBS, CHUNK_LISTS, CHUNKS];
pub const MANIFESTS: &str = "manifests";
pub const SEGMENTS: &str = "segments";
pub const PACKS: &str = "packs";
pub const BLOBS: &str = "blobs";
pub const CHUNK_LISTS: &str = "chunklists";
pub const CHUNKS: &str = "chunks";
/// Name suffixes of manifests, segments and packs (blobs have none).
pub const MANIFEST_SUFFIX: &str = ".json";
pub const SEGMENT_SUFFIX: &str = ".parquet";
pub const PACK_SUFFIX: &str = ".pack";
/// Assembled copies of chunked files, in the local directory of a mount
/// (`mount_tree::assembled`); never part of the store's objects.
pub const ASSEMBLED: &str = "assembled";
/// Sweep epochs: reports and condemned lists.
pub const EPOCH_DIR: &str = "sweep/epochs";
/// Scratch of running sweeps (sorted runs, the staged condemned list), one
/// directory per sweep; local even for a remote store.
pub const SWEEP_SCRATCH: &str = "sweep/scratch";

pub fn manifest(name: &str) -> String {
    format!("{MANIFESTS}/{name}{MANIFEST_SUFFIX}")
}
pub fn segment(name: &str) -> String {
    format!(
        "{SEGMENTS}/{}/{name}{SEGMENT_SUFFIX}",
        name.get(..2).unwrap_or("")
    )
}
pub fn pack(name: &str) -> String {
    format!(
        "{PACKS}/{}/{name}{PACK_SUFFIX}",
        name.get(..2).unwrap_or("")
    )
}
pub fn blob(digest_hex: &str) -> String {
    format!("{BLOBS}/{}/{digest_hex}", digest_hex.get(..2).unwrap_or(""))
}
/// A chunk, named by the BLAKE3 of its raw bytes.
pub fn chunk(digest_hex: &str) -> String {
    format!(
        "{CHUNKS}/{}/{digest_hex}",
        digest_hex.get(..2).unwrap_or("")
    )
}
/// A chunk list, named by the BLAKE3 of its bytes.
pub fn chunk_list(digest_hex: &str) -> String {
    format!(
        "{CHUNK_LISTS}/{}/{digest_hex}",
        digest_hex.get(..2).unwrap_or("")
    )
}
pub fn journal_dir(set: &str) -> String {
    format!("{JOURNALS}/{set}")
}
pub fn journal(set: &str, token: &str) -> String {
    format!("{JOURNALS}/{set}/{token}.journal")
}
pub fn writer_lease(set: &str) -> String {
    format!("sets/{set}/WRITER.lease")
}
pub fn index_dir(set: &str) -> String {
    format!("sets/{set}/index")
}
/// Record `record` of generation `generation` of `set`.
pub fn index_record(set: &str, generation: u64, record: u32) -> String {
    format!("sets/{set}/index/{generation:020}.{record:06}.json")
}
/// The `LATEST` hint pointer of `set`.
pub fn latest(set: &str) -> String {
    format!("sets/{set}/LATEST")
}
pub fn retention(set: &str) -> String {
    format!("sets/{set}/retention.json")
}
/// Taken by retention and by tagging (`tag::protection_lock`).
pub fn retention_lock(set: &str) -> String {
    format!("sets/{set}/RETAIN.lease")
}
pub fn pin_dir(set: &str) -> String {
    format!("pins/{set}")
}
pub fn pin(set: &str, name: &str) -> String {
    format!("pins/{set}/{name}")
}
pub fn tag_dir(set: &str) -> String {
    format!("sets/{set}/tags")
}
pub fn tag(set: &str, name: &str) -> String {
    format!("sets/{set}/tags/{name}.json")
}
/// Record `record` of task `id`.
pub fn task_record(id: &str, record: u32) -> String {
    format!("tasks/{id}/{record:06}.json")
}
/// Every record (and checkpoint) of task `id`.
pub fn task_dir(id: &str) -> String {
    format!("tasks/{id}")
}
/// The advisory checkpoint of attempt `attempt` of task `id`.
pub fn task_checkpoint(id: &str, attempt: u32) -> String {
    format!("tasks/{id}/checkpoint.{attempt:03}.json")
}
/// The one final record a compacted task keeps.
pub fn task_done(id: &str) -> String {
    format!("tasks-done/{id}.json")
}
/// Where `strata tasks --quarantine` moves file `name` of task `id`.
pub fn task_quarantined(id: &str, name: &str) -> String {
    format!("tasks-quarantine/{id}/{name}")
}
pub fn staging_dir(token: &str) -> String {
    format!("staging/{token}")
}
pub fn staging_owner(token: &str) -> String {
    format!("staging/{token}.owner")
}
/// The token of a staging owner lease key.
pub fn staging_token(owner_key: &str) -> Option<&str> {
    owner_key.strip_prefix("staging/")?.strip_suffix(".owner")
}
/// A sweep epoch's file (`report`, `condemned`).
pub fn epoch(epoch: u64, what: &str) -> String {
    format!("sweep/epochs/{epoch:020}.{what}")
}
/// The scratch directory of the sweep `token`.
pub fn sweep_scratch(token: &str) -> String {
    format!("{SWEEP_SCRATCH}/{token}")
}
/// A file of the epoch directory by its listed name.
pub fn epoch_file(name: &str) -> String {
    format!("sweep/epochs/{name}")
}
