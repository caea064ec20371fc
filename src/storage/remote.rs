//! Requests to an S3-compatible service through the `object_store` crate.
//!
//! Owns the translation of single storage operations into (conditional)
//! HTTP requests and of their failures into typed [`Error`]s. Nothing here
//! decides protocol; [`super::s3`] composes these into the storage seam.
//! Requests are retried by `object_store` (bounded backoff on 5xx and
//! connection errors) and here; a conditional write whose first response
//! was lost is recognised by the caller reading its own bytes back. While a
//! [`fence`] is up on the calling thread, no request starts after its
//! deadline and none in flight outlives it.

use super::fence;
use crate::error::{Error, Result};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Objects at or above this size are fetched as parallel ranged GETs.
pub(crate) const RANGED_PART: u64 = 8 << 20;
/// Extra attempts of a request that failed transiently in a way the client
/// does not retry itself (a conditional PUT cut mid-request, a connection
/// the pool handed out as it closed).
const RETRIES: u32 = 6;

/// Run `f`, again after 100 ms, 200 ms, ... 3.2 s while it fails
/// transiently; other outcomes (including not-found and 403) are final. No
/// attempt starts past the deadline of the thread's fence.
pub(super) fn again<T>(f: impl Fn() -> Result<T>) -> Result<T> {
    let fence = fence::current();
    let mut attempt = 0;
    loop {
        if let Some(a) = &fence {
            a.check()?;
        }
        match f() {
            Err(Error::Remote {
                transient: true, ..
            }) if attempt < RETRIES => {
                std::thread::sleep(Duration::from_millis(100 << attempt));
                attempt += 1;
            }
            r => return r,
        }
    }
}
/// Ranged GETs in flight for one object.
const RANGED_PARALLEL: usize = 8;

/// Where an S3-compatible store lives and how to reach it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub bucket: String,
    pub prefix: String,
    /// `http(s)://host:port`; `None`: AWS by region.
    pub url: Option<String>,
    pub region: Option<String>,
    pub allow_http: bool,
}

impl Endpoint {
    /// Parse `s3://bucket[/prefix]`.
    pub fn parse(store: &str) -> Result<(String, String)> {
        let rest = store
            .strip_prefix("s3://")
            .ok_or_else(|| Error::Invalid(format!("not an s3:// address: store=`{store}`")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/').to_string();
        let valid = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
        };
        if bucket.is_empty() || !valid(bucket) || !valid(&prefix) || prefix.contains("..") {
            return Err(Error::Invalid(format!(
                "s3 address must be s3://bucket[/prefix] of [A-Za-z0-9._-/]: store=`{store}`"
            )));
        }
        Ok((bucket.to_string(), prefix))
    }
}

/// Whether a failed request may succeed when sent again: an answer of
/// 5xx (but 501 and 505, which will not change), 408 or 429, and a request
/// that got no answer at all (connection refused or cut, timeout) are; every
/// other answer (denied, malformed, unauthenticated) and configuration
/// errors are not. The client keeps its status codes private, so the code
/// is read from the error's text.
fn is_transient(e: &object_store::Error) -> bool {
    if !matches!(e, object_store::Error::Generic { .. }) {
        return false;
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&s.to_string());
        source = s.source();
    }
    match text.find("status code: ") {
        Some(i) => {
            let code = text.get(i + 13..i + 16).unwrap_or("");
            matches!(code, "408" | "429")
                || (code.starts_with('5') && !matches!(code, "501" | "505"))
        }
        None => true,
    }
}

/// What is directly under a prefix.
#[derive(Debug)]
pub(crate) struct Listing {
    /// Common prefixes ("directories"), last component only.
    pub(crate) dirs: Vec<String>,
    /// Objects with their sizes, last component only.
    pub(crate) objects: Vec<(String, u64)>,
}

/// One write's result.
#[derive(Debug)]
pub(crate) enum Put {
    Done(UpdateVersion),
    /// `If-None-Match: *` failed: the name exists.
    Exists,
    /// `If-Match` failed: the object changed or is gone.
    Changed,
}

/// Requests sent, by kind (for `status` and the benchmarks).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    get: AtomicU64,
    get_range: AtomicU64,
    head: AtomicU64,
    put: AtomicU64,
    list: AtomicU64,
    delete: AtomicU64,
    cache_hits: AtomicU64,
    cache_fills: AtomicU64,
}

impl Counts {
    fn bump(n: &AtomicU64) {
        n.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn hit(&self, filled: bool) {
        Self::bump(if filled {
            &self.cache_fills
        } else {
            &self.cache_hits
        });
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        BTreeMap::from([
            ("get", get(&self.get)),
            ("get_range", get(&self.get_range)),
            ("head", get(&self.head)),
            ("put", get(&self.put)),
            ("list", get(&self.list)),
            ("delete", get(&self.delete)),
            ("cache_hits", get(&self.cache_hits)),
            ("cache_fills", get(&self.cache_fills)),
        ])
    }
}

#[derive(Debug)]
pub(crate) struct Remote {
    pub(crate) counts: Counts,
    pub(super) store: Arc<AmazonS3>,
    pub(super) prefix: String,
    pub(super) allow_http: bool,
    rt: tokio::runtime::Runtime,
    describe: String,
}

impl Remote {
    /// Credentials come from the usual AWS environment variables.
    pub(crate) fn connect(ep: &Endpoint) -> Result<Remote> {
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&ep.bucket)
            .with_allow_http(ep.allow_http);
        if let Some(url) = &ep.url {
            b = b.with_endpoint(url);
        }
        let region = ep
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".into());
        b = b.with_region(region).with_retry(object_store::RetryConfig {
            backoff: object_store::BackoffConfig::default(),
            max_retries: 3,
            retry_timeout: Duration::from_secs(20),
        });
        let store = b.build().map_err(|e| Error::Remote {
            op: "configure",
            key: format!("s3://{}", ep.bucket),
            transient: false,
            source: Box::new(e),
        })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("strata-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start-runtime", "tokio", e))?;
        let at = ep.url.as_deref().unwrap_or("aws");
        Ok(Remote {
            counts: Counts::default(),
            store: Arc::new(store),
            prefix: ep.prefix.clone(),
            allow_http: ep.allow_http,
            rt,
            describe: format!("s3://{}/{} at {at}", ep.bucket, ep.prefix),
        })
    }

    pub(crate) fn describe(&self) -> &str {
        &self.describe
    }

    pub(super) fn path(&self, key: &str) -> ObjPath {
        if self.prefix.is_empty() {
            ObjPath::from(key)
        } else {
            ObjPath::from(format!("{}/{key}", self.prefix))
        }
    }

    /// Run one request to completion; under a fence, only until its
    /// deadline (then the request is abandoned and the answer is `Fenced`).
    pub(super) fn block<T>(
        &self,
        request: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let Some(fence) = fence::current() else {
            return self.rt.block_on(request);
        };
        let left = fence.deadline.saturating_duration_since(Instant::now());
        self.rt
            .block_on(async { tokio::time::timeout(left, request).await })
            .unwrap_or_else(|_| Err(fence.fenced()))
    }

    pub(super) fn err(op: &'static str, key: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::missing_object(key),
            e => Error::Remote {
                op,
                key: key.to_string(),
                transient: is_transient(&e),
                source: Box::new(e),
            },
        }
    }

    /// Whole object and its version; `None` if absent.
    pub(crate) fn get(&self, key: &str, limit: u64) -> Result<Option<(Bytes, UpdateVersion)>> {
        again(|| self.get_once(key, limit))
    }

    fn get_once(&self, key: &str, limit: u64) -> Result<Option<(Bytes, UpdateVersion)>> {
        let path = self.path(key);
        Counts::bump(&self.counts.get);
        self.block(async {
            let r = match self.store.get_opts(&path, GetOptions::default()).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(Self::err("get", key, e)),
            };
            if r.meta.size > limit {
                return Err(Error::TooLarge {
                    what: "stored object",
                    size: r.meta.size,
                    limit,
                });
            }
            let version = UpdateVersion {
                e_tag: r.meta.e_tag.clone(),
                version: r.meta.version.clone(),
            };
            let bytes = r.bytes().await.map_err(|e| Self::err("get", key, e))?;
            Ok(Some((bytes, version)))
        })
    }

    pub(crate) fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes> {
        again(|| self.get_range_once(key, offset, len))
    }

    fn get_range_once(&self, key: &str, offset: u64, len: u64) -> Result<Bytes> {
        let path = self.path(key);
        Counts::bump(&self.counts.get_range);
        let end = offset.checked_add(len).ok_or_else(|| {
            Error::corrupt(
                "object",
                key,
                format!("range overflows: offset={offset} len={len}"),
            )
        })?;
        let bytes = self.block(async {
            self.store
                .get_range(&path, offset..end)
                .await
                .map_err(|e| Self::err("get-range", key, e))
        })?;
        if bytes.len() as u64 != len {
            return Err(Error::corrupt(
                "object",
                key,
                format!("short ranged read: offset={offset} len={len}"),
            ));
        }
        Ok(bytes)
    }

    /// Download `size` bytes of `key` into `file` with parallel ranged GETs;
    /// with `blake3`, also the BLAKE3 hash of what was written, each part
    /// hashed as it arrives (its pieces' chaining values, [`super::pieces`]),
    /// so verifying the copy costs no second pass.
    pub(crate) fn download(
        &self,
        key: &str,
        size: u64,
        file: &File,
        blake3: bool,
    ) -> Result<Option<[u8; 32]>> {
        let path = self.path(key);
        let parts: Vec<(u64, u64)> = (0..size.div_ceil(RANGED_PART))
            .map(|i| {
                let start = i * RANGED_PART;
                (start, (start + RANGED_PART).min(size))
            })
            .collect();
        let parts = self.block(async {
            futures::stream::iter(parts)
                .map(|(start, end)| {
                    let store = self.store.clone();
                    let path = path.clone();
                    Counts::bump(&self.counts.get_range);
                    async move { (start, store.get_range(&path, start..end).await) }
                })
                .buffer_unordered(RANGED_PARALLEL)
                .map(|(start, r)| {
                    let bytes = r.map_err(|e| Self::err("get-range", key, e))?;
                    file.write_all_at(&bytes, start)
                        .map_err(|e| Error::io("write-cache", key, e))?;
                    let values = match blake3 {
                        true => super::pieces::values_at(start, &bytes, size),
                        false => Vec::new(),
                    };
                    Ok((start, values))
                })
                .try_collect::<Vec<(u64, Vec<[u8; 32]>)>>()
                .await
        });
        let mut parts = parts?;
        if !blake3 {
            return Ok(None);
        }
        parts.sort_by_key(|(start, _)| *start);
        let values: Vec<[u8; 32]> = parts.into_iter().flat_map(|(_, v)| v).collect();
        Ok(Some(super::pieces::root(&values, size)))
    }

    /// Size of an object, `None` if absent.
    pub(crate) fn head(&self, key: &str) -> Result<Option<u64>> {
        again(|| self.head_once(key))
    }

    fn head_once(&self, key: &str) -> Result<Option<u64>> {
        Counts::bump(&self.counts.head);
        self.block(async {
            match self.store.head(&self.path(key)).await {
                Ok(m) => Ok(Some(m.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(Self::err("head", key, e)),
            }
        })
    }

    /// One PUT. Conditional PUTs are not retried by the client when a
    /// connection breaks mid-request (they are not idempotent), so they are
    /// retried here a bounded number of times; a retry that then fails its
    /// precondition is sorted out by the caller reading its bytes back.
    pub(crate) fn put(&self, key: &str, body: Bytes, mode: PutMode) -> Result<Put> {
        again(|| self.put_once(key, body.clone(), mode.clone()))
    }

    fn put_once(&self, key: &str, body: Bytes, mode: PutMode) -> Result<Put> {
        Counts::bump(&self.counts.put);
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        let payload = PutPayload::from_bytes(body);
        self.block(async {
            match self.store.put_opts(&self.path(key), payload, opts).await {
                Ok(r) => Ok(Put::Done(r.into())),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(Put::Exists),
                Err(object_store::Error::Precondition { .. })
                | Err(object_store::Error::NotFound { .. }) => Ok(Put::Changed),
                Err(e) => Err(Self::err("put", key, e)),
            }
        })
    }

    /// Upload a large local file in parts (only for content-named objects:
    /// an overwrite by a concurrent identical upload changes nothing). An
    /// upload that fails is aborted, so no parts stay behind; one whose
    /// writer dies is aborted by a later sweep (`super::uploads`).
    pub(crate) fn put_large(&self, key: &str, file: &Path) -> Result<()> {
        let path = self.path(key);
        let f = File::open(file).map_err(|e| Error::io("open", file, e))?;
        let size = f.metadata().map_err(|e| Error::io("stat", file, e))?.len();
        self.block(async {
            let mut upload = self
                .store
                .put_multipart(&path)
                .await
                .map_err(|e| Self::err("put-multipart", key, e))?;
            let sent = self.send_parts(&mut *upload, key, (&f, file), size).await;
            if sent.is_err() {
                if let Err(a) = upload.abort().await {
                    tracing::warn!("{key}: failed upload not aborted ({a}); a sweep aborts it");
                }
            }
            sent
        })
    }

    /// Every part of `file` (4 in flight), then the completion.
    async fn send_parts(
        &self,
        upload: &mut dyn object_store::MultipartUpload,
        key: &str,
        (f, file): (&File, &Path),
        size: u64,
    ) -> Result<()> {
        let part_err = |e| Self::err("put-part", key, e);
        let mut inflight = futures::stream::FuturesUnordered::new();
        let mut off = 0u64;
        while off < size {
            if inflight.len() >= 4 {
                inflight.next().await.transpose().map_err(part_err)?;
            }
            let n = RANGED_PART.min(size - off);
            let mut buf = vec![0u8; n as usize];
            f.read_exact_at(&mut buf, off)
                .map_err(|e| Error::io("read", file, e))?;
            inflight.push(upload.put_part(PutPayload::from(buf)));
            Counts::bump(&self.counts.put);
            off += n;
        }
        while let Some(r) = inflight.next().await {
            r.map_err(part_err)?;
        }
        upload
            .complete()
            .await
            .map(|_| ())
            .map_err(|e| Self::err("complete-multipart", key, e))
    }

    /// Directories (common prefixes) and objects with sizes directly under `dir`.
    pub(crate) fn list(&self, dir: &str) -> Result<Listing> {
        again(|| self.list_once(dir))
    }

    fn list_once(&self, dir: &str) -> Result<Listing> {
        Counts::bump(&self.counts.list);
        let r = self.block(async {
            self.store
                .list_with_delimiter(Some(&self.path(dir)))
                .await
                .map_err(|e| Self::err("list", dir, e))
        })?;
        let last = |p: &ObjPath| p.filename().map(str::to_string);
        let dirs = r.common_prefixes.iter().filter_map(last).collect();
        let objects = r
            .objects
            .iter()
            .filter_map(|m| last(&m.location).map(|n| (n, m.size)))
            .collect();
        Ok(Listing { dirs, objects })
    }

    pub(crate) fn delete(&self, key: &str) -> Result<()> {
        again(|| self.delete_once(key))
    }

    fn delete_once(&self, key: &str) -> Result<()> {
        Counts::bump(&self.counts.delete);
        self.block(async {
            match self.store.delete(&self.path(key)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(Self::err("delete", key, e)),
            }
        })
    }

    /// Delete every object whose name starts with `dir/`.
    pub(crate) fn delete_prefix(&self, dir: &str) -> Result<()> {
        let prefix = self.path(dir);
        self.block(async {
            let names = self
                .store
                .list(Some(&prefix))
                .map_ok(|m| m.location)
                .boxed();
            self.store
                .delete_stream(names)
                .try_collect::<Vec<_>>()
                .await
                .map(|_| ())
                .map_err(|e| Self::err("delete-prefix", dir, e))
        })
    }
}
