//! `strata cat`: a file of a generation to stdout, verified.

use super::args::CatArgs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use strata::compose::GenView;
use strata::error::{Error, Result};
use strata::store::Store;

pub(crate) fn cat(store: &Store, a: CatArgs) -> Result<i32> {
    let view = GenView::open(store, &a.set, a.gen, "cat")?;
    let row = strata::browse::file(&view, a.path.as_bytes())?;
    let mut out = std::io::stdout().lock();
    strata::blob::copy_to(store, &row, &mut out)?;
    out.flush().map_err(|e| Error::io("write", "stdout", e))?;
    Ok(0)
}
