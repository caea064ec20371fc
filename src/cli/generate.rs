//! `strata completions SHELL` and `strata manpages DIR`: shell completions
//! and man pages generated from the CLI definition itself, so they never
//! drift from the flags the binary accepts.

use super::args::Cli;
use clap::CommandFactory;
use std::path::Path;
use strata::error::{Error, Result};

/// Completions for `shell` on stdout.
pub(crate) fn completions(shell: clap_complete::Shell) -> Result<i32> {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "strata", &mut std::io::stdout());
    Ok(0)
}

/// `strata.1` and one `strata-<command>.1` per command, written into `dir`.
pub(crate) fn manpages(dir: &Path) -> Result<i32> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("mkdir", dir, e))?;
    let cmd = Cli::command();
    write_page(dir, "strata", cmd.clone())?;
    let mut written = 1;
    for sub in cmd.get_subcommands() {
        let name = format!("strata-{}", sub.get_name());
        let sub = sub
            .clone()
            .bin_name(format!("strata {}", sub.get_name()))
            .display_name(name.clone());
        write_page(dir, &name, sub)?;
        written += 1;
    }
    println!("wrote {written} man pages to {}", dir.display());
    Ok(0)
}

fn write_page(dir: &Path, name: &str, cmd: clap::Command) -> Result<()> {
    let path = dir.join(format!("{name}.1"));
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .title(name.to_uppercase())
        .render(&mut out)
        .map_err(|e| Error::io("render", &path, e))?;
    std::fs::write(&path, out).map_err(|e| Error::io("write", &path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag and argument of every command says what it is, so
    /// `--help`, the man pages and the completions all describe it.
    #[test]
    fn every_argument_is_documented() {
        let cmd = Cli::command();
        let mut missing = Vec::new();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let builtin = ["help", "version"].contains(&arg.get_id().as_str());
                if arg.get_help().is_none() && !builtin {
                    missing.push(format!("{} {}", sub.get_name(), arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "undocumented: {missing:?}");
    }
}
