//! FUSE over io_uring (Linux 6.14 and later, with the `fuse` module's
//! `enable_uring` parameter set).
//!
//! The kernel keeps one request queue per possible CPU and hands a request
//! to the queue of the CPU its caller runs on. Each queue here is served by
//! threads pinned to that CPU, each with its own ring and one registered
//! entry (a header buffer and a payload buffer). A caller that blocks on its
//! request therefore wakes a server on its own CPU, and the answer wakes
//! the caller there: no round trip needs a second, possibly halted, CPU.
//!
//! An entry's cycle: `REGISTER` hands the buffers to the kernel; the
//! command completes when a request has been written into them; the thread
//! rebuilds the request as `/dev/fuse` would have delivered it, dispatches
//! it, waits for its reply to be written into the same buffers, and sends
//! `COMMIT_AND_FETCH`, which delivers the reply and waits for the next
//! request. The entries end when the connection does (`ENOTCONN`).
//!
//! Forgets and interrupts still come through `/dev/fuse`, as does anything
//! sent before every queue has an entry, so the session keeps a reader there.

use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;
use std::sync::mpsc;
use std::thread;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::info;
use log::warn;
use nix::unistd::Uid;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll;
use crate::ll::Operation;
use crate::passthrough::BackingId;
use crate::reply::Reply;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: `in_out` (128), `op_in` (128),
/// `ring_ent_in_out` (32).
const HEADERS_LEN: usize = 288;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const IN_HEADER_LEN: usize = 40;
const OUT_HEADER_LEN: usize = 16;

/// One registered entry's buffers, shared by its thread and the reply
/// sender of the request it holds. The kernel writes a request into them
/// while the entry waits; the sender writes the reply while the thread
/// waits; the lock and `replied` order the two.
#[derive(Debug)]
pub(crate) struct Entry {
    buffers: Mutex<Buffers>,
    replied: Condvar,
}

#[derive(Debug)]
struct Buffers {
    headers: Box<[u8]>,
    payload: Box<[u8]>,
    replied: bool,
}

impl Entry {
    fn new(payload_len: usize) -> Self {
        Entry {
            buffers: Mutex::new(Buffers {
                headers: vec![0; HEADERS_LEN].into_boxed_slice(),
                payload: vec![0; payload_len].into_boxed_slice(),
                replied: false,
            }),
            replied: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffers> {
        self.buffers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The iovecs `REGISTER` hands the kernel: stable for the entry's life,
    /// as the boxes never move.
    fn iovecs(&self) -> [libc::iovec; 2] {
        let mut b = self.lock();
        [
            libc::iovec {
                iov_base: b.headers.as_mut_ptr().cast(),
                iov_len: b.headers.len(),
            },
            libc::iovec {
                iov_base: b.payload.as_mut_ptr().cast(),
                iov_len: b.payload.len(),
            },
        ]
    }

    /// The request the kernel wrote, laid out as a `/dev/fuse` read, with
    /// its commit id (its unique id) and whether the sizes it claims fit
    /// the entry (`out` is left empty when they do not).
    fn take_request(&self, out: &mut Vec<u8>) -> (u64, bool) {
        let mut b = self.lock();
        b.replied = false;
        out.clear();
        let commit_id = u64_at(&b.headers, ENT_IN_OUT + 8);
        let len = u32_at(&b.headers, 0) as usize;
        let payload_len = u32_at(&b.headers, ENT_IN_OUT + 16) as usize;
        let Some(op_len) = len.checked_sub(IN_HEADER_LEN + payload_len) else {
            return (commit_id, false);
        };
        if op_len > OP_IN || payload_len > b.payload.len() {
            return (commit_id, false);
        }
        out.extend_from_slice(&b.headers[..IN_HEADER_LEN]);
        out.extend_from_slice(&b.headers[OP_IN..OP_IN + op_len]);
        out.extend_from_slice(&b.payload[..payload_len]);
        (commit_id, true)
    }

    /// Write a reply: the out header into `in_out`, the rest into the
    /// payload. A reply too large for the payload, or without an out
    /// header, becomes `EIO` (the in header's unique id, at the same place,
    /// stays).
    fn reply(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let mut b = self.lock();
        let b = &mut *b;
        let Some((header, rest)) = data
            .split_first()
            .filter(|(h, _)| h.len() == OUT_HEADER_LEN)
        else {
            set_error(&mut b.headers, libc::EIO);
            set_payload_len(&mut b.headers, 0);
            b.replied = true;
            self.replied.notify_all();
            return Err(io::Error::other("reply without a FUSE out header"));
        };
        let total: usize = rest.iter().map(|s| s.len()).sum();
        b.headers[..OUT_HEADER_LEN].copy_from_slice(header);
        let result = if total <= b.payload.len() {
            let mut at = 0;
            for s in rest {
                b.payload[at..at + s.len()].copy_from_slice(s);
                at += s.len();
            }
            Ok(())
        } else {
            set_error(&mut b.headers, libc::EIO);
            Err(io::Error::other(format!(
                "a {total}-byte reply exceeds the ring's {}-byte payload",
                b.payload.len()
            )))
        };
        let sent = if result.is_ok() { total } else { 0 };
        set_payload_len(&mut b.headers, sent);
        b.replied = true;
        self.replied.notify_all();
        result
    }

    /// Reply with `out_header` followed by `len` bytes of `file` from
    /// `offset`, read straight into the payload; false (nothing written)
    /// when the read fails or does not fit.
    fn reply_from_file(
        &self,
        out_header: &[u8],
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> bool {
        let mut b = self.lock();
        let b = &mut *b;
        if out_header.len() != OUT_HEADER_LEN || len > b.payload.len() {
            return false;
        }
        let Ok(n) = nix::sys::uio::pread(file, &mut b.payload[..len], offset as libc::off_t) else {
            return false;
        };
        b.headers[..OUT_HEADER_LEN].copy_from_slice(out_header);
        let total = (OUT_HEADER_LEN + n) as u32;
        b.headers[..4].copy_from_slice(&total.to_ne_bytes());
        set_payload_len(&mut b.headers, n);
        b.replied = true;
        self.replied.notify_all();
        true
    }

    /// Reply to a request that takes none (a forget sent down the ring).
    fn reply_nothing(&self, unique: u64) {
        let mut b = self.lock();
        b.headers[..OUT_HEADER_LEN].fill(0);
        b.headers[..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
        b.headers[8..16].copy_from_slice(&unique.to_ne_bytes());
        set_payload_len(&mut b.headers, 0);
        b.replied = true;
    }

    /// Wait until the request the entry holds has been replied to (a
    /// reply may be sent from another thread, later).
    fn wait_replied(&self) {
        let mut b = self.lock();
        while !b.replied {
            b = self
                .replied
                .wait(b)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(v)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(v)
}

fn set_error(headers: &mut [u8], errno: i32) {
    headers[..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
    headers[4..8].copy_from_slice(&(-errno).to_ne_bytes());
}

fn set_payload_len(headers: &mut [u8], len: usize) {
    headers[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(len as u32).to_ne_bytes());
}

/// Sends replies into a ring entry; backing files still go through the
/// device.
#[derive(Debug, Clone)]
pub(crate) struct UringSender {
    entry: Arc<Entry>,
    device: ChannelSender,
}

impl UringSender {
    pub(crate) fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        self.entry.reply(data)
    }

    pub(crate) fn splice(
        &self,
        header: &[u8],
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> bool {
        self.entry.reply_from_file(header, file, offset, len)
    }

    pub(crate) fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<BackingId> {
        self.device.open_backing(fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { self.device.wrap_backing(id) }
    }
}

/// Where the ring's queues are: one per possible CPU, as the kernel counts
/// them (`/sys/devices/system/cpu/possible`, such as `0-3` or `0,2-5`).
fn possible_cpus() -> io::Result<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(text.trim())
        .ok_or_else(|| io::Error::other(format!("unreadable CPU list {:?}", text.trim())))
}

fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse().ok()?),
            None => {
                let c: usize = part.parse().ok()?;
                (c, c)
            }
        };
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

/// The payload each entry must offer: what the kernel computes from the
/// INIT reply (`fuse_uring_create`).
pub(crate) fn payload_len(max_write: u32, max_pages: u16) -> usize {
    let page = page_size::get();
    (max_write as usize)
        .max(usize::from(max_pages) * page)
        .max(8192)
}

/// One thread serving one entry of the queue `qid` (the CPU it is pinned to).
struct Server<FS: Filesystem> {
    qid: u16,
    payload_len: usize,
    event_loop: SessionEventLoop<FS>,
}

impl<FS: Filesystem> Server<FS> {
    /// Pin to the queue's CPU, register one entry, report the outcome on
    /// `registered`, then serve until the connection ends.
    fn run(self, registered: mpsc::Sender<io::Result<()>>) -> io::Result<()> {
        pin_to_cpu(usize::from(self.qid));
        let entry = Arc::new(Entry::new(self.payload_len));
        let setup = Ring::new(&self.event_loop.ch, self.qid).and_then(|mut ring| {
            let iov = entry.iovecs();
            ring.register(&iov)?;
            Ok(ring)
        });
        let mut ring = match setup {
            Ok(ring) => {
                let _ = registered.send(Ok(()));
                ring
            }
            Err(e) => {
                // Reported; the session serves through `/dev/fuse` instead.
                let _ = registered.send(Err(e));
                return Ok(());
            }
        };
        let sender = UringSender {
            entry: entry.clone(),
            device: self.event_loop.ch.sender(),
        };
        let mut request = Vec::with_capacity(IN_HEADER_LEN + OP_IN + 4096);
        loop {
            match ring.wait() {
                Ok(()) => {}
                Err(e) if ended(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
            let (commit_id, fits) = entry.take_request(&mut request);
            if fits {
                self.serve(&entry, &sender, &request, commit_id);
            } else {
                warn!(
                    "FUSE ring queue {}: request {commit_id} does not fit its entry",
                    self.qid
                );
                <ReplyRaw as Reply>::new(
                    ll::RequestId(commit_id),
                    ReplySender::Uring(sender.clone()),
                )
                .error(ll::Errno::EIO);
            }
            entry.wait_replied();
            match ring.commit_and_fetch(commit_id) {
                Ok(()) => {}
                Err(e) if ended(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    fn serve(&self, entry: &Entry, sender: &UringSender, request: &[u8], unique: u64) {
        let reply_sender = ReplySender::Uring(sender.clone());
        let Some(req) = RequestWithSender::new(reply_sender.clone(), request) else {
            <ReplyRaw as Reply>::new(ll::RequestId(unique), reply_sender).error(ll::Errno::EIO);
            return;
        };
        match req.request.operation() {
            Ok(Operation::Forget(_) | Operation::BatchForget(_)) => {
                req.dispatch(&self.event_loop);
                entry.reply_nothing(unique);
            }
            _ => req.dispatch(&self.event_loop),
        }
    }
}

/// The connection ended: the kernel tore the entries down.
fn ended(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN | libc::ECANCELED | libc::ENODEV)
    )
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity only read and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "could not pin a FUSE queue server to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// One thread's ring: 128-byte entries, as the FUSE commands need.
struct Ring {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    device: i32,
    qid: u16,
}

impl Ring {
    fn new(ch: &Channel, qid: u16) -> io::Result<Self> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(2)
            .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2))?;
        Ok(Ring {
            ring,
            device: ch.as_fd().as_raw_fd(),
            qid,
        })
    }

    fn command(&self, op: u32, commit_id: u64) -> opcode::UringCmd80 {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        opcode::UringCmd80::new(types::Fd(self.device), op).cmd(cmd)
    }

    /// Hand the entry's buffers to the kernel. The command stays pending
    /// until a request arrives, so a failure shows as an immediate
    /// completion.
    fn register(&mut self, iov: &[libc::iovec; 2]) -> io::Result<()> {
        let sqe = self
            .command(CMD_REGISTER, 0)
            .addr(Some(iov.as_ptr() as u64))
            .build();
        self.push(with_len(sqe, 2))?;
        self.ring.submit()?;
        match self.ring.completion().next() {
            Some(cqe) if cqe.result() < 0 => Err(io::Error::from_raw_os_error(-cqe.result())),
            Some(_) => Err(io::Error::other("FUSE ring registration completed early")),
            None => Ok(()),
        }
    }

    fn commit_and_fetch(&mut self, commit_id: u64) -> io::Result<()> {
        let sqe = self.command(CMD_COMMIT_AND_FETCH, commit_id).build();
        self.push(sqe)?;
        self.ring.submit()?;
        Ok(())
    }

    /// Wait for the pending command to complete: a request is in the
    /// entry, or the connection ended.
    fn wait(&mut self) -> io::Result<()> {
        loop {
            if let Some(cqe) = self.ring.completion().next() {
                return match cqe.result() {
                    r if r < 0 => Err(io::Error::from_raw_os_error(-r)),
                    _ => Ok(()),
                };
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: the command's buffers (the iovec array, read during
        // submission, and the entry's boxes) outlive the command.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("FUSE ring submission queue full"))
    }
}

/// Set the SQE's `len` (the iovec count `REGISTER` requires), which the
/// builder does not expose.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `repr(C)`: an `io_uring_sqe` (whose `len` is
    // the u32 at byte 24) followed by the command's further 64 bytes.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above; every byte pattern is a valid SQE for the kernel
    // to check.
    unsafe { std::mem::transmute(raw) }
}

/// Start the queue servers: `n_threads` in all, spread over the kernel's
/// queues (at least one each). Returns whether every queue registered; if
/// one did not, the reason is logged and requests keep coming through
/// `/dev/fuse` (the registered entries then wait, unused, for the end).
pub(crate) fn start<FS: Filesystem + 'static>(
    ch: &Channel,
    filesystem: &Arc<FilesystemHolder<FS>>,
    (allowed, session_owner): (SessionACL, Uid),
    payload_len: usize,
    n_threads: usize,
    threads: &mut Vec<JoinHandle<io::Result<()>>>,
) -> io::Result<bool> {
    let queues = possible_cpus()?.len();
    let qids =
        u16::try_from(queues).map_err(|_| io::Error::other("too many CPUs for FUSE queues"))?;
    let per_queue = (n_threads / queues).max(1);
    let (registered, outcomes) = mpsc::channel();
    for qid in 0..qids {
        for k in 0..per_queue {
            let name = format!("fuser-q{qid}-{k}");
            let server = Server {
                qid,
                payload_len,
                event_loop: SessionEventLoop {
                    thread_name: name.clone(),
                    filesystem: filesystem.clone(),
                    ch: ch.clone(),
                    allowed,
                    session_owner,
                },
            };
            let registered = registered.clone();
            threads.push(
                thread::Builder::new()
                    .name(name)
                    .spawn(move || server.run(registered))?,
            );
        }
    }
    drop(registered);
    let mut served = true;
    for _ in 0..usize::from(qids) * per_queue {
        let outcome = outcomes
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("a FUSE ring server ended unheard")));
        if let Err(e) = outcome {
            if served {
                error!("FUSE over io_uring not in use: {e}; serving through /dev/fuse");
            }
            served = false;
        }
    }
    if served {
        info!("FUSE over io_uring: {queues} queues, {per_queue} entries each");
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use std::io::Write;

    /// An entry holding what the kernel writes for a request: the in
    /// header (`len` counts all of it), the op header, the payload.
    fn entry_with(op: &[u8], payload: &[u8], commit_id: u64) -> Entry {
        let entry = Entry::new(64);
        {
            let mut b = entry.lock();
            let len = (IN_HEADER_LEN + op.len() + payload.len()) as u32;
            b.headers[..4].copy_from_slice(&len.to_ne_bytes());
            b.headers[4..IN_HEADER_LEN].fill(7);
            b.headers[OP_IN..OP_IN + op.len()].copy_from_slice(op);
            b.headers[ENT_IN_OUT + 8..ENT_IN_OUT + 16].copy_from_slice(&commit_id.to_ne_bytes());
            set_payload_len(&mut b.headers, payload.len());
            b.payload[..payload.len()].copy_from_slice(payload);
        }
        entry
    }

    #[test]
    fn a_request_is_laid_out_as_a_dev_fuse_read_would_deliver_it() {
        let entry = entry_with(&[1; 16], b"name\0", 42);
        let mut out = Vec::new();
        assert_eq!(entry.take_request(&mut out), (42, true));
        assert_eq!(out.len(), IN_HEADER_LEN + 16 + 5);
        assert_eq!(&out[IN_HEADER_LEN..IN_HEADER_LEN + 16], &[1; 16]);
        assert_eq!(&out[IN_HEADER_LEN + 16..], b"name\0");
    }

    #[test]
    fn a_request_whose_sizes_do_not_fit_its_entry_is_refused() {
        let entry = entry_with(&[1; 16], b"x", 1);
        entry.lock().headers[..4].copy_from_slice(&10u32.to_ne_bytes());
        assert!(
            !entry.take_request(&mut Vec::new()).1,
            "len below the header"
        );
        let entry = entry_with(&[1; 16], b"x", 1);
        set_payload_len(&mut entry.lock().headers, 65);
        assert!(
            !entry.take_request(&mut Vec::new()).1,
            "payload past the buffer"
        );
        let entry = entry_with(&[1; 120], &[0; 20], 1);
        entry.lock().headers[..4].copy_from_slice(&300u32.to_ne_bytes());
        assert!(
            !entry.take_request(&mut Vec::new()).1,
            "op header past its area"
        );
    }

    #[test]
    fn a_reply_fills_the_out_header_and_payload_and_a_malformed_one_is_eio() {
        let entry = entry_with(&[], &[], 9);
        let header = [16u8; OUT_HEADER_LEN];
        entry
            .reply(&[
                IoSlice::new(&header),
                IoSlice::new(b"ab"),
                IoSlice::new(b"cd"),
            ])
            .unwrap();
        entry.wait_replied();
        let b = entry.lock();
        assert_eq!(&b.headers[..OUT_HEADER_LEN], &header);
        assert_eq!(u32_at(&b.headers, ENT_IN_OUT + 16), 4);
        assert_eq!(&b.payload[..4], b"abcd");
        drop(b);
        let big = [0u8; 65];
        assert!(
            entry
                .reply(&[IoSlice::new(&header), IoSlice::new(&big)])
                .is_err()
        );
        let b = entry.lock();
        assert_eq!(
            i32::from_ne_bytes(b.headers[4..8].try_into().unwrap()),
            -libc::EIO
        );
        assert_eq!(u32_at(&b.headers, ENT_IN_OUT + 16), 0);
        drop(b);
        let entry = entry_with(&[], &[], 9);
        entry.lock().headers[8..16].copy_from_slice(&77u64.to_ne_bytes());
        assert!(entry.reply(&[IoSlice::new(b"no header")]).is_err());
        entry.wait_replied();
        let b = entry.lock();
        assert_eq!(u32_at(&b.headers, 4), (-libc::EIO) as u32);
        assert_eq!(u64_at(&b.headers, 8), 77, "the request's unique id stays");
    }

    #[test]
    fn a_reply_from_a_file_is_read_into_the_payload_with_its_length() {
        let path = std::env::temp_dir().join(format!("fuser-uring-{}", std::process::id()));
        let mut file = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write_all(b"0123456789").unwrap();
        let entry = entry_with(&[], &[], 3);
        let mut header = [0u8; OUT_HEADER_LEN];
        header[..4].copy_from_slice(&(16u32 + 8).to_ne_bytes());
        assert!(
            entry.reply_from_file(&header, file.as_fd(), 6, 8),
            "a short read is sent"
        );
        let b = entry.lock();
        assert_eq!(
            u32_at(&b.headers, 0),
            16 + 4,
            "the header counts what was read"
        );
        assert_eq!(u32_at(&b.headers, ENT_IN_OUT + 16), 4);
        assert_eq!(&b.payload[..4], b"6789");
        drop(b);
        assert!(
            !entry.reply_from_file(&header, file.as_fd(), 0, 65),
            "past the payload"
        );
    }

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0,2-4"), Some(vec![0, 2, 3, 4]));
        assert_eq!(parse_cpu_list("x"), None);
    }
}
