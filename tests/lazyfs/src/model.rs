//! The in-memory tree with two states: what readers see now (live) and what
//! would survive a power cut (durable).
//!
//! Durability rules, the strictest POSIX allows:
//! - a file's data and size become durable on `fsync` of that file;
//! - a directory entry (create, mkdir, symlink, unlink, rmdir) becomes
//!   durable on `fsync` of its directory;
//! - a rename becomes durable, on both sides at once, on `fsync` of either
//!   directory it touches;
//! - making an entry operation durable also makes the earlier pending
//!   operations on the same inode durable (a journaling filesystem never
//!   shows a later rename of an inode without the earlier ones).
//!
//! Attributes other than size (mode, times) are not modelled as volatile.
//! A power cut ([`Tree::crash`]) keeps the durable state plus an allowed
//! subset of what was pending, chosen by [`CrashMode`] and a seed.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

pub const ROOT: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A socket (what a mount daemon binds its control socket to) or a
    /// FIFO; `mode` keeps its type bits. Not written to the image: after a
    /// power cut nobody listens on it.
    Special,
}

/// One change to a file's content since its last fsync.
#[derive(Debug, Clone)]
enum DataOp {
    Write { offset: u64, bytes: Vec<u8> },
    Truncate(u64),
}

/// One change to a directory entry not yet durable.
#[derive(Debug, Clone)]
enum EntryOp {
    Link {
        dir: u64,
        name: OsString,
        ino: u64,
    },
    Unlink {
        dir: u64,
        name: OsString,
        ino: u64,
    },
    Rename {
        from: u64,
        from_name: OsString,
        to: u64,
        to_name: OsString,
        ino: u64,
    },
}

impl EntryOp {
    fn ino(&self) -> u64 {
        match self {
            EntryOp::Link { ino, .. }
            | EntryOp::Unlink { ino, .. }
            | EntryOp::Rename { ino, .. } => *ino,
        }
    }

    fn touches(&self, d: u64) -> bool {
        match self {
            EntryOp::Link { dir, .. } | EntryOp::Unlink { dir, .. } => *dir == d,
            EntryOp::Rename { from, to, .. } => *from == d || *to == d,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Inode {
    pub kind: Kind,
    pub mode: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Live content (files) or link target (symlinks).
    pub data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<DataOp>,
    pub entries: BTreeMap<OsString, u64>,
    durable_entries: BTreeMap<OsString, u64>,
    /// Live location, for trace lines.
    pub parent: u64,
    pub name: OsString,
}

impl Inode {
    fn new(kind: Kind, mode: u32, parent: u64, name: &OsStr) -> Inode {
        let now = SystemTime::now();
        Inode {
            kind,
            mode,
            mtime: now,
            ctime: now,
            data: Vec::new(),
            durable: Vec::new(),
            pending: Vec::new(),
            entries: BTreeMap::new(),
            durable_entries: BTreeMap::new(),
            parent,
            name: name.to_os_string(),
        }
    }

    /// Data operations since the last fsync (0: the data is durable).
    pub fn unsynced(&self) -> usize {
        self.pending.len()
    }
}

/// What a power cut keeps of what was pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Nothing: only what was fsynced survives.
    Strict,
    /// A random prefix of the pending entry operations (in order, as a
    /// journal commits them) and, per file, a random prefix of its pending
    /// writes: data and names may reach the disk in either order.
    Prefix,
}

/// What one crash kept, for the log line.
#[derive(Debug, Default)]
pub struct CrashReport {
    pub entry_ops_pending: usize,
    pub entry_ops_kept: usize,
    pub files_pending: usize,
    pub files_torn: usize,
}

#[derive(Debug)]
pub struct Tree {
    pub inodes: BTreeMap<u64, Inode>,
    next_ino: u64,
    pending: Vec<EntryOp>,
}

/// Errors as errnos (the FUSE adapter replies with them).
pub type Res<T> = Result<T, i32>;

impl Tree {
    pub fn new() -> Tree {
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, Inode::new(Kind::Dir, 0o755, ROOT, OsStr::new("")));
        Tree {
            inodes,
            next_ino: ROOT + 1,
            pending: Vec::new(),
        }
    }

    pub fn get(&self, ino: u64) -> Res<&Inode> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn get_mut(&mut self, ino: u64) -> Res<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Res<&Inode> {
        let d = self.get(ino)?;
        match d.kind {
            Kind::Dir => Ok(d),
            _ => Err(libc::ENOTDIR),
        }
    }

    pub fn lookup(&self, dir: u64, name: &OsStr) -> Res<u64> {
        self.dir(dir)?
            .entries
            .get(name)
            .copied()
            .ok_or(libc::ENOENT)
    }

    /// Live path of `ino` (for trace lines).
    pub fn path(&self, mut ino: u64) -> String {
        let mut parts = Vec::new();
        while ino != ROOT {
            let Some(i) = self.inodes.get(&ino) else {
                break;
            };
            parts.push(i.name.to_string_lossy().into_owned());
            ino = i.parent;
        }
        parts.reverse();
        parts.join("/")
    }

    /// Load an inode that is durable already (from the image).
    pub fn load(&mut self, dir: u64, name: &OsStr, kind: Kind, mode: u32, data: Vec<u8>) -> u64 {
        let ino = self.alloc(kind, mode, dir, name);
        let i = self.inodes.get_mut(&ino).expect("just allocated");
        i.durable = data.clone();
        i.data = data;
        let d = self.inodes.get_mut(&dir).expect("loaded parent");
        d.entries.insert(name.to_os_string(), ino);
        d.durable_entries.insert(name.to_os_string(), ino);
        ino
    }

    pub fn set_mtime(&mut self, ino: u64, t: SystemTime) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.mtime = t;
        }
    }

    fn alloc(&mut self, kind: Kind, mode: u32, parent: u64, name: &OsStr) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes
            .insert(ino, Inode::new(kind, mode, parent, name));
        ino
    }

    /// Create `name` in `dir` (file, directory or symlink to `target`).
    pub fn create(
        &mut self,
        dir: u64,
        name: &OsStr,
        kind: Kind,
        mode: u32,
        target: &[u8],
    ) -> Res<u64> {
        if self.dir(dir)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.alloc(kind, mode, dir, name);
        let i = self.get_mut(ino)?;
        i.data = target.to_vec();
        i.durable = target.to_vec();
        self.get_mut(dir)?.entries.insert(name.to_os_string(), ino);
        self.touch(dir);
        self.pending.push(EntryOp::Link {
            dir,
            name: name.to_os_string(),
            ino,
        });
        Ok(ino)
    }

    fn touch(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            let now = SystemTime::now();
            i.mtime = now;
            i.ctime = now;
        }
    }

    /// Remove `name` from `dir`; `want_dir` says rmdir rather than unlink.
    pub fn remove(&mut self, dir: u64, name: &OsStr, want_dir: bool) -> Res<()> {
        let ino = self.lookup(dir, name)?;
        let i = self.get(ino)?;
        match (i.kind == Kind::Dir, want_dir) {
            (true, false) => return Err(libc::EISDIR),
            (false, true) => return Err(libc::ENOTDIR),
            (true, true) if !i.entries.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.get_mut(dir)?.entries.remove(name);
        self.touch(dir);
        self.pending.push(EntryOp::Unlink {
            dir,
            name: name.to_os_string(),
            ino,
        });
        Ok(())
    }

    /// Rename; `noreplace` fails with EEXIST when the target exists.
    pub fn rename(
        &mut self,
        from: u64,
        name: &OsStr,
        to: u64,
        to_name: &OsStr,
        noreplace: bool,
    ) -> Res<()> {
        let ino = self.lookup(from, name)?;
        self.dir(to)?;
        if let Ok(old) = self.lookup(to, to_name) {
            if old == ino {
                return Ok(());
            }
            if noreplace {
                return Err(libc::EEXIST);
            }
            let (src, dst) = (self.get(ino)?, self.get(old)?);
            match (src.kind == Kind::Dir, dst.kind == Kind::Dir) {
                (false, true) => return Err(libc::EISDIR),
                (true, false) => return Err(libc::ENOTDIR),
                (true, true) if !dst.entries.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        if self.get(ino)?.kind == Kind::Dir && self.is_ancestor(ino, to) {
            return Err(libc::EINVAL);
        }
        self.get_mut(from)?.entries.remove(name);
        self.get_mut(to)?
            .entries
            .insert(to_name.to_os_string(), ino);
        let i = self.get_mut(ino)?;
        i.parent = to;
        i.name = to_name.to_os_string();
        self.touch(from);
        self.touch(to);
        self.pending.push(EntryOp::Rename {
            from,
            from_name: name.to_os_string(),
            to,
            to_name: to_name.to_os_string(),
            ino,
        });
        Ok(())
    }

    fn is_ancestor(&self, a: u64, mut d: u64) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == ROOT {
                return false;
            }
            match self.inodes.get(&d) {
                Some(i) => d = i.parent,
                None => return false,
            }
        }
    }

    pub fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Res<()> {
        let i = self.get_mut(ino)?;
        if i.kind != Kind::File {
            return Err(libc::EISDIR);
        }
        let op = DataOp::Write {
            offset,
            bytes: bytes.to_vec(),
        };
        apply(&mut i.data, &op);
        i.pending.push(op);
        self.touch(ino);
        Ok(())
    }

    pub fn truncate(&mut self, ino: u64, size: u64) -> Res<()> {
        let i = self.get_mut(ino)?;
        if i.kind != Kind::File {
            return Err(libc::EISDIR);
        }
        let op = DataOp::Truncate(size);
        apply(&mut i.data, &op);
        i.pending.push(op);
        self.touch(ino);
        Ok(())
    }

    pub fn chmod(&mut self, ino: u64, mode: u32) -> Res<()> {
        let i = self.get_mut(ino)?;
        i.mode = (i.mode & !0o7777) | (mode & 0o7777);
        Ok(())
    }

    /// `fsync` of a file: its data is durable. Of a directory: its entries.
    pub fn fsync(&mut self, ino: u64) -> Res<()> {
        if self.get(ino)?.kind == Kind::Dir {
            self.sync_entries(ino);
            return Ok(());
        }
        let i = self.get_mut(ino)?;
        i.durable = i.data.clone();
        i.pending.clear();
        Ok(())
    }

    /// Make durable every pending entry operation touching `dir`, with the
    /// earlier operations on the same inodes.
    fn sync_entries(&mut self, dir: u64) {
        let mut inos: HashSet<u64> = HashSet::new();
        let mut last = None;
        for (k, op) in self.pending.iter().enumerate() {
            if op.touches(dir) {
                inos.insert(op.ino());
                last = Some(k);
            }
        }
        let Some(last) = last else { return };
        let (mut keep, mut done) = (Vec::new(), Vec::new());
        for (k, op) in std::mem::take(&mut self.pending).into_iter().enumerate() {
            let chosen = op.touches(dir) || (k <= last && inos.contains(&op.ino()));
            if chosen {
                done.push(op);
            } else {
                keep.push(op);
            }
        }
        for op in &done {
            self.apply_durable(op);
        }
        self.pending = keep;
    }

    fn apply_durable(&mut self, op: &EntryOp) {
        let inodes = &mut self.inodes;
        match op {
            EntryOp::Link { dir, name, ino } => {
                if let Some(e) = durable_entries_of(inodes, *dir) {
                    e.insert(name.clone(), *ino);
                }
            }
            EntryOp::Unlink { dir, name, ino } => {
                if let Some(e) = durable_entries_of(inodes, *dir) {
                    if e.get(name) == Some(ino) {
                        e.remove(name);
                    }
                }
            }
            EntryOp::Rename {
                from,
                from_name,
                to,
                to_name,
                ino,
            } => {
                if let Some(e) = durable_entries_of(inodes, *from) {
                    if e.get(from_name) == Some(ino) {
                        e.remove(from_name);
                    }
                }
                if let Some(e) = durable_entries_of(inodes, *to) {
                    e.insert(to_name.clone(), *ino);
                }
            }
        }
    }

    /// A power cut: what survives becomes both the durable and the live state.
    pub fn crash(&mut self, mode: CrashMode, rng: &mut Rng) -> CrashReport {
        let mut report = CrashReport {
            entry_ops_pending: self.pending.len(),
            ..CrashReport::default()
        };
        if mode == CrashMode::Prefix {
            let keep = rng.below(self.pending.len() + 1);
            report.entry_ops_kept = keep;
            let kept: Vec<EntryOp> = self.pending.drain(..keep).collect();
            for op in &kept {
                self.apply_durable(op);
            }
        }
        self.pending.clear();
        for i in self.inodes.values_mut() {
            if i.pending.is_empty() {
                continue;
            }
            report.files_pending += 1;
            let keep = match mode {
                CrashMode::Strict => 0,
                CrashMode::Prefix => rng.below(i.pending.len() + 1),
            };
            if keep > 0 && keep < i.pending.len() {
                report.files_torn += 1;
            }
            for op in &i.pending[..keep] {
                apply(&mut i.durable, op);
            }
            i.pending.clear();
            i.data = i.durable.clone();
        }
        for i in self.inodes.values_mut() {
            i.entries = i.durable_entries.clone();
        }
        report
    }

    /// Entries of `dir` in the durable state (for writing the image).
    pub fn durable_entries(&self, dir: u64) -> Vec<(OsString, u64)> {
        self.inodes
            .get(&dir)
            .map(|d| {
                d.durable_entries
                    .iter()
                    .map(|(n, i)| (n.clone(), *i))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Everything pending becomes durable (a clean shutdown).
    pub fn sync_all(&mut self) {
        for op in std::mem::take(&mut self.pending) {
            self.apply_durable(&op);
        }
        for i in self.inodes.values_mut() {
            i.durable = i.data.clone();
            i.pending.clear();
        }
    }

    pub fn durable_data(&self, ino: u64) -> &[u8] {
        self.inodes.get(&ino).map_or(&[], |i| &i.durable)
    }
}

fn durable_entries_of(
    inodes: &mut BTreeMap<u64, Inode>,
    d: u64,
) -> Option<&mut BTreeMap<OsString, u64>> {
    inodes.get_mut(&d).map(|i| &mut i.durable_entries)
}

/// Apply one data operation.
fn apply(data: &mut Vec<u8>, op: &DataOp) {
    match op {
        DataOp::Write { offset, bytes } => {
            let start = *offset as usize;
            let end = start + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[start..end].copy_from_slice(bytes);
        }
        DataOp::Truncate(size) => data.resize(*size as usize, 0),
    }
}

/// A small deterministic generator (xorshift64*), so a seed replays a crash.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    #[test]
    fn a_strict_crash_keeps_only_what_was_synced() {
        let mut t = Tree::new();
        let f = t.create(ROOT, name("a"), Kind::File, 0o600, b"").unwrap();
        t.write(f, 0, b"hello").unwrap();
        t.fsync(f).unwrap();
        let g = t.create(ROOT, name("b"), Kind::File, 0o600, b"").unwrap();
        t.write(g, 0, b"lost").unwrap();
        t.fsync(g).unwrap();
        // Only a's name is made durable: b's entry was created after.
        t.sync_entries_for_test(ROOT, 1);
        t.write(f, 5, b" world").unwrap();
        t.crash(CrashMode::Strict, &mut Rng::new(1));
        assert_eq!(t.lookup(ROOT, name("a")).unwrap(), f);
        assert_eq!(t.get(f).unwrap().data, b"hello");
        assert_eq!(t.lookup(ROOT, name("b")), Err(libc::ENOENT));
    }

    #[test]
    fn a_rename_is_durable_on_either_side_with_the_earlier_ops_on_its_inode() {
        let mut t = Tree::new();
        let a = t.create(ROOT, name("a"), Kind::Dir, 0o700, b"").unwrap();
        let b = t.create(ROOT, name("b"), Kind::Dir, 0o700, b"").unwrap();
        t.fsync(ROOT).unwrap();
        let f = t.create(a, name("tmp"), Kind::File, 0o600, b"").unwrap();
        t.rename(a, name("tmp"), b, name("x"), true).unwrap();
        t.rename(b, name("x"), b, name("y"), false).unwrap();
        t.fsync(b).unwrap();
        t.crash(CrashMode::Strict, &mut Rng::new(2));
        assert_eq!(t.lookup(b, name("y")).unwrap(), f);
        assert_eq!(t.lookup(a, name("tmp")), Err(libc::ENOENT));
        assert_eq!(t.lookup(b, name("x")), Err(libc::ENOENT));
    }

    #[test]
    fn an_unsynced_unlink_is_undone_by_a_crash() {
        let mut t = Tree::new();
        let f = t.create(ROOT, name("a"), Kind::File, 0o600, b"").unwrap();
        t.fsync(ROOT).unwrap();
        t.remove(ROOT, name("a"), false).unwrap();
        t.crash(CrashMode::Strict, &mut Rng::new(3));
        assert_eq!(t.lookup(ROOT, name("a")).unwrap(), f);
    }

    #[test]
    fn prefix_crashes_keep_ordered_prefixes() {
        for seed in 0..50 {
            let mut t = Tree::new();
            let f = t.create(ROOT, name("a"), Kind::File, 0o600, b"").unwrap();
            t.write(f, 0, b"12").unwrap();
            t.write(f, 2, b"34").unwrap();
            t.rename(ROOT, name("a"), ROOT, name("b"), false).unwrap();
            let r = t.crash(CrashMode::Prefix, &mut Rng::new(seed));
            let data = t.get(f).unwrap().data.clone();
            assert!([&b""[..], b"12", b"1234"].contains(&&data[..]), "{data:?}");
            let names: Vec<_> = t
                .durable_entries(ROOT)
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            let expect: Vec<OsString> = match r.entry_ops_kept {
                0 => vec![],
                1 => vec!["a".into()],
                _ => vec!["b".into()],
            };
            assert_eq!(names, expect);
        }
    }

    impl Tree {
        /// Make durable only the first `n` pending operations touching `dir`.
        fn sync_entries_for_test(&mut self, dir: u64, n: usize) {
            let ops: Vec<EntryOp> = self
                .pending
                .iter()
                .filter(|o| o.touches(dir))
                .take(n)
                .cloned()
                .collect();
            for op in &ops {
                self.apply_durable(op);
            }
            let mut left = n;
            self.pending.retain(|o| {
                if left > 0 && o.touches(dir) {
                    left -= 1;
                    return false;
                }
                true
            });
        }
    }
}
