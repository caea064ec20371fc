//! Key-order composition of a base stream with a delta stream.

use super::representation::Located;
use crate::error::Result;
use crate::row::{Kind, Row};
use std::cmp::Ordering;

/// What a merged stream carries: a row, possibly with more.
pub trait HasRow {
    fn row(&self) -> &Row;
}

impl HasRow for Row {
    fn row(&self) -> &Row {
        self
    }
}

impl HasRow for Located {
    fn row(&self) -> &Row {
        &self.0
    }
}

/// Key-order composition of a base stream with a delta stream: a delta row
/// replaces the base row with the same key; a tombstone removes it.
pub struct Merge<B, D, T>
where
    B: Iterator<Item = Result<T>>,
    D: Iterator<Item = Result<T>>,
{
    base: std::iter::Peekable<B>,
    delta: std::iter::Peekable<D>,
}

impl<B, D, T> Merge<B, D, T>
where
    B: Iterator<Item = Result<T>>,
    D: Iterator<Item = Result<T>>,
    T: HasRow,
{
    pub fn new(base: B, delta: D) -> Self {
        Merge {
            base: base.peekable(),
            delta: delta.peekable(),
        }
    }

    pub fn next_row(&mut self) -> Result<Option<T>> {
        loop {
            let order = match (self.base.peek(), self.delta.peek()) {
                (None, None) => return Ok(None),
                (Some(Err(_)), _) => return self.base.next().transpose(),
                (_, Some(Err(_))) => return self.delta.next().transpose(),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(Ok(b)), Some(Ok(d))) => b.row().key_cmp(d.row()),
            };
            if order == Ordering::Less {
                return self.base.next().transpose();
            }
            if order == Ordering::Equal {
                self.base.next();
            }
            let Some(d) = self.delta.next().transpose()? else {
                return Ok(None);
            };
            if d.row().kind != Kind::Tombstone {
                return Ok(Some(d));
            }
        }
    }
}

impl<B, D, T> Iterator for Merge<B, D, T>
where
    B: Iterator<Item = Result<T>>,
    D: Iterator<Item = Result<T>>,
    T: HasRow,
{
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        self.next_row().transpose()
    }
}
