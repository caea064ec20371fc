//! A pinned generation as readers see it: base, optionally plus one
//! cumulative delta, composed on the fly (lookups, directory ranges, every
//! row). Opening checks manifest ↔ index record ↔ base binding.

use super::merge::Merge;
use super::representation::{Cursor, Located, Representation, RowPos};
use crate::error::{Error, Result};
use crate::format::manifest::{BaseBinding, RepKind};
use crate::pin::Pin;
use crate::row::{split, Kind, Row};
use crate::store::Store;

/// A cursor's rows tagged with the representation they come from.
struct Tagged<'a> {
    cursor: Cursor<'a>,
    delta: bool,
}

impl Iterator for Tagged<'_> {
    type Item = Result<Located>;
    fn next(&mut self) -> Option<Result<Located>> {
        let delta = self.delta;
        self.cursor
            .next_located()
            .map(|o| o.map(|(r, at)| (r, RowPos { delta, at })))
            .transpose()
    }
}

/// Children of one directory in name order, from a start name on, served
/// straight from the row ranges of base and delta (no listing is built).
pub struct DirEntries<'a> {
    merge: Merge<Tagged<'a>, Tagged<'a>, Located>,
    dir: Vec<u8>,
    after: Option<Vec<u8>>,
}

impl DirEntries<'_> {
    pub fn next_entry(&mut self) -> Result<Option<Located>> {
        while let Some((row, pos)) = self.merge.next_row()? {
            if row.parent != self.dir {
                return Ok(None);
            }
            if row.name.is_empty() || self.after.as_deref() == Some(&row.name[..]) {
                continue;
            }
            return Ok(Some((row, pos)));
        }
        Ok(None)
    }
}

impl Iterator for DirEntries<'_> {
    type Item = Result<Located>;
    fn next(&mut self) -> Option<Result<Located>> {
        self.next_entry().transpose()
    }
}

/// A pinned generation as readers see it: base, optionally plus one delta.
pub struct GenView {
    pub pin: Pin,
    pub base: Representation,
    pub delta: Option<Representation>,
}

impl GenView {
    /// Pin and open `generation` (latest when `None`) of `set`.
    pub fn open(
        store: &Store,
        set: &str,
        generation: Option<u64>,
        holder: &str,
    ) -> Result<GenView> {
        let pin = crate::pin::pin(store, set, generation, holder)?;
        let top = Representation::open(store, &pin.rep.manifest)?;
        check_binding(&pin, &top)?;
        let (base, delta) = match &top.manifest.base {
            None => (top, None),
            Some(b) => {
                let base = Representation::open(store, &b.manifest)?;
                check_base(&top, &base, b)?;
                (base, Some(top))
            }
        };
        Ok(GenView { pin, base, delta })
    }

    pub fn generation(&self) -> u64 {
        self.pin.record.generation
    }

    /// Drop the cached segments and row groups of base and delta.
    pub fn shed(&self) {
        self.base.shed();
        if let Some(d) = &self.delta {
            d.shed();
        }
    }

    /// The manifest of the representation this view reads (delta if any).
    pub fn top(&self) -> &Representation {
        self.delta.as_ref().unwrap_or(&self.base)
    }

    /// Resolve a normalized path (`""` is the root).
    pub fn lookup(&self, path: &[u8]) -> Result<Option<Row>> {
        Ok(self.locate(path)?.map(|(r, _)| r))
    }

    /// Resolve a normalized path to its row and position.
    pub fn locate(&self, path: &[u8]) -> Result<Option<Located>> {
        let (parent, name) = split(path);
        if let Some(d) = &self.delta {
            if let Some((r, at)) = d.lookup(&parent, &name)? {
                let pos = RowPos { delta: true, at };
                return Ok((r.kind != Kind::Tombstone).then_some((r, pos)));
            }
        }
        let found = self.base.lookup(&parent, &name)?;
        Ok(found.map(|(r, at)| (r, RowPos { delta: false, at })))
    }

    /// Decode the row group that follows `pos` ahead of need (see
    /// [`Representation::warm_after`]).
    pub fn warm_after(&self, pos: RowPos) {
        match (&self.delta, pos.delta) {
            (Some(d), true) => d.warm_after(pos.at),
            (None, true) => {}
            (_, false) => self.base.warm_after(pos.at),
        }
    }

    /// The row at `pos` (a position this view handed out), if any.
    pub fn row_at(&self, pos: RowPos) -> Result<Option<Row>> {
        match (&self.delta, pos.delta) {
            (Some(d), true) => d.row_at(pos.at),
            (None, true) => Ok(None),
            (_, false) => self.base.row_at(pos.at),
        }
    }

    /// Children of directory `path` in name order, starting after the child
    /// named `after` (from the first child when `None`).
    pub fn dir_entries(&self, path: &[u8], after: Option<&[u8]>) -> Result<DirEntries<'_>> {
        let start = after.unwrap_or(b"");
        let delta = match &self.delta {
            Some(d) => Tagged {
                cursor: d.cursor_at(path, start)?,
                delta: true,
            },
            None => Tagged {
                cursor: self.base.rows_empty(),
                delta: true,
            },
        };
        Ok(DirEntries {
            merge: Merge::new(
                Tagged {
                    cursor: self.base.cursor_at(path, start)?,
                    delta: false,
                },
                delta,
            ),
            dir: path.to_vec(),
            after: after.map(<[u8]>::to_vec),
        })
    }

    /// Visit the children of directory `path` in name order, after the
    /// child named `after` (from the first when `None`), until `f` returns
    /// true. The same entries as [`GenView::dir_entries`]; a view without a
    /// delta lends its cached rows instead of copying each one.
    pub fn visit_dir(
        &self,
        path: &[u8],
        after: Option<&[u8]>,
        mut f: impl FnMut(&Row, RowPos) -> bool,
    ) -> Result<()> {
        if self.delta.is_none() {
            let mut base = |row: &Row, at| f(row, RowPos { delta: false, at });
            return self.base.visit_children(path, after, &mut base);
        }
        for entry in self.dir_entries(path, after)? {
            let (row, pos) = entry?;
            if f(&row, pos) {
                break;
            }
        }
        Ok(())
    }

    /// Children of directory `path`, in name order.
    pub fn list_dir(&self, path: &[u8]) -> Result<Vec<Row>> {
        self.dir_entries(path, None)?
            .map(|r| r.map(|(row, _)| row))
            .collect()
    }

    /// Every live row of the generation in key order.
    pub fn rows(&self) -> Result<Merge<Cursor<'_>, Cursor<'_>, Row>> {
        let delta = match &self.delta {
            Some(d) => d.rows()?,
            None => self.base.rows_empty(),
        };
        Ok(Merge::new(self.base.rows()?, delta))
    }
}

/// A delta's base binding: the base manifest is a base of the same set
/// with the bound generation and identity.
fn check_base(top: &Representation, base: &Representation, b: &BaseBinding) -> Result<()> {
    if base.manifest.set != top.manifest.set {
        return Err(Error::corrupt(
            "manifest",
            &top.manifest_name,
            format!(
                "base manifest belongs to another set: base=`{}`",
                base.manifest_name
            ),
        ));
    }
    if base.manifest.identity != b.identity
        || base.manifest.generation != b.generation
        || base.kind() != RepKind::Base
    {
        return Err(Error::corrupt(
            "manifest",
            &top.manifest_name,
            "base binding does not match the base manifest",
        ));
    }
    Ok(())
}

fn check_binding(pin: &Pin, top: &Representation) -> Result<()> {
    let m = &top.manifest;
    if m.set != pin.record.set
        || m.generation != pin.record.generation
        || m.identity != pin.record.identity
        || m.representation != pin.rep.kind
    {
        return Err(Error::corrupt(
            "manifest",
            &top.manifest_name,
            "does not match its index record",
        ));
    }
    Ok(())
}
