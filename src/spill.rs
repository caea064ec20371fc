//! External sort of rows by key under a memory budget: sorted runs are
//! spilled to a scratch directory and merged with bounded fan-in
//! (invariant 6). Run files are private scratch, removed with their directory.

use crate::error::{Error, IoContext, Result};
use crate::format::rowcodec;
use crate::row::Row;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

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
}

impl Default for SortBudget {
    fn default() -> Self {
        SortBudget {
            memory_bytes: 64 << 20,
            fan_in: 16,
        }
    }
}

pub struct Sorter {
    dir: PathBuf,
    budget: SortBudget,
    buf: Vec<Row>,
    buf_bytes: usize,
    runs: Vec<PathBuf>,
    next_run: usize,
}

fn approx_size(r: &Row) -> usize {
    160 + r.parent.len() + r.name.len() + r.target.as_ref().map_or(0, |t| t.len())
}

impl Sorter {
    /// A sorter spilling to `dir`; an unworkable budget is refused
    /// ([`SortBudget::check`]).
    pub fn new(dir: &Path, budget: SortBudget) -> Result<Sorter> {
        budget.check()?;
        Ok(Sorter {
            dir: dir.to_path_buf(),
            budget,
            buf: Vec::new(),
            buf_bytes: 0,
            runs: Vec::new(),
            next_run: 0,
        })
    }

    pub fn push(&mut self, row: Row) -> Result<()> {
        self.buf_bytes += approx_size(&row);
        self.buf.push(row);
        if self.buf_bytes >= self.budget.memory_bytes {
            self.spill()?;
        }
        Ok(())
    }

    fn run_path(&mut self) -> PathBuf {
        self.next_run += 1;
        self.dir.join(format!("run-{:06}", self.next_run))
    }

    fn spill(&mut self) -> Result<()> {
        let mut rows = std::mem::take(&mut self.buf);
        self.buf_bytes = 0;
        rows.sort_by(|a, b| a.key_cmp(b));
        let path = self.run_path();
        write_run(&path, rows.into_iter().map(Ok))?;
        self.runs.push(path);
        Ok(())
    }

    /// Finish: the rows in key order. Duplicate keys are an error.
    pub fn finish(mut self) -> Result<Sorted> {
        if self.runs.is_empty() {
            let mut rows = std::mem::take(&mut self.buf);
            rows.sort_by(|a, b| a.key_cmp(b));
            return Ok(Sorted {
                inner: SortedInner::Memory(rows.into_iter()),
                last: None,
            });
        }
        if !self.buf.is_empty() {
            self.spill()?;
        }
        while self.runs.len() > self.budget.fan_in {
            let group: Vec<PathBuf> = self.runs.drain(..self.budget.fan_in).collect();
            let path = self.run_path();
            write_run(&path, RunMerge::open(&group)?)?;
            for p in &group {
                std::fs::remove_file(p).ctx("unlink", p)?;
            }
            self.runs.push(path);
        }
        Ok(Sorted {
            inner: SortedInner::Runs(RunMerge::open(&self.runs)?),
            last: None,
        })
    }
}

fn write_run(path: &Path, rows: impl Iterator<Item = Result<Row>>) -> Result<()> {
    let file = crate::token::create_private(path)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut buf = Vec::new();
    for row in rows {
        buf.clear();
        rowcodec::encode(&row?, &mut buf);
        out.write_all(&(buf.len() as u32).to_le_bytes())
            .ctx("write", path)?;
        out.write_all(&buf).ctx("write", path)?;
    }
    out.flush().ctx("write", path)
}

struct RunReader {
    path: PathBuf,
    input: BufReader<File>,
}

impl RunReader {
    fn next_row(&mut self) -> Result<Option<Row>> {
        let mut len = [0u8; 4];
        match self.input.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(Error::io("read", &self.path, e)),
        }
        let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
        self.input.read_exact(&mut buf).ctx("read", &self.path)?;
        rowcodec::decode(&buf, &self.path.display().to_string()).map(Some)
    }
}

struct HeapItem {
    row: Row,
    run: usize,
}

impl PartialEq for HeapItem {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for HeapItem {}
impl PartialOrd for HeapItem {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for HeapItem {
    fn cmp(&self, o: &Self) -> Ordering {
        self.row.key_cmp(&o.row).then(self.run.cmp(&o.run))
    }
}

struct RunMerge {
    readers: Vec<RunReader>,
    heap: BinaryHeap<Reverse<HeapItem>>,
}

impl RunMerge {
    fn open(paths: &[PathBuf]) -> Result<RunMerge> {
        let mut m = RunMerge {
            readers: Vec::new(),
            heap: BinaryHeap::new(),
        };
        for (i, p) in paths.iter().enumerate() {
            let mut r = RunReader {
                path: p.clone(),
                input: BufReader::with_capacity(256 << 10, File::open(p).ctx("open", p)?),
            };
            if let Some(row) = r.next_row()? {
                m.heap.push(Reverse(HeapItem { row, run: i }));
            }
            m.readers.push(r);
        }
        Ok(m)
    }

    fn next_row(&mut self) -> Result<Option<Row>> {
        let Some(Reverse(item)) = self.heap.pop() else {
            return Ok(None);
        };
        if let Some(row) = self.readers[item.run].next_row()? {
            self.heap.push(Reverse(HeapItem { row, run: item.run }));
        }
        Ok(Some(item.row))
    }
}

impl Iterator for RunMerge {
    type Item = Result<Row>;
    fn next(&mut self) -> Option<Result<Row>> {
        self.next_row().transpose()
    }
}

enum SortedInner {
    Memory(std::vec::IntoIter<Row>),
    Runs(RunMerge),
}

/// Sorted output of a [`Sorter`]; yields an error on a duplicate key.
pub struct Sorted {
    inner: SortedInner,
    last: Option<(Vec<u8>, Vec<u8>)>,
}

impl Iterator for Sorted {
    type Item = Result<Row>;
    fn next(&mut self) -> Option<Result<Row>> {
        let row = match &mut self.inner {
            SortedInner::Memory(it) => it.next().map(Ok),
            SortedInner::Runs(m) => m.next(),
        }?;
        let Ok(row) = row else { return Some(row) };
        if self
            .last
            .as_ref()
            .is_some_and(|(p, n)| p == &row.parent && n == &row.name)
        {
            return Some(Err(Error::internal(format!(
                "journal holds two records for path=`{}`",
                crate::row::show(&row.path())
            ))));
        }
        self.last = Some((row.parent.clone(), row.name.clone()));
        Some(Ok(row))
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
            let err = Sorter::new(dir.path(), budget(memory, fan_in))
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
}
