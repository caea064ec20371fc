//! The store on an S3-compatible server (SeaweedFS, started by
//! scripts/test.sh): conditional writes, racing committers, fencing of a
//! paused writer, a write past its fence, corruption caught through the
//! verified cache, injected network faults, and two mount daemons with a
//! materializer and a sweeper on one store. Each test uses its own prefix; "hosts" are processes with
//! their own local (cache) directories.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::storage::{fence, CasOutcome, PutOutcome, S3Storage, Storage, TryLease};

fn storage_at(dir: &Path, local: &Path) -> S3Storage {
    let mut o = s3_options(dir);
    o.local_dir = local.to_path_buf();
    S3Storage::open(&o).unwrap()
}

#[test]
fn conditional_writes_have_exactly_one_winner() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    let storage = Arc::new(storage_at(&st, &t.path().join("local")));
    let created: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                let st = storage.clone();
                s.spawn(move || {
                    st.put_if_absent("race/created", format!("writer {i}").as_bytes())
                        .unwrap()
                        == PutOutcome::Created
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(created.iter().filter(|c| **c).count(), 1, "{created:?}");
    let winner = created.iter().position(|c| *c).unwrap();
    let body = storage.get("race/created", 1 << 10).unwrap();
    assert_eq!(body, format!("writer {winner}").as_bytes());

    assert_eq!(
        storage.cas("race/pointer", None, b"v0 nonce-0").unwrap(),
        CasOutcome::Swapped
    );
    let swapped: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                let st = storage.clone();
                s.spawn(move || {
                    let new = format!("v1 nonce-{i}");
                    st.cas("race/pointer", Some(b"v0 nonce-0"), new.as_bytes())
                        .unwrap()
                        == CasOutcome::Swapped
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(swapped.iter().filter(|c| **c).count(), 1, "{swapped:?}");
    // A stale expected body never matches a later version (pointer bodies
    // carry a nonce, so a version's bytes never come back).
    let current = storage.get("race/pointer", 1 << 10).unwrap();
    assert!(matches!(
        storage.cas("race/pointer", Some(b"v0 nonce-0"), b"v2").unwrap(),
        CasOutcome::Mismatch { current: Some(c) } if c == current
    ));
}

#[test]
fn eight_concurrent_committers_land_as_distinct_generations_or_conflict() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    new_s3_store(&st);
    let dirs: Vec<PathBuf> = (0..8)
        .map(|i| {
            let d = t.path().join(format!("src{i}"));
            write(&d, "who", format!("committer {i}").as_bytes());
            write(&d, &format!("only-{i}"), &noise(i, 5000));
            d
        })
        .collect();
    settle();
    let children: Vec<Child> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let local = t.path().join(format!("host{i}"));
            let mut c = Command::new(bin());
            c.args(s3_flags(&st, &local))
                .args(["commit", "--set", "race"])
                .arg(d)
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            if i % 2 == 0 {
                c.arg("--wait");
            }
            c.spawn().unwrap()
        })
        .collect();
    let codes: Vec<i32> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().status.code().unwrap_or(-1))
        .collect();
    assert!(
        codes.iter().all(|c| *c == 0 || *c == 4),
        "each commit lands or reports a conflict: {codes:?}"
    );
    let landed: Vec<usize> = (0..8).filter(|i| codes[*i] == 0).collect();
    assert!(
        (0..8).step_by(2).all(|i| codes[i] == 0),
        "every --wait commit lands: {codes:?}"
    );
    let store = new_s3_store(&st);
    let mut seen = Vec::new();
    for g in 1..=landed.len() as u64 {
        let snap = snapshot_gen(&store, "race", Some(g));
        let who = String::from_utf8(snap[b"who".as_slice()].data.clone()).unwrap();
        let i: usize = who.trim_start_matches("committer ").parse().unwrap();
        assert_eq!(
            snap,
            snapshot_dir(&dirs[i]),
            "generation {g} is committer {i}'s tree"
        );
        seen.push(i);
    }
    seen.sort();
    assert_eq!(seen, landed, "no generation lost or duplicated");
    let log = ok(&strata_s3(
        &st,
        &t.path().join("h"),
        &["log", "--set", "race", "--json"],
    ));
    assert_eq!(log.matches("\"generation\"").count(), landed.len(), "{log}");
}

#[test]
fn a_paused_committer_is_fenced_and_its_staging_reclaimed() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write(&a, "f", b"from the paused writer");
    write(&b, "f", b"from the newer writer");
    settle();
    let store = new_s3_store(&st);
    let paused = Command::new(bin())
        .args(s3_flags(&st, &t.path().join("host-a")))
        .args(["commit", "--set", "s"])
        .arg(&a)
        .env("STRATA_FAILPOINTS", "journal-sealed=stop")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_stopped(&paused);
    std::thread::sleep(S3_LEASE_TTL * 2);
    // Another host takes the writer lease over once it saw it unrenewed
    // for a whole ttl, and publishes.
    ok(&strata_s3(
        &st,
        &t.path().join("host-b"),
        &["commit", "--set", "s", b.to_str().unwrap()],
    ));
    let sweep = ok(&strata_s3(
        &st,
        &t.path().join("host-c"),
        &["sweep", "--grace", "0s", "--json"],
    ));
    let report: serde_json::Value = serde_json::from_str(&sweep).unwrap();
    let reclaimed = report["reclaimed"].as_array().unwrap();
    assert!(
        reclaimed.iter().any(|l| l["kind"] == "staging"),
        "the paused attempt's staging is reclaimed: {sweep}"
    );
    nix_kill(paused.id(), libc::SIGCONT);
    let out = paused.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "fenced: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lease lost"), "{err}");
    assert_eq!(snapshot_gen(&store, "s", None), snapshot_dir(&b));
    let latest = strata::index::GenIndex::new(&store, "s")
        .latest()
        .unwrap()
        .unwrap();
    assert_eq!(latest.generation, 1, "the fenced writer published nothing");
    ok(&strata_s3(
        &st,
        &t.path().join("host-d"),
        &["verify", "--all"],
    ));
}

#[test]
fn corruption_on_the_server_is_caught_through_a_fresh_cache() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    // Over one 8 MiB ranged part: hashed as its parts arrive.
    write(&src, "big", &noise(7, 9 << 20));
    write(&src, "small", b"small file");
    settle();
    let store = new_s3_store(&st);
    commit_dir(&store, "c", &src);
    let storage = storage_at(&st, &t.path().join("raw"));
    let chunks = stored_keys(&storage, "chunks");
    assert!(chunks.len() >= 3, "{chunks:?}");
    let mut bytes = storage.get(&chunks[0], 1 << 30).unwrap();
    bytes[12345] ^= 0x40;
    overwrite(&st, &chunks[0], bytes);
    let name = chunks[0].rsplit('/').next().unwrap();
    let fresh = t.path().join("fresh-host");
    let out = strata_s3(&st, &fresh, &["cat", "--set", "c", "big"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = strata_s3(&st, &fresh, &["verify", "--all"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(name)
            || String::from_utf8_lossy(&out.stderr).contains(name)
    );
    // Through a mount, whose open fetches it in parallel parts.
    let (host, point) = (t.path().join("mount-host"), t.path().join("m"));
    let _mount = s3_mount(&st, &host, &point);
    let read = std::fs::read(point.join("c/latest/big"));
    assert_eq!(read.unwrap_err().raw_os_error(), Some(libc::EIO));
    for h in [&fresh, &host] {
        assert!(
            !h.join("cache/objects").join(&chunks[0]).exists(),
            "a copy that does not hash to its name is never cached"
        );
    }
}

#[test]
fn a_damaged_object_on_the_server_is_replaced_by_the_next_commit_of_its_content() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    // One pack of one frame and one chunked file: the same objects in any set.
    write(&src, "small", b"a small file, packed alone");
    write(&src, "large", &noise(5, 3 << 20));
    let store = new_s3_store(&st);
    commit_dir(&store, "a", &src);
    let raw = storage_at(&st, &t.path().join("raw"));
    let tops = ["packs", "segments", "chunks", "chunklists"];
    for top in tops {
        let key = &stored_keys(&raw, top)[0];
        let mut bytes = raw.get(key, 1 << 30).unwrap();
        let half = bytes.len() / 2;
        match top {
            // Short, as an upload cut by a crash could leave a copy elsewhere.
            "chunks" => bytes.truncate(half),
            _ => bytes[half] ^= 0x40,
        }
        overwrite(&st, key, bytes);
    }
    let second = commit_dir(&store, "b", &src);
    assert_eq!(second.repaired_objects, tops.len() as u64);
    ok(&strata_s3(
        &st,
        &t.path().join("verifier"),
        &["verify", "--all"],
    ));
    let reader = strata::Store::open(Arc::new(storage_at(&st, &t.path().join("reader")))).unwrap();
    for set in ["a", "b"] {
        assert_eq!(
            snapshot_gen(&reader, set, None),
            snapshot_dir(&src),
            "{set}"
        );
    }
}

/// Every key under `top` (two-hex-digit fan-out directories), sorted.
fn stored_keys(storage: &S3Storage, top: &str) -> Vec<String> {
    let mut keys: Vec<String> = storage
        .list(top)
        .unwrap()
        .into_iter()
        .flat_map(|aa| {
            let names = storage.list(&format!("{top}/{aa}")).unwrap();
            names.into_iter().map(move |n| format!("{top}/{aa}/{n}"))
        })
        .collect();
    keys.sort();
    keys
}

/// The keys of the chunks `data` (a file without holes) is cut into.
fn chunk_keys(data: &[u8]) -> Vec<String> {
    let mut keys = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let len = strata::chunking::cut(&data[at..]);
        let digest = blake3::hash(&data[at..at + len]).to_hex();
        keys.push(strata::store::keys::chunk(&digest));
        at += len;
    }
    keys
}

/// Replace an object's bytes behind strata's back (what bit rot or a bad
/// actor on the server would do).
/// Every cached copy under a host's cache directory, as (key, path).
fn cached_copies(host: &Path) -> Vec<(String, PathBuf)> {
    let root = host.join("cache/objects");
    walk_files(&root)
        .into_iter()
        .map(|p| (p.strip_prefix(&root).unwrap().display().to_string(), p))
        .filter(|(k, _)| !k.contains(".tmp-"))
        .collect()
}

#[test]
fn a_cached_copy_changed_on_local_disk_is_dropped_and_fetched_again() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "blob", &noise(8, 2 << 20));
    write(&src, "small", b"a small file in a pack");
    settle();
    let store = new_s3_store(&st);
    commit_dir(&store, "c", &src);
    let host = t.path().join("host");
    let cat = |f: &str| {
        let out = strata_s3(&st, &host, &["cat", "--set", "c", f]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    for f in ["blob", "small"] {
        cat(f);
    }
    // Flip a byte in every cached copy: the local disk went bad.
    let copies = cached_copies(&host);
    for prefix in [
        "chunks/",
        "chunklists/",
        "packs/",
        "segments/",
        "manifests/",
    ] {
        assert!(
            copies.iter().any(|(k, _)| k.starts_with(prefix)),
            "{copies:?}"
        );
    }
    let flip = || {
        for (_, path) in cached_copies(&host) {
            let mut bytes = std::fs::read(&path).unwrap();
            let i = bytes.len() / 2;
            bytes[i] ^= 0x20;
            std::fs::write(&path, bytes).unwrap();
        }
    };
    flip();
    for f in ["blob", "small"] {
        assert!(cat(f) == std::fs::read(src.join(f)).unwrap(), "{f}");
    }
    // And through a mount started on a cache gone bad.
    flip();
    let point = t.path().join("m");
    let _mount = s3_mount(&st, &host, &point);
    let cmp = Command::new("diff")
        .arg("-r")
        .arg(&src)
        .arg(point.join("c/latest"))
        .output()
        .unwrap();
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stdout)
    );
    for (key, path) in cached_copies(&host) {
        let hash = |b: &[u8]| {
            if key.starts_with("chunks/") {
                hex::encode(strata::format::chunk::content_digest(&key, b).unwrap())
            } else if key.starts_with("chunklists/") {
                blake3::hash(b).to_hex().to_string()
            } else {
                use sha2::Digest;
                hex::encode(sha2::Sha256::digest(b))
            }
        };
        let name = key.rsplit('/').next().unwrap().split('.').next().unwrap();
        assert_eq!(hash(&std::fs::read(&path).unwrap()), name, "{key} healed");
    }
}

fn overwrite(dir: &Path, key: &str, bytes: Vec<u8>) {
    use object_store::{aws::AmazonS3Builder, ObjectStoreExt, PutPayload};
    let (bucket, prefix) = strata::storage::Endpoint::parse(&s3_url(dir)).unwrap();
    let s3 = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_endpoint(std::env::var("STRATA_TEST_S3_ENDPOINT").unwrap())
        .with_allow_http(true)
        .with_region("us-east-1")
        .build()
        .unwrap();
    let path = object_store::path::Path::from(format!("{prefix}/{key}"));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(s3.put(&path, PutPayload::from(bytes)))
        .unwrap();
}

/// What the fault proxy does with the next connections.
#[derive(Default)]
struct Faults {
    /// Close this many connections after part of their request arrived.
    cut: AtomicU32,
    /// Answer this many connections with 503 Slow Down.
    unavailable: AtomicU32,
    /// Answer this many connections with 403 (not retried).
    denied: AtomicU32,
    /// While nonzero, refuse connections: a server that is down.
    down: AtomicU32,
    /// While nonzero, hold every chunk a client sends for [`STALL`], and
    /// drop it if the client gave up meanwhile: a stalled network.
    stall: AtomicU32,
    /// Lose the answer to this many conditional PUTs (`If-None-Match` or
    /// `If-Match`): the server applies the write, the client never hears
    /// back and its connection closes.
    lost_reply: AtomicU32,
    /// Close the connection of this many multipart part uploads
    /// (`partNumber=`) before they reach the server.
    cut_parts: AtomicU32,
}

const STALL: Duration = Duration::from_secs(3);

/// A TCP proxy in front of the test server that injects faults.
fn fault_proxy(faults: Arc<Faults>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = std::env::var("STRATA_TEST_S3_ENDPOINT")
        .unwrap()
        .trim_start_matches("http://")
        .to_string();
    std::thread::spawn(move || {
        let mut listener = Some(listener);
        loop {
            // A server that is down refuses connections: the port is closed.
            if faults.down.load(Ordering::SeqCst) > 0 {
                listener = None;
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let l = listener.get_or_insert_with(|| bind_again(addr));
            match l.accept() {
                Ok((conn, _)) => {
                    conn.set_nonblocking(false).unwrap();
                    let (f, up) = (faults.clone(), upstream.clone());
                    std::thread::spawn(move || serve(conn, &up, &f));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    format!("http://{addr}")
}

fn bind_again(addr: std::net::SocketAddr) -> TcpListener {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(l) = TcpListener::bind(addr) {
            l.set_nonblocking(true).unwrap();
            return l;
        }
        assert!(Instant::now() < deadline, "the proxy's port stayed taken");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn take(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

fn serve(mut client: TcpStream, upstream: &str, f: &Arc<Faults>) {
    let reply = |client: &mut TcpStream, status: &str| {
        let mut buf = [0u8; 4096];
        let _ = client.read(&mut buf);
        let body = format!("<Error><Code>{status}</Code></Error>");
        let _ = write!(
            client,
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    if take(&f.cut) {
        let mut buf = [0u8; 512];
        let _ = client.read(&mut buf);
        return;
    }
    if take(&f.unavailable) {
        return reply(&mut client, "503 Slow Down");
    }
    if take(&f.denied) {
        return reply(&mut client, "403 AccessDenied");
    }
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (f2, doomed) = (f.clone(), Arc::new(AtomicBool::new(false)));
    let d2 = doomed.clone();
    let up = std::thread::spawn(move || pump(c2, s2, &f2, &d2));
    let (mut s, mut c) = (server, client);
    let mut buf = vec![0u8; 64 << 10];
    // Server to client, until a doomed request's answer comes back: that
    // is dropped, and the client's connection closed.
    while let Ok(n @ 1..) = s.read(&mut buf) {
        if doomed.load(Ordering::SeqCst) || c.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = c.shutdown(std::net::Shutdown::Both);
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}

/// Whether `chunk` starts a request whose head matches `pick`.
fn request_head(chunk: &[u8], pick: impl Fn(&str) -> bool) -> bool {
    let text = String::from_utf8_lossy(&chunk[..chunk.len().min(4096)]).to_ascii_lowercase();
    ["put ", "post ", "get ", "head ", "delete "]
        .iter()
        .any(|m| text.starts_with(m))
        && pick(text.split("\r\n\r\n").next().unwrap_or(""))
}

/// Client to server, through a network that may stall.
/// A conditional PUT may be marked `doomed` (its answer is to be lost)
/// before it is forwarded; a part upload may be cut instead.
fn pump(mut from: TcpStream, mut to: TcpStream, f: &Faults, doomed: &AtomicBool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let conditional = |h: &str| {
            h.starts_with("put ")
                && (h.contains("\r\nif-none-match:") || h.contains("\r\nif-match:"))
        };
        if request_head(&buf[..n], conditional) && take(&f.lost_reply) {
            doomed.store(true, Ordering::SeqCst);
        }
        let part = |h: &str| h.starts_with("put ") && h.contains("partnumber=");
        if request_head(&buf[..n], part) && take(&f.cut_parts) {
            let _ = from.shutdown(std::net::Shutdown::Both);
            break;
        }
        if f.stall.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(STALL);
            if gave_up(&from) {
                break;
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Whether the peer closed its side (nothing more to read, end of stream).
fn gave_up(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let closed = match s.peek(&mut [0u8; 1]) {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    closed
}

fn via(proxy: &str, dir: &Path, local: &Path, args: &[&str]) -> Output {
    let mut flags = s3_flags(dir, local);
    let i = flags.iter().position(|f| f == "--s3-endpoint").unwrap();
    flags[i + 1] = proxy.to_string();
    Command::new(bin()).args(flags).args(args).output().unwrap()
}

#[test]
fn injected_network_faults_are_retried_or_fail_cleanly() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    let src = t.path().join("src");
    for i in 0..40 {
        write(&src, &format!("f{i}"), &noise(i, 3000));
    }
    write(&src, "big", &noise(99, 20 << 20));
    settle();
    let store = new_s3_store(&st);
    let faults = Arc::new(Faults::default());
    let proxy = fault_proxy(faults.clone());
    let local = t.path().join("host");

    // Cut uploads and 503s: retried, the commit lands.
    faults.cut.store(3, Ordering::SeqCst);
    faults.unavailable.store(3, Ordering::SeqCst);
    ok(&via(
        &proxy,
        &st,
        &local,
        &["commit", "--set", "n", src.to_str().unwrap()],
    ));
    assert_eq!(faults.cut.load(Ordering::SeqCst), 0);
    assert_eq!(faults.unavailable.load(Ordering::SeqCst), 0);
    assert_eq!(snapshot_gen(&store, "n", None), snapshot_dir(&src));

    // The server goes down mid-commit and comes back: retried, it lands.
    write(&src, "f1", b"changed while the server was down");
    settle();
    faults.down.store(1, Ordering::SeqCst);
    let child = Command::new(bin())
        .args({
            let mut f = s3_flags(&st, &local);
            let i = f.iter().position(|x| x == "--s3-endpoint").unwrap();
            f[i + 1] = proxy.clone();
            f
        })
        .args(["commit", "--set", "n"])
        .arg(&src)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    faults.down.store(0, Ordering::SeqCst);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(snapshot_gen(&store, "n", None), snapshot_dir(&src));

    // A refusal that is not retried fails the commit cleanly: nothing is
    // published, the store stays consistent, and the next commit works.
    write(&src, "f2", b"refused");
    settle();
    faults.denied.store(1000, Ordering::SeqCst);
    let out = via(
        &proxy,
        &st,
        &local,
        &["commit", "--set", "n", src.to_str().unwrap()],
    );
    faults.denied.store(0, Ordering::SeqCst);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("remote store request failed"));
    let latest = strata::index::GenIndex::new(&store, "n")
        .latest()
        .unwrap()
        .unwrap();
    assert_eq!(latest.generation, 2);
    ok(&strata_s3(&st, &t.path().join("v"), &["verify", "--all"]));
    ok(&via(
        &proxy,
        &st,
        &local,
        &["commit", "--set", "n", src.to_str().unwrap()],
    ));
    assert_eq!(snapshot_gen(&store, "n", None), snapshot_dir(&src));
}

#[test]
fn conditional_writes_whose_answer_was_lost_are_not_applied_twice() {
    let t = tempfile::tempdir().unwrap();
    let (st, src, local) = (
        t.path().join("store"),
        t.path().join("src"),
        t.path().join("host"),
    );
    for i in 0..20 {
        write(
            &src,
            &format!("d{}/f{i}", i % 3),
            &noise(i, 2000 + i as usize),
        );
    }
    settle();
    let store = new_s3_store(&st);
    let faults = Arc::new(Faults::default());
    let proxy = fault_proxy(faults.clone());
    let src_arg = src.to_str().unwrap();

    // Every create-exclusive or compare-and-swap PUT of these commands may
    // be applied by the server with its answer lost: each is retried, the
    // retry finds the object already there, and the writer recognises its
    // own bytes. Each command succeeds once, and does what it did once.
    for (round, lost) in [(1u64, 3u32), (2, 6)] {
        write(&src, &format!("round{round}"), &noise(100 + round, 5000));
        settle();
        faults.lost_reply.store(lost, Ordering::SeqCst);
        ok(&via(
            &proxy,
            &st,
            &local,
            &["commit", "--set", "n", src_arg],
        ));
        assert_eq!(faults.lost_reply.load(Ordering::SeqCst), 0, "round {round}");
        let latest = strata::index::GenIndex::new(&store, "n")
            .latest()
            .unwrap()
            .unwrap();
        assert_eq!(latest.generation, round, "one generation per commit");
        assert_eq!(snapshot_gen(&store, "n", None), snapshot_dir(&src));
    }
    faults.lost_reply.store(2, Ordering::SeqCst);
    ok(&via(
        &proxy,
        &st,
        &local,
        &["tag", "--set", "n", "--gen", "1", "first"],
    ));
    faults.lost_reply.store(2, Ordering::SeqCst);
    ok(&via(
        &proxy,
        &st,
        &local,
        &["retain", "--set", "n", "--keep-last", "1"],
    ));
    faults.lost_reply.store(0, Ordering::SeqCst);
    let tags = ok(&strata_s3(&st, &local, &["tags", "--set", "n"]));
    assert!(tags.contains("first"), "{tags}");
    ok(&strata_s3(&st, &local, &["verify", "--all"]));
    ok(&strata_s3(&st, &local, &["commit", "--set", "n", src_arg]));
}

/// A request signed for the test server by curl: (status, body).
fn s3_curl(method: &str, path_and_query: &str, body: Option<&[u8]>) -> (u16, String) {
    let (id, secret) = (
        std::env::var("AWS_ACCESS_KEY_ID").unwrap(),
        std::env::var("AWS_SECRET_ACCESS_KEY").unwrap(),
    );
    let url = format!(
        "{}/{}/{path_and_query}",
        std::env::var("STRATA_TEST_S3_ENDPOINT").unwrap(),
        std::env::var("STRATA_TEST_S3_BUCKET").unwrap()
    );
    let mut c = Command::new("curl");
    c.args(["-s", "-w", "\n%{http_code}", "-X", method])
        .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
        .arg(format!("{id}:{secret}"))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]);
    if body.is_some() {
        c.args(["--data-binary", "@-"]);
    }
    let mut child = c
        .arg(url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(body.unwrap_or_default()).unwrap();
    drop(stdin);
    let out = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    let (text, code) = out.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), text.to_string())
}

/// Incomplete multipart uploads the server holds under `prefix`, by key.
fn uploads_under(prefix: &str) -> Vec<String> {
    let (code, xml) = s3_curl("GET", &format!("?prefix={prefix}%2F&uploads="), None);
    assert_eq!(code, 200, "{xml}");
    xml.split("<Key>")
        .skip(1)
        .map(|k| k.split("</Key>").next().unwrap().to_string())
        .collect()
}

/// A backend (no store on it) reached through a fault proxy, under `dir`:
/// the backend, the proxy's faults and the backend's key prefix.
fn proxied_storage(dir: &Path) -> (S3Storage, Arc<Faults>, String) {
    let faults = Arc::new(Faults::default());
    let mut o = s3_options(&dir.join("raw"));
    o.endpoint.url = Some(fault_proxy(faults.clone()));
    o.local_dir = dir.join("host");
    let prefix = o.endpoint.prefix.clone();
    (S3Storage::open(&o).unwrap(), faults, prefix)
}

#[test]
fn a_failed_multipart_upload_is_aborted_and_an_abandoned_one_is_swept() {
    let t = tempfile::tempdir().unwrap();
    let (storage, faults, raw) = proxied_storage(t.path());
    let staged = t.path().join("staged");
    let big = noise(7, (72 << 20) + 12345);

    // Parts that never arrive fail the upload, which is aborted: no
    // object, no parts left on the server.
    std::fs::write(&staged, &big).unwrap();
    faults.cut_parts.store(1000, Ordering::SeqCst);
    let e = storage.put_file_if_absent("test/big", &staged).unwrap_err();
    faults.cut_parts.store(0, Ordering::SeqCst);
    assert!(e.to_string().contains("test/big"), "{e}");
    assert_eq!(storage.size("test/big").unwrap(), None);
    assert_eq!(uploads_under(&raw), Vec::<String>::new());
    // Without faults the same upload completes, whole, with none left.
    std::fs::write(&staged, &big).unwrap();
    let put = storage.put_file_if_absent("test/big", &staged).unwrap();
    assert_eq!(put, PutOutcome::Created);
    assert_eq!(storage.size("test/big").unwrap(), Some(big.len() as u64));
    let tail = storage
        .get_range_stored("test/big", (72 << 20) - 7, 12352)
        .unwrap();
    assert_eq!(tail, &big[(72 << 20) - 7..]);
    assert_eq!(uploads_under(&raw), Vec::<String>::new());

    // A writer that died mid-upload left an upload with a part: sweeps
    // leave it while it is younger than the age, then abort it.
    let (st, src) = (t.path().join("store"), t.path().join("src"));
    write(&src, "a", b"a");
    settle();
    new_s3_store(&st);
    let prefix = s3_options(&st).endpoint.prefix;
    let key = format!("{prefix}/packs/0f/abandoned.pack");
    let (code, xml) = s3_curl("POST", &format!("{key}?uploads="), Some(b""));
    assert_eq!(code, 200, "{xml}");
    let id = xml
        .split("<UploadId>")
        .nth(1)
        .unwrap()
        .split("</UploadId>")
        .next()
        .unwrap();
    let part = format!("{key}?partNumber=1&uploadId={id}");
    assert_eq!(s3_curl("PUT", &part, Some(&noise(3, 1 << 20))).0, 200);
    assert_eq!(uploads_under(&prefix), vec![key.clone()]);
    let host = t.path().join("host2");
    let sweep = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["sweep", "--json", "--grace", "0s"];
        all.extend(args);
        serde_json::from_str(&ok(&strata_s3(&st, &host, &all))).unwrap()
    };
    let young = sweep(&["--in-process"]);
    assert_eq!(young["uploads_aborted"], serde_json::json!([]));
    assert_eq!(uploads_under(&prefix), vec![key.clone()]);
    let named = sweep(&["--dry-run", "--upload-age", "0s"]);
    assert_eq!(
        named["uploads_aborted"],
        serde_json::json!(["packs/0f/abandoned.pack"])
    );
    assert_eq!(uploads_under(&prefix), vec![key.clone()]);
    let aborted = sweep(&["--upload-age", "0s"]);
    assert_eq!(
        aborted["uploads_aborted"],
        serde_json::json!(["packs/0f/abandoned.pack"])
    );
    assert_eq!(uploads_under(&prefix), Vec::<String>::new());
    ok(&strata_s3(
        &st,
        &host,
        &["commit", "--set", "s", src.to_str().unwrap()],
    ));
    ok(&strata_s3(&st, &host, &["verify", "--all"]));
}

#[test]
fn a_write_past_its_lease_fence_is_abandoned_not_sent_late() {
    let t = tempfile::tempdir().unwrap();
    let (storage, faults, _) = proxied_storage(t.path());
    let TryLease::Acquired(lease) = storage.lease("locks/fence-test", "test", false).unwrap()
    else {
        panic!("a fresh lease is free");
    };

    // Under the fence, a write held up by the network past the lease's
    // deadline is given up with `Fenced`, and never reaches the server.
    faults.stall.store(1, Ordering::SeqCst);
    let fenced = {
        let _fence = fence::enter(&[&*lease]).unwrap();
        storage.put_if_absent("test/late", b"late").unwrap_err()
    };
    assert!(
        matches!(fenced, strata::Error::Fenced { ref key } if key == "locks/fence-test"),
        "{fenced:?}"
    );
    std::thread::sleep(STALL * 2);
    faults.stall.store(0, Ordering::SeqCst);
    assert_eq!(storage.size("test/late").unwrap(), None);

    // Without a fence the same stalled write waits and lands.
    faults.stall.store(1, Ordering::SeqCst);
    let landed = storage.put_if_absent("test/late", b"late").unwrap();
    faults.stall.store(0, Ordering::SeqCst);
    assert_eq!(landed, PutOutcome::Created);
    assert_eq!(storage.get("test/late", 100).unwrap(), b"late");
}

#[test]
fn lease_objects_that_do_not_parse_are_reported_invalid_and_kept() {
    let t = tempfile::tempdir().unwrap();
    let (st, src) = (t.path().join("store"), t.path().join("src"));
    write(&src, "a", b"a");
    settle();
    new_s3_store(&st);
    let host = t.path().join("host");
    ok(&strata_s3(
        &st,
        &host,
        &["commit", "--set", "s", src.to_str().unwrap()],
    ));
    let pin = "pins/s/00000000000000000001-junk.pin";
    let owner = "staging/0123456789abcdef.owner";
    overwrite(&st, pin, b"{ not a lease".to_vec());
    overwrite(&st, owner, b"\x00\x01".to_vec());
    let leases: Vec<serde_json::Value> =
        serde_json::from_str(&ok(&strata_s3(&st, &host, &["leases", "--json"]))).unwrap();
    for key in [pin, owner] {
        let l = leases.iter().find(|l| l["key"] == key).expect(key);
        assert_eq!(l["verdict"], "invalid", "{l}");
    }
    let report = ok(&strata_s3(
        &st,
        &host,
        &["sweep", "--grace", "0s", "--json"],
    ));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["invalid"].as_array().unwrap().len(), 2, "{report}");
    let remote = storage_at(&st, &t.path().join("checker"));
    for key in [pin, owner] {
        assert!(remote.size(key).unwrap().is_some(), "{key} kept");
    }
}

/// The pid of the daemon serving `point`.
fn daemon_pid(point: &Path) -> u32 {
    let want = point.to_str().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"strata-mountd"))
                && args.contains(&want.as_bytes())
        })
        .expect("the daemon runs")
}

fn pin_keys(st: &Path, host: &Path) -> Vec<String> {
    let pins: Vec<serde_json::Value> =
        serde_json::from_str(&ok(&strata_s3(st, host, &["pins", "--json"]))).unwrap();
    pins.iter()
        .map(|p| p["key"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_daemon_stalled_past_its_pin_leases_pins_again() {
    let t = tempfile::tempdir().unwrap();
    let (st, src) = (t.path().join("store"), t.path().join("src"));
    write(&src, "a", b"kept through a stall");
    settle();
    new_s3_store(&st);
    let other = t.path().join("other-host");
    ok(&strata_s3(
        &st,
        &other,
        &["commit", "--set", "s", src.to_str().unwrap()],
    ));
    let point = t.path().join("m");
    let _mount = s3_mount(&st, &t.path().join("mount-host"), &point);
    let wait_for_pins = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let keys = pin_keys(&st, &other);
            if !keys.is_empty() {
                return keys;
            }
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let before = wait_for_pins("the daemon never pinned latest");

    // The daemon stalls; a sweep elsewhere watches its pins stop renewing
    // and reclaims them.
    let pid = daemon_pid(&point);
    nix_kill(pid, libc::SIGSTOP);
    let report = ok(&strata_s3(
        &st,
        &other,
        &["sweep", "--grace", "0s", "--json"],
    ));
    nix_kill(pid, libc::SIGCONT);
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let reclaimed: Vec<&str> = report["reclaimed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["key"].as_str())
        .collect();
    assert!(
        before.iter().all(|k| reclaimed.contains(&k.as_str())),
        "{report}"
    );

    // Resumed, it notices and pins what it serves again.
    wait_for_pins("the daemon never pinned again");
    let cmp = Command::new("diff")
        .arg("-r")
        .arg(&src)
        .arg(point.join("s/latest"))
        .output()
        .unwrap();
    assert!(
        cmp.status.success(),
        "{}",
        String::from_utf8_lossy(&cmp.stdout)
    );
}

fn gets(st: &Path, host: &Path) -> u64 {
    let status: serde_json::Value =
        serde_json::from_str(&ok(&strata_s3(st, host, &["status", "--json"]))).unwrap();
    status["daemons"][0]["status"]["remote_requests"]["get"]
        .as_u64()
        .unwrap()
}

#[test]
fn concurrent_first_reads_of_a_chunked_file_share_its_fetches() {
    let t = tempfile::tempdir().unwrap();
    let (st, src) = (t.path().join("store"), t.path().join("src"));
    let data = noise(21, 24 << 20);
    write(&src, "big", &data);
    settle();
    new_s3_store(&st);
    ok(&strata_s3(
        &st,
        &t.path().join("c"),
        &["commit", "--set", "s", src.to_str().unwrap()],
    ));
    let (host, point) = (t.path().join("mount-host"), t.path().join("m"));
    let _mount = s3_mount(&st, &host, &point);
    // The generation's index, manifest and segments are read first.
    assert_eq!(
        std::fs::metadata(point.join("s/latest/big")).unwrap().len(),
        data.len() as u64
    );
    let before = gets(&st, &host);
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let path = point.join("s/latest/big");
            std::thread::spawn(move || std::fs::read(path).unwrap())
        })
        .collect();
    for r in readers {
        assert!(r.join().unwrap() == data);
    }
    let fetched = gets(&st, &host) - before;
    // The daemon's object cache and its in-flight chunks share what one
    // reader fetched with the others: fewer GETs than every reader fetching
    // every chunk (measured: about 2.5 per chunk for 4 readers and the
    // assembling thread; chunks fetched at the same moment are not joined).
    let chunks = chunk_keys(&data).len() as u64;
    assert!(fetched < 4 * chunks, "{fetched} GETs for {chunks} chunks");
}

#[test]
fn two_mounts_a_materializer_and_a_sweeper_keep_what_readers_hold() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    let src = t.path().join("src");
    let gens: Vec<PathBuf> = (1..=4).map(|g| t.path().join(format!("want{g}"))).collect();
    let store = new_s3_store(&st);
    let committer = t.path().join("committer");
    let mut mounts = Vec::new();
    for (g, want) in gens.iter().enumerate() {
        for i in 0..30 {
            write(
                &src,
                &format!("d{}/f{i}", i % 3),
                format!("gen {g} file {i}").as_bytes(),
            );
        }
        write(&src, "big", &noise(g as u64, 2 << 20));
        settle();
        ok(&strata_s3(
            &st,
            &committer,
            &["commit", "--set", "s", src.to_str().unwrap()],
        ));
        copy_tree(&src, want);
        if g == 0 {
            mounts.push(s3_mount(
                &st,
                &t.path().join("host-a"),
                &t.path().join("ma"),
            ));
            mounts.push(s3_mount(
                &st,
                &t.path().join("host-b"),
                &t.path().join("mb"),
            ));
        }
    }
    let (ma, mb) = (t.path().join("ma/s"), t.path().join("mb/s"));
    // Readers: an open file in generation 1 on one host, a cwd in
    // generation 2 on the other.
    let mut held = std::fs::File::open(ma.join("gens/1/big")).unwrap();
    let mut cwd = Command::new("sleep")
        .arg("600")
        .current_dir(mb.join("gens/2/d1"))
        .spawn()
        .unwrap();
    ok(&strata_s3(
        &st,
        &t.path().join("materializer"),
        &["materialize", "--set", "s", "--wait"],
    ));
    ok(&strata_s3(
        &st,
        &committer,
        &["retain", "--set", "s", "--keep-last", "1"],
    ));
    let sweeper = t.path().join("sweeper");
    ok(&strata_s3(&st, &sweeper, &["sweep", "--grace", "0s"]));
    std::thread::sleep(S3_LEASE_TTL * (strata::sweep::REMOTE_GRACE_TTLS + 1));
    let report = ok(&strata_s3(
        &st,
        &sweeper,
        &["sweep", "--grace", "0s", "--json"],
    ));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert!(report["deleted"]["count"].as_u64().unwrap() > 0, "{report}");

    let mut data = Vec::new();
    held.read_to_end(&mut data).unwrap();
    assert_eq!(
        data,
        std::fs::read(gens[0].join("big")).unwrap(),
        "open file in generation 1"
    );
    let d = Command::new("diff")
        .arg("-r")
        .arg(gens[1].join("d1"))
        .arg(format!("/proc/{}/cwd", cwd.id()))
        .output()
        .unwrap();
    assert!(
        d.status.success(),
        "cwd in generation 2: {}",
        String::from_utf8_lossy(&d.stdout)
    );
    for m in [&ma, &mb] {
        let d = Command::new("diff")
            .arg("-r")
            .arg(&gens[3])
            .arg(m.join("latest"))
            .output()
            .unwrap();
        assert!(
            d.status.success(),
            "latest through {}: {}",
            m.display(),
            String::from_utf8_lossy(&d.stdout)
        );
    }
    assert_eq!(snapshot_gen(&store, "s", Some(4)), snapshot_dir(&gens[3]));
    // What the readers hold is still on the server, not only in their caches.
    let remote = storage_at(&st, &t.path().join("checker"));
    for g in [0, 1] {
        for key in chunk_keys(&std::fs::read(gens[g].join("big")).unwrap()) {
            assert!(
                remote.size(&key).unwrap().is_some(),
                "generation {} chunk {key} kept",
                g + 1
            );
        }
    }
    ok(&strata_s3(
        &st,
        &t.path().join("verifier"),
        &["verify", "--all"],
    ));
    drop(held);
    cwd.kill().unwrap();
    cwd.wait().unwrap();
    drop(mounts);
}

/// The store written before chunking (tests/fixtures), uploaded under the
/// prefix of `st`: its objects and index records (no hint, no leases).
fn upload_old_store(st: &Path, local: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-before-chunks");
    let storage = storage_at(st, local);
    for file in files_under(&root) {
        let key = file
            .strip_prefix(&root)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        if key.ends_with("LATEST") || key.ends_with(".lock") || key.ends_with(".lease") {
            continue;
        }
        storage
            .put_if_absent(&key, &std::fs::read(&file).unwrap())
            .unwrap();
    }
}

#[test]
fn a_standalone_blob_too_large_for_the_cache_is_served_by_ranged_reads() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    std::fs::create_dir_all(&st).unwrap();
    upload_old_store(&st, &t.path().join("uploader"));
    let host = t.path().join("host");
    // Read on another host: the mount's host must not have it cached.
    let reader = t.path().join("reader");
    let want = strata_s3(&st, &reader, &["cat", "--set", "big", "big.bin"]).stdout;
    assert_eq!(want.len(), 3 << 20);
    let point = t.path().join("m");
    std::fs::create_dir_all(&point).unwrap();
    // A 4 MiB cache keeps objects up to 1 MiB: the blob is read remotely.
    let mut flags = s3_flags(&st, &host);
    flags.extend(["--cache-size".into(), "4M".into()]);
    ok(&Command::new(bin())
        .args(&flags)
        .args(["mount", point.to_str().unwrap()])
        .output()
        .unwrap());
    // Opened (and verified), then changed on the server: the changed piece
    // is refused, never served.
    let mut opened = std::fs::File::open(point.join("big/latest/big.bin")).unwrap();
    let key = strata::store::keys::blob(&blake3::hash(&want).to_hex());
    let mut changed = want.clone();
    changed[(5 << 20) / 2] ^= 0x10;
    overwrite(&st, &key, changed);
    let mut after = Vec::new();
    let late = opened.read_to_end(&mut after);
    // Put back, it reads whole.
    overwrite(&st, &key, want.clone());
    let read = std::fs::read(point.join("big/latest/big.bin"));
    drop(opened);
    unmount(&point);
    assert_eq!(read.unwrap(), want);
    assert_eq!(
        late.unwrap_err().raw_os_error(),
        Some(libc::EIO),
        "{} bytes served",
        after.len()
    );
    assert!(
        after.len() <= 2 << 20,
        "only the pieces before the change: {}",
        after.len()
    );
    let cached = walk_files(&host.join("cache/objects/blobs"));
    assert!(cached.is_empty(), "not kept locally: {cached:?}");
}

#[test]
fn a_chunked_file_is_read_by_the_chunks_a_range_needs() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    let want = noise(3, 24 << 20);
    write(&src, "big", &want);
    settle();
    new_s3_store(&st);
    let host = t.path().join("host");
    ok(&strata_s3(
        &st,
        &host,
        &["commit", "--set", "r", src.to_str().unwrap()],
    ));
    let keys = chunk_keys(&want);
    assert!(keys.len() >= 10, "{}", keys.len());
    let point = t.path().join("m");
    std::fs::create_dir_all(&point).unwrap();
    // No assembled copies: every read is a chunk read.
    ok(&Command::new(bin())
        .args(s3_flags(&st, &host))
        .args(["mount", point.to_str().unwrap(), "--assembled-size", "0"])
        .output()
        .unwrap());
    let chunks_cached = || walk_files(&host.join("cache/objects/chunks")).len();
    let before = chunks_cached();
    let mut opened = std::fs::File::open(point.join("r/latest/big")).unwrap();
    let mut got = vec![0u8; 4096];
    let at = 20 << 20;
    std::os::unix::fs::FileExt::read_exact_at(&opened, &mut got, at as u64).unwrap();
    assert_eq!(got, want[at..at + 4096]);
    let fetched = chunks_cached() - before;
    assert!(
        (1..=3).contains(&fetched),
        "a 4 KiB read fetched {fetched} of {} chunks",
        keys.len()
    );
    // A chunk changed on the server before it was fetched is refused.
    let mut changed = storage_at(&st, &t.path().join("raw"))
        .get(&keys[0], 8 << 20)
        .unwrap();
    let original = changed.clone();
    changed[5000] ^= 0x10;
    overwrite(&st, &keys[0], changed);
    let mut first = vec![0u8; 4096];
    let err = std::os::unix::fs::FileExt::read_exact_at(&opened, &mut first, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    overwrite(&st, &keys[0], original);
    let mut whole = Vec::new();
    opened.read_to_end(&mut whole).unwrap();
    drop(opened);
    unmount(&point);
    assert_eq!(whole, want);
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .flat_map(|e| {
            if e.path().is_dir() {
                walk_files(&e.path())
            } else {
                vec![e.path()]
            }
        })
        .collect()
}

#[test]
fn every_command_works_unchanged_on_s3() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "a/one", b"one");
    write(&src, "a/two", b"two");
    settle();
    new_s3_store(&st);
    let h = t.path().join("host");
    let run = |args: &[&str]| ok(&strata_s3(&st, &h, args));
    run(&["commit", "--set", "w", src.to_str().unwrap()]);
    write(&src, "a/two", b"two, changed");
    settle();
    run(&[
        "commit",
        "--set",
        "w",
        "-m",
        "second",
        src.to_str().unwrap(),
    ]);
    assert!(run(&["log", "--set", "w"]).contains("second"));
    assert!(run(&["ls", "--set", "w", "a"]).contains("two"));
    assert_eq!(run(&["cat", "--set", "w", "--gen", "1", "a/two"]), "two");
    assert!(run(&["diff", "--set", "w", "1", "2"]).contains("a/two"));
    assert!(run(&["sets"]).contains('w'));
    run(&["tag", "--set", "w", "--gen", "1", "first"]);
    assert!(run(&["tags", "--set", "w"]).contains("first"));
    run(&["verify", "--all"]);
    run(&["materialize", "--set", "w", "--wait"]);
    assert!(run(&["tasks", "--json"]).contains("PUBLISHED"));
    let history = run(&["history", "--set", "w", "--json", "a/two"]);
    let versions: serde_json::Value = serde_json::from_str(&history).unwrap();
    assert_eq!(versions.as_array().unwrap().len(), 2, "{history}");
    run(&["retain", "--set", "w", "--keep-last", "1"]);
    run(&["sweep", "--dry-run"]);
    run(&["pins", "--json"]);
    run(&["leases", "--json"]);
    assert!(run(&["status"]).contains('w'));
    assert_eq!(run(&["cat", "--set", "w", "a/two"]), "two, changed");
}

/// Every object of the store under `dir` (recursively), with its bytes.
fn remote_objects(s: &S3Storage, dir: &str) -> Vec<(String, Vec<u8>)> {
    let objects: Vec<String> = s
        .list_sizes(dir)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut out = Vec::new();
    for name in s.list(dir).unwrap() {
        let key = if dir.is_empty() {
            name.clone()
        } else {
            format!("{dir}/{name}")
        };
        if objects.contains(&name) {
            // A pin the stopping daemon releases may vanish meanwhile.
            match s.get(&key, 1 << 30) {
                Ok(bytes) => out.push((key, bytes)),
                Err(e) if e.is_not_found() => {}
                Err(e) => panic!("{key}: {e}"),
            }
        } else {
            out.extend(remote_objects(s, &key));
        }
    }
    out
}

/// Issue 7, access: the S3 secret key reaches neither the host's local
/// state (cache, scratch, sockets, the daemon's log at trace level) nor
/// any object of the store, and the local state is private to its owner.
#[test]
fn the_secret_key_is_never_logged_or_stored() {
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    assert!(secret.len() >= 8, "a distinctive test secret");
    let t = tempfile::tempdir().unwrap();
    let (src, st, host) = (
        t.path().join("src"),
        t.path().join("store"),
        t.path().join("host"),
    );
    write(&src, "a/one", b"one");
    write(&src, "big", &noise(7, 3 << 20));
    new_s3_store(&st);
    let traced = |args: &[&str]| {
        ok(&Command::new(bin())
            .args(s3_flags(&st, &host))
            .args(args)
            .env("RUST_LOG", "trace")
            .output()
            .unwrap())
    };
    traced(&["commit", "--set", "k", src.to_str().unwrap()]);
    let point = t.path().join("m");
    std::fs::create_dir_all(&point).unwrap();
    let mounted = traced(&["mount", point.to_str().unwrap(), "--sweep-every", "0s"]);
    let daemon = mounted_pid(&mounted);
    assert_eq!(
        std::fs::read(point.join("k/latest/big")).unwrap(),
        noise(7, 3 << 20)
    );
    traced(&["sweep", "--grace", "0s"]);
    unmount(&point);
    // The daemon removes its socket and pins as it exits: walk after that.
    wait_exited(daemon);
    let local = walk_files(&host);
    assert!(
        local.iter().any(|p| p.ends_with("mountd.log")),
        "the daemon logged: {local:?}"
    );
    for path in &local {
        let bytes = std::fs::read(path).unwrap_or_default();
        let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!found, "the secret key is in {}", path.display());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", path.display());
    }
    let objects = remote_objects(&storage_at(&st, &t.path().join("probe")), "");
    assert!(objects.len() > 5, "{} objects", objects.len());
    for (key, bytes) in &objects {
        let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!found, "the secret key is in object {key}");
    }
}
