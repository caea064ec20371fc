//! `strata export`: a generation to stdout as a tar stream.

use super::args::ExportArgs;
use super::restore::{normalized, open_view};
use std::io::{IsTerminal, Write};
use strata::error::{Error, Result};
use strata::store::Store;

pub(crate) fn export(store: &Store, a: ExportArgs) -> Result<i32> {
    if std::io::stdout().is_terminal() {
        return Err(Error::Invalid(
            "export writes a tar stream to stdout: redirect it to a file or a pipe \
             (e.g. `strata export --set S | tar -x`)"
                .to_string(),
        ));
    }
    let view = open_view(store, &a.set, a.gen, a.tag.as_deref(), "export")?;
    let paths = normalized(&a.path)?;
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout);
    let summary = strata::export::export(store, &view, &paths, &mut out)?;
    out.flush()
        .map_err(|e| Error::io("write", "the tar stream", e))?;
    for s in &summary.sockets_skipped {
        eprintln!("strata: warning: {s}: a socket has no tar form; not exported");
    }
    Ok(0)
}
