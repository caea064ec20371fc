//! The local cache of immutable objects of a remote store.
//!
//! Owns `<cache>/objects/<key>`: whole copies of manifests, segments, packs
//! and standalone blobs. Every one of them is named by a digest of its whole
//! content (SHA-256, or BLAKE3 for blobs; docs/FORMAT.md "Layout"), so a copy
//! is admitted only after its content hashes to its name: the cache can
//! never serve bytes the store does not hold.
//!
//! Copies are written under a temporary name and renamed, and they survive
//! restarts. They are not fsynced: a power loss may leave a torn copy under
//! its name, but readers check what they serve (a blob at a process's first
//! open; manifests, segments and packed files as they are parsed or
//! decoded), and a copy that fails a check is dropped and fetched again
//! ([`crate::Store::read_fresh`], the mount's open), so a torn or otherwise
//! changed copy costs a download, never a wrong byte.
//!
//! Several processes of one host (the CLI beside a daemon) may share the
//! directory; each keeps its own view of recency and budget, so together
//! they may exceed it briefly. The total size is bounded: past the budget
//! the least recently used copies are removed (recency is kept in memory and
//! seeded from file times at start). Removing a copy never disturbs a reader
//! that has it open.

use crate::error::{Error, IoContext, Result};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// A temporary fill file untouched this long belongs to a dead process.
const STALE_TEMP: std::time::Duration = std::time::Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hash {
    Sha256,
    Blake3,
    /// A chunk object: the BLAKE3 of its decoded content.
    Chunk,
}

/// The digest a key is named by, for keys of immutable objects.
fn named_digest(key: &str) -> Option<(Hash, &str)> {
    let name = key.rsplit('/').next()?;
    let (hash, hex) = if key.starts_with("blobs/") || key.starts_with("chunklists/") {
        (Hash::Blake3, name)
    } else if key.starts_with("chunks/") {
        (Hash::Chunk, name)
    } else if key.starts_with("manifests/") {
        (Hash::Sha256, name.strip_suffix(".json")?)
    } else if key.starts_with("segments/") {
        (Hash::Sha256, name.strip_suffix(".parquet")?)
    } else if key.starts_with("packs/") {
        (Hash::Sha256, name.strip_suffix(".pack")?)
    } else {
        return None;
    };
    let valid = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then_some((hash, hex))
}

/// True for keys whose objects never change once written.
pub(crate) fn is_immutable(key: &str) -> bool {
    named_digest(key).is_some()
}

#[derive(Debug)]
struct Entry {
    size: u64,
    used: u64,
}

#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<String, Entry>,
    total: u64,
    clock: u64,
    /// Keys this process admitted (and so hashed against their names)
    /// whose copies are still cached.
    admitted_here: HashSet<String>,
}

impl Lru {
    fn forget(&mut self, key: &str) -> bool {
        self.admitted_here.remove(key);
        match self.entries.remove(key) {
            Some(e) => {
                self.total -= e.size;
                true
            }
            None => false,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Cache {
    dir: PathBuf,
    budget: u64,
    lru: Mutex<Lru>,
}

impl Cache {
    /// Open (creating) the cache under `dir`, seeding recency from file times.
    pub(crate) fn open(dir: &Path, budget: u64) -> Result<Cache> {
        let objects = dir.join("objects");
        super::ensure_local_dir(&objects)?;
        let mut found = Vec::new();
        scan(&objects, &objects, &mut found)?;
        found.sort_by_key(|(_, _, t)| *t);
        let mut lru = Lru::default();
        for (key, size, _) in found {
            lru.clock += 1;
            lru.total += size;
            let used = lru.clock;
            lru.entries.insert(key, Entry { size, used });
        }
        let cache = Cache {
            dir: objects,
            budget,
            lru: Mutex::new(lru),
        };
        cache.evict(0);
        Ok(cache)
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// Open the cached copy of `key`, marking it recently used.
    pub(crate) fn open_copy(&self, key: &str) -> Option<File> {
        let file = File::open(self.path(key)).ok()?;
        let mut lru = self.lru.lock().unwrap_or_else(PoisonError::into_inner);
        lru.clock += 1;
        let now = lru.clock;
        if let Some(e) = lru.entries.get_mut(key) {
            e.used = now;
        }
        Some(file)
    }

    /// A temporary file for filling `key`; pass it to [`Cache::admit`].
    pub(crate) fn temp(&self, key: &str) -> Result<(PathBuf, File)> {
        let path = self.path(key);
        let parent = path.parent().unwrap_or(&self.dir);
        super::ensure_local_dir(parent)?;
        let tmp = parent.join(format!(".tmp-{}", crate::token::new_token()));
        let file = crate::token::create_private(&tmp)?;
        Ok((tmp, file))
    }

    /// Verify a filled temporary file against the name of `key` and make it
    /// the cached copy; a mismatch removes it and is reported as corruption.
    /// `blake3`: the hash of the content, taken while it was written (for a
    /// blob, then not read again).
    pub(crate) fn admit(&self, key: &str, tmp: &Path, blake3: Option<[u8; 32]>) -> Result<()> {
        let verdict = match blake3 {
            Some(hash) if key.starts_with("blobs/") => matches_name(key, &hex::encode(hash)),
            _ => verify(key, tmp),
        };
        if let Err(e) = verdict {
            super::remove_or_warn(tmp, "temporary cache file");
            return Err(e);
        }
        let size = fs::metadata(tmp).ctx("stat", tmp)?.len();
        if size > self.budget {
            super::remove_or_warn(tmp, "temporary cache file");
            return Ok(());
        }
        let path = self.path(key);
        if let Err(e) = fs::rename(tmp, &path) {
            super::remove_or_warn(tmp, "temporary cache file");
            return Err(Error::io("admit", &path, e));
        }
        let mut lru = self.lru.lock().unwrap_or_else(PoisonError::into_inner);
        lru.clock += 1;
        let used = lru.clock;
        if let Some(old) = lru.entries.insert(key.to_string(), Entry { size, used }) {
            lru.total -= old.size;
        }
        lru.total += size;
        lru.admitted_here.insert(key.to_string());
        drop(lru);
        self.evict(0);
        Ok(())
    }

    /// Whether an object of `size` bytes may be admitted at all.
    pub(crate) fn fits(&self, size: u64) -> bool {
        size <= self.budget / 4
    }

    /// Remove least recently used copies until `extra` more bytes fit.
    fn evict(&self, extra: u64) {
        let mut lru = self.lru.lock().unwrap_or_else(PoisonError::into_inner);
        while lru.total + extra > self.budget {
            let Some(victim) = lru
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            lru.forget(&victim);
            super::remove_or_warn(&self.path(&victim), "evicted cache copy");
        }
    }

    /// Drop the copy of `key` (it failed a check after admission: the local
    /// disk changed it); true if there was one.
    pub(crate) fn remove(&self, key: &str) -> bool {
        let mut lru = self.lru.lock().unwrap_or_else(PoisonError::into_inner);
        let known = lru.forget(key);
        let removed = fs::remove_file(self.path(key)).is_ok();
        known || removed
    }

    /// Whether this process admitted the copy of `key`, hashing it against
    /// its name, and it is still cached.
    pub(crate) fn admitted_here(&self, key: &str) -> bool {
        let lru = self.lru.lock().unwrap_or_else(PoisonError::into_inner);
        lru.admitted_here.contains(key)
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> u64 {
        self.lru
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

fn verify(key: &str, file: &Path) -> Result<()> {
    let Some((hash, _)) = named_digest(key) else {
        return Err(Error::internal(format!(
            "not a content-named object: key=`{key}`"
        )));
    };
    if hash == Hash::Chunk {
        let stored = fs::read(file).ctx("read", file)?;
        let got = crate::format::chunk::content_digest(key, &stored)?;
        return matches_name(key, &hex::encode(got));
    }
    let mut f = File::open(file).ctx("open", file)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut sha = Sha256::new();
    let mut b3 = blake3::Hasher::new();
    loop {
        let n = f.read(&mut buf).ctx("read", file)?;
        if n == 0 {
            break;
        }
        match hash {
            Hash::Sha256 => sha.update(&buf[..n]),
            Hash::Blake3 | Hash::Chunk => {
                b3.update(&buf[..n]);
            }
        }
    }
    let got = match hash {
        Hash::Sha256 => hex::encode(sha.finalize()),
        Hash::Blake3 | Hash::Chunk => b3.finalize().to_hex().to_string(),
    };
    matches_name(key, &got)
}

/// `Corrupt` unless `got` (lower-case hex) is the digest `key` is named by.
fn matches_name(key: &str, got: &str) -> Result<()> {
    if named_digest(key).map(|(_, want)| want) != Some(got) {
        return Err(Error::corrupt(
            "object",
            key,
            format!("content does not hash to its name: got={got}"),
        ));
    }
    Ok(())
}

fn scan(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, u64, std::time::SystemTime)>,
) -> Result<()> {
    for entry in fs::read_dir(dir).ctx("readdir", dir)? {
        let entry = entry.ctx("readdir", dir)?;
        let path = entry.path();
        let md = match entry.metadata() {
            Ok(md) => md,
            // Admitted or evicted by another process meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("stat", &path, e)),
        };
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(".tmp-") {
            // Another process (the CLI beside a daemon) may be filling it.
            let stale = md.modified().ok().and_then(|t| t.elapsed().ok());
            if stale.is_some_and(|age| age > STALE_TEMP) {
                super::remove_or_warn(&path, "stale temporary cache file");
            }
        } else if md.is_dir() {
            scan(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            let key = rel.to_string_lossy().to_string();
            if is_immutable(&key) {
                let t = md.modified().unwrap_or(std::time::UNIX_EPOCH);
                out.push((key, md.len(), t));
            }
        }
    }
    Ok(())
}
