//! strata-mountd: the mount daemon (FUSE filesystem, pins, control socket).
//!
//! Not built yet: the mount lands with the mount-daemon issue. Until then the
//! binary refuses to run rather than pretend to mount anything.

fn main() {
    eprintln!("strata-mountd: mounting is not available in this version; use `strata ls` / `strata cat` to read generations");
    std::process::exit(2);
}
