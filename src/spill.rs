//! External sort under a memory budget: records are sorted in memory,
//! spilled to a scratch directory as sorted runs when the budget is full,
//! and merged with bounded fan-in (invariant 6). One implementation serves
//! every record kind ([`Record`]): the commit's rows (variable width,
//! duplicates refused) and the sweep's fixed-width object keys (duplicates
//! combined). Run files are private scratch, removed when their owner goes.

use crate::error::{Error, IoContext, Result};
use crate::format::rowcodec;
use crate::row::Row;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

/// Memory and fan-in limits of one sort.
#[derive(Debug, Clone, Copy)]
pub struct SortBudget {
    pub memory_bytes: usize,
    pub fan_in: usize,
}

impl SortBudget {
    /// Refuse a budget a sort cannot work with: no memory for a run, or a
    /// fan-in under 2, which could never reduce the number of runs.
    pub fn check(&self) -> Result<()> {
        let problem = match (self.memory_bytes, self.fan_in) {
            (0, _) => "the memory budget is zero",
            (_, f) if f < 2 => "the fan-in is under 2 (a merge of fewer runs never ends)",
            _ => return Ok(()),
        };
        Err(Error::SortBudget {
            problem,
            memory_bytes: self.memory_bytes,
            fan_in: self.fan_in,
        })
    }

    /// `parts` of every 8 of the memory (at least one byte), same fan-in:
    /// how one operation divides its budget among the sorts it runs at once.
    pub fn eighths(&self, parts: usize) -> SortBudget {
        SortBudget {
            memory_bytes: (self.memory_bytes / 8 * parts).max(1),
            fan_in: self.fan_in,
        }
    }
}

impl Default for SortBudget {
    fn default() -> Self {
        SortBudget {
            memory_bytes: 64 << 20,
            fan_in: 16,
        }
    }
}

/// A record an external sort can hold, spill and merge.
pub trait Record: Sized + Clone {
    /// Heap bytes the record owns besides its own size (for the budget).
    fn heap_bytes(&self) -> usize {
        0
    }
    /// The sort order; equal keys are one record ([`Record::absorb`]).
    fn key_cmp(&self, other: &Self) -> Ordering;
    /// Append the record's run encoding to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// The next record of run file `run`; `None` at its end.
    fn read(input: &mut impl Read, run: &Path) -> Result<Option<Self>>;
    /// Take in `later`, a record with an equal key, or refuse it.
    fn absorb(&mut self, later: &Self) -> Result<()>;
}

/// The next `N` bytes of a run of fixed-width records; `None` at a clean
/// end, an error for a record cut short.
pub fn read_fixed<const N: usize>(input: &mut impl Read, run: &Path) -> Result<Option<[u8; N]>> {
    let mut buf = [0u8; N];
    let mut got = 0;
    while got < N {
        match input.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                let e = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                return Err(Error::io("read", run, e));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read", run, e)),
        }
    }
    Ok(Some(buf))
}

/// Rows sort by key; a journal holding one path twice is refused.
impl Record for Row {
    fn heap_bytes(&self) -> usize {
        self.parent.len() + self.name.len() + self.target.as_ref().map_or(0, |t| t.len())
    }

    fn key_cmp(&self, other: &Self) -> Ordering {
        Row::key_cmp(self, other)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        rowcodec::encode(self, out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }

    fn read(input: &mut impl Read, run: &Path) -> Result<Option<Row>> {
        let Some(len) = read_fixed::<4>(input, run)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
        input.read_exact(&mut buf).ctx("read", run)?;
        rowcodec::decode(&buf, &run.display().to_string()).map(Some)
    }

    fn absorb(&mut self, _later: &Row) -> Result<()> {
        Err(Error::internal(format!(
            "journal holds two records for path=`{}`",
            crate::row::show(&self.path())
        )))
    }
}

/// Run files of one sort, removed when dropped (a crash leaves them in the
/// scratch directory, which its owner removes whole).
#[derive(Debug, Default)]
struct RunFiles(Vec<PathBuf>);

impl Drop for RunFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            crate::storage::remove_or_warn(p, "sort run");
        }
    }
}

/// Run names are unique in the process, so sorts may share a directory.
static NEXT_RUN: AtomicU64 = AtomicU64::new(1);

fn run_path(dir: &Path) -> PathBuf {
    let n = NEXT_RUN.fetch_add(1, AtomicOrdering::Relaxed);
    dir.join(format!("run-{}-{n:08}", std::process::id()))
}

/// Sorts records under a [`SortBudget`], spilling sorted runs to `dir`.
pub struct Sorter<R: Record> {
    dir: PathBuf,
    budget: SortBudget,
    buf: Vec<R>,
    /// Heap bytes the buffered records own.
    heap: usize,
    runs: RunFiles,
}

impl<R: Record> Sorter<R> {
    /// A sorter spilling to `dir`; an unworkable budget is refused
    /// ([`SortBudget::check`]).
    pub fn new(dir: &Path, budget: SortBudget) -> Result<Sorter<R>> {
        budget.check()?;
        Ok(Sorter {
            dir: dir.to_path_buf(),
            budget,
            buf: Vec::new(),
            heap: 0,
            runs: RunFiles::default(),
        })
    }

    pub fn push(&mut self, record: R) -> Result<()> {
        if self.buf.len() == self.buf.capacity() && !self.grow() {
            self.spill()?;
        }
        self.heap += record.heap_bytes();
        self.buf.push(record);
        if self.buf.len() * size_of::<R>() + self.heap >= self.budget.memory_bytes {
            self.spill()?;
        }
        Ok(())
    }

    /// Make room for more records within the budget (at least one always
    /// fits); false when the buffer is full and should spill.
    fn grow(&mut self) -> bool {
        let room = self.budget.memory_bytes.saturating_sub(self.heap) / size_of::<R>().max(1);
        let want = (self.buf.capacity() * 2).max(64).min(room);
        if want <= self.buf.len() && !self.buf.is_empty() {
            return false;
        }
        self.buf
            .reserve_exact(want.max(self.buf.len() + 1) - self.buf.len());
        true
    }

    /// Sort and combine the buffer and write it as a run; the buffer keeps
    /// its capacity.
    fn spill(&mut self) -> Result<()> {
        sort_combined(&mut self.buf)?;
        let path = run_path(&self.dir);
        self.runs.0.push(path.clone());
        write_run(&path, self.buf.drain(..).map(Ok))?;
        self.heap = 0;
        Ok(())
    }

    /// Finish: every record in key order, equal keys combined.
    pub fn finish(self) -> Result<Sorted<'static, R>> {
        self.into_spilled()?.into_sorted()
    }

    /// Finish into a result that can be read more than once: the records
    /// in memory if they never spilled, else at most `fan_in` runs.
    pub fn into_spilled(mut self) -> Result<Spilled<R>> {
        if self.runs.0.is_empty() {
            sort_combined(&mut self.buf)?;
            let memory = std::mem::take(&mut self.buf);
            return Ok(Spilled {
                memory,
                runs: RunFiles::default(),
            });
        }
        if !self.buf.is_empty() {
            self.spill()?;
        }
        self.buf = Vec::new();
        while self.runs.0.len() > self.budget.fan_in {
            let group = RunFiles(self.runs.0.drain(..self.budget.fan_in).collect());
            let path = run_path(&self.dir);
            self.runs.0.push(path.clone());
            write_run(&path, Combined::new(RunMerge::<R>::open(&group.0)?))?;
        }
        Ok(Spilled {
            memory: Vec::new(),
            runs: std::mem::take(&mut self.runs),
        })
    }
}

/// Sort `records` and combine equal keys ([`Record::absorb`]), in place.
fn sort_combined<R: Record>(records: &mut Vec<R>) -> Result<()> {
    records.sort_unstable_by(|a, b| a.key_cmp(b));
    let mut refused = None;
    records.dedup_by(|later, kept| {
        if later.key_cmp(kept) != Ordering::Equal {
            return false;
        }
        if let Err(e) = kept.absorb(later) {
            refused.get_or_insert(e);
        }
        true
    });
    refused.map_or(Ok(()), Err)
}

/// A finished sort: sorted, combined records in memory, or sorted runs.
pub struct Spilled<R: Record> {
    memory: Vec<R>,
    runs: RunFiles,
}

impl<R: Record> Spilled<R> {
    /// Nothing was sorted.
    pub fn empty() -> Spilled<R> {
        Spilled {
            memory: Vec::new(),
            runs: RunFiles::default(),
        }
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty() && self.runs.0.is_empty()
    }

    /// Bytes it keeps in memory.
    pub fn memory_bytes(&self) -> usize {
        self.memory.len() * size_of::<R>() + self.memory.iter().map(R::heap_bytes).sum::<usize>()
    }

    /// The records in key order, consuming the result.
    pub fn into_sorted(self) -> Result<Sorted<'static, R>> {
        let inner = match self.runs.0.is_empty() {
            true => Inner::Owned(self.memory.into_iter()),
            false => {
                let mut merge = RunMerge::open(&self.runs.0)?;
                merge.owned = self.runs;
                Inner::Runs(merge)
            }
        };
        Ok(Sorted(Combined::new(inner)))
    }

    /// The records in key order, read again from the start.
    pub fn sorted(&self) -> Result<Sorted<'_, R>> {
        let inner = match self.runs.0.is_empty() {
            true => Inner::Borrowed(self.memory.iter()),
            false => Inner::Runs(RunMerge::open(&self.runs.0)?),
        };
        Ok(Sorted(Combined::new(inner)))
    }
}

fn write_run<R: Record>(path: &Path, records: impl Iterator<Item = Result<R>>) -> Result<()> {
    let mut out = RunOut::create(path)?;
    for record in records {
        out.push(&record?)?;
    }
    out.finish()
}

/// One run file being written.
struct RunOut {
    path: PathBuf,
    out: BufWriter<File>,
    buf: Vec<u8>,
}

impl RunOut {
    fn create(path: &Path) -> Result<RunOut> {
        let file = crate::token::create_private(path)?;
        Ok(RunOut {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            buf: Vec::new(),
        })
    }

    fn push(&mut self, record: &impl Record) -> Result<()> {
        self.buf.clear();
        record.encode(&mut self.buf);
        self.out.write_all(&self.buf).ctx("write", &self.path)
    }

    fn finish(mut self) -> Result<()> {
        self.out.flush().ctx("write", &self.path)
    }
}

/// Records produced already in key order with no equal keys (such as a
/// merge's output), written straight to one run: a sorted result without
/// a sort.
pub struct SortedWriter<R: Record> {
    out: RunOut,
    files: RunFiles,
    last: Option<R>,
}

impl<R: Record> SortedWriter<R> {
    pub fn create(dir: &Path) -> Result<SortedWriter<R>> {
        let path = run_path(dir);
        let files = RunFiles(vec![path.clone()]);
        Ok(SortedWriter {
            out: RunOut::create(&path)?,
            files,
            last: None,
        })
    }

    /// Append `record`; one not after the last is refused.
    pub fn push(&mut self, record: &R) -> Result<()> {
        if self
            .last
            .as_ref()
            .is_some_and(|l| l.key_cmp(record) != Ordering::Less)
        {
            return Err(Error::internal(format!(
                "records out of order for a sorted run: run=`{}`",
                self.out.path.display()
            )));
        }
        self.out.push(record)?;
        self.last = Some(record.clone());
        Ok(())
    }

    pub fn finish(self) -> Result<Spilled<R>> {
        self.out.finish()?;
        Ok(Spilled {
            memory: Vec::new(),
            runs: self.files,
        })
    }
}

struct RunReader {
    path: PathBuf,
    input: BufReader<File>,
}

struct HeapItem<R> {
    record: R,
    run: usize,
}

impl<R: Record> PartialEq for HeapItem<R> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl<R: Record> Eq for HeapItem<R> {}
impl<R: Record> PartialOrd for HeapItem<R> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<R: Record> Ord for HeapItem<R> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.record.key_cmp(&o.record).then(self.run.cmp(&o.run))
    }
}

/// A k-way merge of sorted runs (equal keys come out next to each other,
/// earlier runs first).
struct RunMerge<R: Record> {
    readers: Vec<RunReader>,
    heap: BinaryHeap<Reverse<HeapItem<R>>>,
    /// The run files, when the merge owns them (removed when it goes).
    owned: RunFiles,
}

impl<R: Record> RunMerge<R> {
    fn open(paths: &[PathBuf]) -> Result<RunMerge<R>> {
        let mut m = RunMerge {
            readers: Vec::new(),
            heap: BinaryHeap::new(),
            owned: RunFiles::default(),
        };
        for (i, p) in paths.iter().enumerate() {
            let mut r = RunReader {
                path: p.clone(),
                input: BufReader::with_capacity(64 << 10, File::open(p).ctx("open", p)?),
            };
            if let Some(record) = R::read(&mut r.input, &r.path)? {
                m.heap.push(Reverse(HeapItem { record, run: i }));
            }
            m.readers.push(r);
        }
        Ok(m)
    }

    fn next_record(&mut self) -> Result<Option<R>> {
        let Some(Reverse(item)) = self.heap.pop() else {
            return Ok(None);
        };
        let r = &mut self.readers[item.run];
        if let Some(record) = R::read(&mut r.input, &r.path)? {
            self.heap.push(Reverse(HeapItem {
                record,
                run: item.run,
            }));
        }
        Ok(Some(item.record))
    }
}

impl<R: Record> Iterator for RunMerge<R> {
    type Item = Result<R>;
    fn next(&mut self) -> Option<Result<R>> {
        self.next_record().transpose()
    }
}

enum Inner<'a, R: Record> {
    Owned(std::vec::IntoIter<R>),
    Borrowed(std::slice::Iter<'a, R>),
    Runs(RunMerge<R>),
}

impl<R: Record> Iterator for Inner<'_, R> {
    type Item = Result<R>;
    fn next(&mut self) -> Option<Result<R>> {
        match self {
            Inner::Owned(it) => it.next().map(Ok),
            Inner::Borrowed(it) => it.next().cloned().map(Ok),
            Inner::Runs(m) => m.next(),
        }
    }
}

/// Equal keys of a sorted stream combined into one record.
struct Combined<R, I> {
    inner: I,
    pending: Option<R>,
}

impl<R: Record, I: Iterator<Item = Result<R>>> Combined<R, I> {
    fn new(inner: I) -> Self {
        Combined {
            inner,
            pending: None,
        }
    }

    fn next_record(&mut self) -> Result<Option<R>> {
        loop {
            let Some(next) = self.inner.next().transpose()? else {
                return Ok(self.pending.take());
            };
            match &mut self.pending {
                Some(p) if p.key_cmp(&next) == Ordering::Equal => p.absorb(&next)?,
                Some(_) => return Ok(self.pending.replace(next)),
                None => self.pending = Some(next),
            }
        }
    }
}

impl<R: Record, I: Iterator<Item = Result<R>>> Iterator for Combined<R, I> {
    type Item = Result<R>;
    fn next(&mut self) -> Option<Result<R>> {
        self.next_record().transpose()
    }
}

/// Sorted output of a [`Sorter`]: records in key order, equal keys combined
/// (for rows, a duplicate path is an error).
pub struct Sorted<'a, R: Record>(Combined<R, Inner<'a, R>>);

impl<R: Record> Iterator for Sorted<'_, R> {
    type Item = Result<R>;
    fn next(&mut self) -> Option<Result<R>> {
        self.0.next()
    }
}

/// Lookups in a sorted stream by keys that only ascend: each record is
/// read once, however many lookups pass it.
pub struct Probe<'a, R: Record> {
    next: Option<R>,
    rest: Sorted<'a, R>,
}

impl<'a, R: Record> Probe<'a, R> {
    pub fn new(mut rest: Sorted<'a, R>) -> Result<Probe<'a, R>> {
        let next = rest.next().transpose()?;
        Ok(Probe { next, rest })
    }

    /// The record at the key `at` places (`at(r)` says how `r` compares to
    /// the key sought), passing every record before it.
    pub fn seek(&mut self, at: impl Fn(&R) -> Ordering) -> Result<Option<&R>> {
        self.seek_passing(at, |_| {})
    }

    /// [`Probe::seek`], handing every record passed to `passed` (a record
    /// found is passed by a later seek, or by [`Probe::into_rest`]).
    pub fn seek_passing(
        &mut self,
        at: impl Fn(&R) -> Ordering,
        mut passed: impl FnMut(&R),
    ) -> Result<Option<&R>> {
        while let Some(r) = self.next.as_ref().filter(|r| at(r) == Ordering::Less) {
            passed(r);
            self.next = self.rest.next().transpose()?;
        }
        Ok(self.next.as_ref().filter(|r| at(r) == Ordering::Equal))
    }

    /// The records not yet passed, in order.
    pub fn into_rest(self) -> impl Iterator<Item = Result<R>> + 'a
    where
        R: 'a,
    {
        self.next.map(Ok).into_iter().chain(self.rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(memory_bytes: usize, fan_in: usize) -> SortBudget {
        SortBudget {
            memory_bytes,
            fan_in,
        }
    }

    #[test]
    fn a_fan_in_under_two_or_no_memory_is_refused_not_raised() {
        let dir = tempfile::tempdir().unwrap();
        for (memory, fan_in, says) in [
            (1 << 20, 0, "fan-in is under 2"),
            (1 << 20, 1, "fan-in is under 2"),
            (0, 16, "memory budget is zero"),
        ] {
            let err = Sorter::<Row>::new(dir.path(), budget(memory, fan_in))
                .err()
                .expect("an unworkable budget is refused");
            assert!(matches!(err, Error::SortBudget { .. }), "{err:?}");
            assert_eq!(err.kind(), crate::error::ErrorKind::InvalidInput);
            let msg = err.to_string();
            assert!(msg.contains(says), "{msg}");
            assert!(msg.contains(&format!("fan_in={fan_in}")), "{msg}");
        }
    }

    #[test]
    fn the_smallest_workable_budget_sorts_through_merged_runs() {
        let dir = tempfile::tempdir().unwrap();
        // One row per run, merged two at a time: several merge levels.
        let mut sorter = Sorter::new(dir.path(), budget(1, 2)).unwrap();
        let names: Vec<Vec<u8>> = (0..9u8).rev().map(|i| vec![b'a' + i]).collect();
        for n in &names {
            sorter.push(Row::tombstone(Vec::new(), n.clone())).unwrap();
        }
        let sorted: Vec<Vec<u8>> = sorter.finish().unwrap().map(|r| r.unwrap().name).collect();
        let mut expected = names;
        expected.sort();
        assert_eq!(sorted, expected);
    }

    #[test]
    fn a_path_journaled_twice_is_refused_in_memory_and_across_runs() {
        let dir = tempfile::tempdir().unwrap();
        for memory in [1, 1 << 20] {
            let mut sorter = Sorter::new(dir.path(), budget(memory, 2)).unwrap();
            for n in [b"b", b"a", b"b"] {
                sorter.push(Row::tombstone(Vec::new(), n.to_vec())).unwrap();
            }
            let err = sorter
                .finish()
                .and_then(|s| s.collect::<Result<Vec<Row>>>())
                .expect_err("a duplicate path is refused");
            assert!(err.to_string().contains("two records"), "{err}");
        }
    }

    /// A fixed-width record whose equal keys add up their counts.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Count {
        key: u32,
        n: u32,
    }

    impl Record for Count {
        fn key_cmp(&self, other: &Self) -> Ordering {
            self.key.cmp(&other.key)
        }
        fn encode(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.key.to_le_bytes());
            out.extend_from_slice(&self.n.to_le_bytes());
        }
        fn read(input: &mut impl Read, run: &Path) -> Result<Option<Self>> {
            Ok(read_fixed::<8>(input, run)?.map(|b| Count {
                key: u32::from_le_bytes(b[..4].try_into().unwrap()),
                n: u32::from_le_bytes(b[4..].try_into().unwrap()),
            }))
        }
        fn absorb(&mut self, later: &Self) -> Result<()> {
            self.n += later.n;
            Ok(())
        }
    }

    fn counted(dir: &Path, memory: usize) -> Spilled<Count> {
        let mut sorter = Sorter::new(dir, budget(memory, 3)).unwrap();
        for i in 0..1000u32 {
            sorter
                .push(Count {
                    key: (i * 7919) % 100,
                    n: 1,
                })
                .unwrap();
        }
        sorter.into_spilled().unwrap()
    }

    #[test]
    fn fixed_width_keys_combine_the_same_in_memory_and_through_many_runs() {
        let expected: Vec<Count> = (0..100).map(|key| Count { key, n: 10 }).collect();
        let dir = tempfile::tempdir().unwrap();
        for memory in [1 << 20, 64, 8] {
            let spilled = counted(dir.path(), memory);
            assert_eq!(spilled.memory_bytes() > 0, memory == 1 << 20);
            for _ in 0..2 {
                let got: Vec<Count> = spilled.sorted().unwrap().map(|r| r.unwrap()).collect();
                assert_eq!(got, expected, "memory={memory}");
            }
        }
    }

    #[test]
    fn a_probe_finds_ascending_keys_and_passes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let spilled = counted(dir.path(), 64);
        let mut probe = Probe::new(spilled.sorted().unwrap()).unwrap();
        for key in [3u32, 3, 50, 99] {
            let found = probe.seek(|c| c.key.cmp(&key)).unwrap().copied();
            assert_eq!(found, Some(Count { key, n: 10 }));
        }
        assert_eq!(probe.seek(|c| c.key.cmp(&1000)).unwrap(), None);
        assert_eq!(probe.into_rest().count(), 0);
    }

    #[test]
    fn run_files_go_with_their_result() {
        let dir = tempfile::tempdir().unwrap();
        let mut sorter = Sorter::new(dir.path(), budget(8, 2)).unwrap();
        for key in 0..10 {
            sorter.push(Count { key, n: 1 }).unwrap();
        }
        let spilled = sorter.into_spilled().unwrap();
        assert!(std::fs::read_dir(dir.path()).unwrap().count() > 0);
        drop(spilled);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
