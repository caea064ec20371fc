//! Looking into a generation by path, as `strata ls` and `strata cat` do:
//! the rows a path names, through an open view.

use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::row::{normalize, show, Kind, Row};

/// The row at `path` (as given; normalized here); `NotFound` naming the
/// path when the generation does not hold it.
pub fn entry(view: &GenView, path: &[u8]) -> Result<Row> {
    normalized_entry(view, path).map(|(_, row)| row)
}

/// What listing `path` shows: a directory's entries, in key order, or the
/// one entry of anything else.
pub fn listing(view: &GenView, path: &[u8]) -> Result<Vec<Row>> {
    let (path, row) = normalized_entry(view, path)?;
    match row.kind {
        Kind::Dir => view.list_dir(&path),
        _ => Ok(vec![row]),
    }
}

/// The row of the regular file at `path`; `InvalidInput` naming the kind of
/// anything else.
pub fn file(view: &GenView, path: &[u8]) -> Result<Row> {
    let (path, row) = normalized_entry(view, path)?;
    if row.kind != Kind::File {
        return Err(Error::Invalid(format!(
            "not a file: path=`{}` kind={}",
            show(&path),
            row.kind.label()
        )));
    }
    Ok(row)
}

fn normalized_entry(view: &GenView, path: &[u8]) -> Result<(Vec<u8>, Row)> {
    let path = normalize(path)?;
    let row = view.lookup(&path)?.ok_or_else(|| Error::NotFound {
        what: "path",
        name: show(&path),
    })?;
    Ok((path, row))
}

/// Whether `path` is selected by `paths` (all when empty): one of them,
/// below one, or an ancestor of one (restore and export write ancestors
/// with their stored metadata).
pub fn selected(paths: &[Vec<u8>], path: &[u8]) -> bool {
    let under = |p: &[u8], q: &[u8]| p.is_empty() || q == p || q.starts_with(&[p, b"/"].concat());
    paths.is_empty()
        || paths
            .iter()
            .any(|p| under(p, path) || path.is_empty() || under(path, p))
}
