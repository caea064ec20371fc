//! Late marks: what the deletion batches' re-marks reached (roots that
//! appeared after the condemned list), kept as sorted streams that
//! deletion, which walks its deletable objects in key order, reads forward
//! once. Bounded (invariant 6): beyond `fan_in` streams, or its memory
//! share in memory, the streams are merged into one sorted result.

use super::mark::{Kind, Obj};
use crate::error::Result;
use crate::spill::{Probe, SortBudget, Sorter, Spilled};
use std::path::{Path, PathBuf};

pub(super) struct LateMarks {
    /// Where merged streams spill, and under which budget.
    dir: PathBuf,
    budget: SortBudget,
    /// One stream per re-mark that reached anything (or one merged).
    probes: Vec<Probe<'static, Obj>>,
    /// Bytes the streams hold in memory.
    memory: usize,
}

impl LateMarks {
    pub(super) fn new(dir: &Path, budget: SortBudget) -> LateMarks {
        LateMarks {
            dir: dir.to_path_buf(),
            budget,
            probes: Vec::new(),
            memory: 0,
        }
    }

    /// Keep one re-mark's marks.
    pub(super) fn add(&mut self, marks: Spilled<Obj>) -> Result<()> {
        if marks.is_empty() {
            return Ok(());
        }
        self.memory += marks.memory_bytes();
        self.probes.push(Probe::new(marks.into_sorted()?)?);
        if self.probes.len() > self.budget.fan_in || self.memory > self.budget.memory_bytes {
            self.merge()?;
        }
        Ok(())
    }

    /// Merge what the streams have not passed yet into one.
    fn merge(&mut self) -> Result<()> {
        let mut sorter = Sorter::new(&self.dir, self.budget)?;
        for probe in self.probes.drain(..) {
            for o in probe.into_rest() {
                sorter.push(o?)?;
            }
        }
        let merged = sorter.into_spilled()?;
        self.memory = merged.memory_bytes();
        self.probes.push(Probe::new(merged.into_sorted()?)?);
        Ok(())
    }

    /// Whether a re-mark reached `(kind, digest)`; asked in ascending order.
    pub(super) fn contains(&mut self, kind: Kind, digest: &[u8; 32]) -> Result<bool> {
        for probe in &mut self.probes {
            if probe.seek(|o| o.cmp_to(kind, digest))?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(kind: Kind, n: u8) -> Obj {
        Obj {
            kind,
            digest: [n; 32],
            size: u64::from(n),
            base: false,
        }
    }

    fn remark(dir: &Path, objs: &[Obj]) -> Spilled<Obj> {
        let mut sorter = Sorter::new(dir, SortBudget::default()).unwrap();
        objs.iter().for_each(|o| sorter.push(*o).unwrap());
        sorter.into_spilled().unwrap()
    }

    #[test]
    fn late_marks_are_found_in_key_order_across_merged_re_marks() {
        let dir = tempfile::tempdir().unwrap();
        // One record of memory and a fan-in of 2: the third re-mark merges.
        let budget = SortBudget {
            memory_bytes: 48,
            fan_in: 2,
        };
        let mut late = LateMarks::new(dir.path(), budget);
        late.add(remark(
            dir.path(),
            &[obj(Kind::Pack, 5), obj(Kind::Blob, 1)],
        ))
        .unwrap();
        late.add(remark(dir.path(), &[])).unwrap();
        assert!(late.contains(Kind::Segment, &[9; 32]).is_ok_and(|c| !c));
        late.add(remark(dir.path(), &[obj(Kind::Pack, 7)])).unwrap();
        late.add(remark(
            dir.path(),
            &[obj(Kind::Chunk, 2), obj(Kind::Pack, 6)],
        ))
        .unwrap();
        let asked = [
            (Kind::Pack, 5, true),
            (Kind::Pack, 6, true),
            (Kind::Pack, 7, true),
            (Kind::Blob, 0, false),
            (Kind::Blob, 1, true),
            (Kind::Chunk, 1, false),
            (Kind::Chunk, 2, true),
        ];
        for (kind, n, found) in asked {
            assert_eq!(
                late.contains(kind, &[n; 32]).unwrap(),
                found,
                "{kind:?} {n}"
            );
        }
    }
}
