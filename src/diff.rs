//! Diff: added, removed and changed paths between two generations, by a
//! key-order merge of their composed rows.

use crate::compose::GenView;
use crate::error::Result;
use crate::row::Row;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Added,
    Removed,
    Changed,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiffEntry {
    pub change: Change,
    /// Lossy UTF-8 for display; `path_hex` is exact.
    pub path: String,
    pub path_hex: String,
    pub kind: String,
}

fn entry(change: Change, row: &Row) -> DiffEntry {
    let p = row.path();
    DiffEntry {
        change,
        path: crate::row::show(&p),
        path_hex: hex::encode(&p),
        kind: row.kind.label().into(),
    }
}

/// Paths that differ in content (kind, mode, size, digest, target, device
/// number, extended attributes) or that joined or left a hard-link group.
/// Which group a name is in is not compared: group keys are the source's
/// inode numbers, so the same tree committed from another copy has other
/// keys.
pub fn diff(a: &GenView, b: &GenView) -> Result<Vec<DiffEntry>> {
    let mut out = Vec::new();
    let mut ia = a.rows()?.peekable();
    let mut ib = b.rows()?.peekable();
    loop {
        let ord = match (ia.peek(), ib.peek()) {
            (None, None) => break,
            (Some(Err(_)), _) => return Err(ia.next().expect("peeked").expect_err("error")),
            (_, Some(Err(_))) => return Err(ib.next().expect("peeked").expect_err("error")),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(Ok(x)), Some(Ok(y))) => x.key_cmp(y),
        };
        match ord {
            std::cmp::Ordering::Less => {
                out.push(entry(Change::Removed, &ia.next().expect("peeked")?))
            }
            std::cmp::Ordering::Greater => {
                out.push(entry(Change::Added, &ib.next().expect("peeked")?))
            }
            std::cmp::Ordering::Equal => {
                let (x, y) = (ia.next().expect("peeked")?, ib.next().expect("peeked")?);
                let relinked = (x.meta().link != 0) != (y.meta().link != 0);
                if !x.same_content(&y) || relinked {
                    out.push(entry(Change::Changed, &y));
                }
            }
        }
    }
    Ok(out)
}
