//! The image: a real directory holding the durable state between runs.
//! Loaded whole at start; written whole (to a fresh directory renamed into
//! place) at a power cut or a clean shutdown.

use crate::model::{Kind, Tree, ROOT};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

/// Read the directory at `dir` into a tree whose every entry is durable.
pub fn load(dir: &Path) -> io::Result<Tree> {
    let mut tree = Tree::new();
    load_dir(&mut tree, dir, ROOT)?;
    Ok(tree)
}

fn load_dir(tree: &mut Tree, dir: &Path, ino: u64) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let md = fs::symlink_metadata(&path)?;
        let mode = md.permissions().mode() & 0o7777;
        let name = entry.file_name();
        let child = if md.is_dir() {
            let child = tree.load(ino, &name, Kind::Dir, mode, Vec::new());
            load_dir(tree, &path, child)?;
            child
        } else if md.file_type().is_symlink() {
            let target = fs::read_link(&path)?.into_os_string().into_vec();
            tree.load(ino, &name, Kind::Symlink, mode, target)
        } else {
            tree.load(ino, &name, Kind::File, mode, fs::read(&path)?)
        };
        tree.set_mtime(child, md.modified()?);
    }
    Ok(())
}

/// Replace the image at `dir` with the tree's durable state.
pub fn save(tree: &Tree, dir: &Path) -> io::Result<()> {
    let fresh = with_suffix(dir, ".new");
    let old = with_suffix(dir, ".old");
    let _ = fs::remove_dir_all(&fresh);
    let _ = fs::remove_dir_all(&old);
    fs::create_dir_all(&fresh)?;
    let mut written = std::collections::HashMap::new();
    save_dir(tree, &fresh, ROOT, &mut written)?;
    if dir.exists() {
        fs::rename(dir, &old)?;
    }
    fs::rename(&fresh, dir)?;
    let _ = fs::remove_dir_all(&old);
    Ok(())
}

fn with_suffix(dir: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name: OsString = dir.as_os_str().to_os_string();
    name.push(suffix);
    name.into()
}

/// Write the durable entries of `ino` under `at`. An inode reached twice
/// (a state a crash can leave) becomes a hard link; a directory reached
/// twice is written once.
fn save_dir(
    tree: &Tree,
    at: &Path,
    ino: u64,
    written: &mut std::collections::HashMap<u64, std::path::PathBuf>,
) -> io::Result<()> {
    for (name, child) in tree.durable_entries(ino) {
        let path = at.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let Ok(node) = tree.get(child) else { continue };
        if let Some(first) = written.get(&child) {
            if node.kind != Kind::Dir {
                fs::hard_link(first, &path)?;
            }
            continue;
        }
        written.insert(child, path.clone());
        match node.kind {
            Kind::Dir => {
                fs::create_dir(&path)?;
                save_dir(tree, &path, child, written)?;
            }
            Kind::Symlink => {
                let target = std::ffi::OsStr::from_bytes(tree.durable_data(child));
                symlink(target, &path)?;
                continue;
            }
            Kind::File => fs::write(&path, tree.durable_data(child))?,
            Kind::Special => continue,
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(node.mode))?;
        let f = fs::File::open(&path)?;
        f.set_modified(node.mtime)?;
    }
    Ok(())
}
