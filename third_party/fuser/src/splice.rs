//! Data replies spliced from a file (added by strata, see
//! third_party/README.md).
//!
//! A reply to `read` built from `pread` copies each byte twice: page cache to
//! the daemon's buffer, then that buffer into the request's pages. Spliced,
//! the reply's header and the file's page-cache pages go into a per-thread
//! pipe by reference and the kernel copies them once, into the request's
//! pages (`fuse_dev_splice_write`). The whole message must be in the pipe
//! before it is spliced to the device, so the pipe is sized for the largest
//! read the kernel sends (256 pages) and anything that does not fit is left
//! to the caller's ordinary reply.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::ptr;

use log::warn;

/// Pipe sizes asked for, in turn: a 1 MiB payload takes 256 page-sized
/// slots and the header one more, and pipe sizes are powers of two; without
/// CAP_SYS_RESOURCE a pipe can be at most `pipe-max-size` (1 MiB by
/// default), which still carries a 1020 KiB payload.
const PIPE_BYTES: [libc::c_int; 2] = [2 << 20, 1 << 20];

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Buffers the pipe holds: one per page spliced, one for the header.
    slots: usize,
}

thread_local! {
    static PIPE: RefCell<Option<Pipe>> = const { RefCell::new(None) };
}

impl Pipe {
    /// A non-blocking pipe (a full pipe fails the splice rather than
    /// blocking the worker), as large as `PIPE_BYTES` allows.
    fn new() -> io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and ours.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let set = |bytes: libc::c_int| {
            // SAFETY: fcntl on a descriptor this function owns.
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) }
        };
        let mut bytes = PIPE_BYTES
            .into_iter()
            .map(set)
            .find(|&b| b > 0)
            .unwrap_or(-1);
        if bytes < 0 {
            // SAFETY: as above.
            bytes = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) };
        }
        let bytes = usize::try_from(bytes).map_err(|_| io::Error::last_os_error())?;
        Ok(Pipe {
            read,
            write,
            slots: bytes / page_size::get(),
        })
    }

    /// Put `header` and then `len` bytes of `file` from `offset` in the
    /// pipe. False if the file gave fewer bytes or a call failed: the pipe
    /// then holds a partial message and must be dropped.
    fn fill(&self, header: &[u8], file: BorrowedFd<'_>, offset: u64, len: usize) -> bool {
        // SAFETY: `header` is valid for `header.len()` bytes.
        let n =
            unsafe { libc::write(self.write.as_raw_fd(), header.as_ptr().cast(), header.len()) };
        if usize::try_from(n) != Ok(header.len()) {
            return false;
        }
        let Ok(mut at) = libc::loff_t::try_from(offset) else {
            return false;
        };
        let mut left = len;
        while left > 0 {
            // SAFETY: `at` is a valid offset the kernel advances; the pipe
            // end is ours and open.
            let n = unsafe {
                libc::splice(
                    file.as_raw_fd(),
                    &mut at,
                    self.write.as_raw_fd(),
                    ptr::null_mut(),
                    left,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            match usize::try_from(n) {
                Ok(0) | Err(_) => return false,
                Ok(n) => left -= n.min(left),
            }
        }
        true
    }
}

/// Send `header` followed by `len` bytes of `file` from `offset` to the
/// FUSE device `dev` as one message. Returns false when nothing was sent
/// (no pipe, too large for it, the file ran short, or the device refused
/// the message before taking it): the caller then replies another way.
pub(crate) fn send(
    dev: BorrowedFd<'_>,
    header: &[u8],
    file: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) -> bool {
    PIPE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Pipe::new().ok();
        }
        let Some(pipe) = slot.as_ref() else {
            return false;
        };
        let page = page_size::get();
        let pages = (offset as usize % page + len).div_ceil(page);
        if pages + 1 > pipe.slots {
            return false;
        }
        if !pipe.fill(header, file, offset, len) {
            *slot = None;
            return false;
        }
        let total = header.len() + len;
        // SAFETY: both descriptors are open; null offsets for pipe and device.
        let n = unsafe {
            libc::splice(
                pipe.read.as_raw_fd(),
                ptr::null_mut(),
                dev.as_raw_fd(),
                ptr::null_mut(),
                total,
                0,
            )
        };
        if usize::try_from(n) == Ok(total) {
            return true;
        }
        // The device takes the whole message or fails: a failure may have
        // left it in the pipe, so the pipe goes. If the kernel had already
        // ended the request, the caller's second reply fails harmlessly
        // (ENOENT); if it had not, that reply answers it.
        warn!(
            "splicing a read reply failed: {}",
            io::Error::last_os_error()
        );
        *slot = None;
        false
    })
}
