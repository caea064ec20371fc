//! Where a store lives: `--store` and the remote flags, parsed once for the
//! CLI and the mount daemon alike.
//!
//! A store is a local directory (the embedded default) or `s3://bucket/prefix`
//! on an S3-compatible service. Credentials come only from the usual AWS
//! environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`); they are never taken as flags, logged or passed on
//! a command line.

use super::{LocalStorage, S3Options, S3Storage, Storage};
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Default cache budget of a remote store.
pub(crate) const DEFAULT_CACHE_BYTES: u64 = 4 << 30;
/// Default ttl of remote leases.
pub(crate) const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug, Clone, Default)]
pub struct StoreArgs {
    /// Store: a directory or s3://bucket[/prefix] (default: $STRATA_STORE,
    /// $XDG_DATA_HOME/strata, ~/.local/share/strata)
    #[arg(long, global = true, value_name = "PATH|s3://BUCKET/PREFIX")]
    pub store: Option<String>,
    /// S3 endpoint URL (default: $AWS_ENDPOINT_URL, else AWS by region)
    #[arg(long, global = true, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// S3 region (default: $AWS_REGION, $AWS_DEFAULT_REGION, us-east-1)
    #[arg(long, global = true)]
    pub s3_region: Option<String>,
    /// Allow plain http to the S3 endpoint (local test servers)
    #[arg(long, global = true)]
    pub allow_http: bool,
    /// Local directory of a remote store: cache, scratch, sockets, logs
    /// (default: $STRATA_CACHE_DIR, else $XDG_CACHE_HOME/strata/<bucket>-<hash>)
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Budget of that cache, e.g. 512M, 4G (default 4G)
    #[arg(long, global = true, value_parser = parse_size, value_name = "BYTES")]
    pub cache_size: Option<u64>,
    /// Ttl of remote leases (pins, writers, staging owners), e.g. 30s
    #[arg(long, global = true, value_parser = parse_duration, value_name = "D")]
    pub lease_ttl: Option<Duration>,
}

/// A resolved store location.
#[derive(Debug, Clone)]
pub enum Location {
    Local(PathBuf),
    S3(S3Options),
}

impl StoreArgs {
    pub fn location(&self) -> Result<Location> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let store = match &self.store {
            Some(s) => s.clone(),
            None => match env("STRATA_STORE") {
                Some(s) => s,
                None => return Ok(Location::Local(default_location()?)),
            },
        };
        if !store.starts_with("s3://") {
            return Ok(Location::Local(PathBuf::from(store)));
        }
        let (bucket, prefix) = super::Endpoint::parse(&store)?;
        let url = self
            .s3_endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| env("AWS_ENDPOINT"));
        let local_dir = match self
            .cache_dir
            .clone()
            .or_else(|| env("STRATA_CACHE_DIR").map(PathBuf::from))
        {
            Some(d) => d,
            None => default_cache_dir(&store, url.as_deref())?,
        };
        let cache_bytes = match (self.cache_size, env("STRATA_CACHE_SIZE")) {
            (Some(n), _) => n,
            (None, Some(s)) => parse_size(&s).map_err(Error::Invalid)?,
            (None, None) => DEFAULT_CACHE_BYTES,
        };
        let lease_ttl = match (self.lease_ttl, env("STRATA_LEASE_TTL")) {
            (Some(d), _) => d,
            (None, Some(s)) => parse_duration(&s).map_err(Error::Invalid)?,
            (None, None) => DEFAULT_LEASE_TTL,
        };
        if lease_ttl < Duration::from_millis(200) || lease_ttl > Duration::from_secs(3600) {
            return Err(Error::Invalid(format!(
                "--lease-ttl must be between 200ms and 1h: lease_ttl={lease_ttl:?}"
            )));
        }
        Ok(Location::S3(S3Options {
            endpoint: super::Endpoint {
                bucket,
                prefix,
                url,
                region: self.s3_region.clone(),
                allow_http: self.allow_http || env("AWS_ALLOW_HTTP").is_some_and(|v| v == "true"),
            },
            local_dir,
            cache_bytes,
            lease_ttl,
        }))
    }

    /// The same flags as arguments for a child process (the mount daemon).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = Vec::new();
        let mut push = |flag: &str, v: OsString| {
            out.push(flag.into());
            out.push(v);
        };
        if let Some(s) = &self.store {
            push("--store", s.into());
        }
        if let Some(s) = &self.s3_endpoint {
            push("--s3-endpoint", s.into());
        }
        if let Some(s) = &self.s3_region {
            push("--s3-region", s.into());
        }
        if let Some(d) = &self.cache_dir {
            push("--cache-dir", d.into());
        }
        if let Some(n) = self.cache_size {
            push("--cache-size", n.to_string().into());
        }
        if let Some(d) = self.lease_ttl {
            push("--lease-ttl", format!("{}ms", d.as_millis()).into());
        }
        if self.allow_http {
            out.push("--allow-http".into());
        }
        out
    }
}

impl Location {
    /// The local directory of this store: the store itself, or the cache
    /// directory of a remote store. Control sockets and logs live under it.
    pub fn local_dir(&self) -> &Path {
        match self {
            Location::Local(p) => p,
            Location::S3(o) => &o.local_dir,
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Location::Local(_))
    }

    /// Open the store for `strata init`: its local directory is created
    /// first (mode 0700, with missing parents).
    pub fn create(&self) -> Result<Arc<dyn Storage>> {
        let path = self.local_dir();
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(path)
            .map_err(|e| Error::io("mkdir", path, e))?;
        self.open()
    }

    pub fn open(&self) -> Result<Arc<dyn Storage>> {
        Ok(match self {
            Location::Local(p) => Arc::new(LocalStorage::new(p)),
            Location::S3(o) => Arc::new(S3Storage::open(o)?),
        })
    }
}

fn default_cache_dir(store: &str, url: Option<&str>) -> Result<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let base = match (env("XDG_CACHE_HOME"), env("HOME")) {
        (Some(x), _) => PathBuf::from(x),
        (None, Some(h)) => Path::new(&h).join(".cache"),
        (None, None) => {
            return Err(Error::Invalid(
                "a remote store needs --cache-dir (neither XDG_CACHE_HOME nor HOME is set)".into(),
            ))
        }
    };
    let id = blake3::hash(format!("{store}\n{}", url.unwrap_or("")).as_bytes());
    let bucket = store
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .unwrap_or("s3");
    Ok(base
        .join("strata")
        .join(format!("{bucket}-{}", &id.to_hex()[..12])))
}

/// `512`, `64K`, `512M`, `4G`, `1T` (powers of 1024).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: expected a number with an optional unit (K, M, G, T)"))?;
    let shift = match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (K, M, G, T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}`: too large"))
}

/// `250ms`, `30s`, `15m`, `2h`, `7d`, `1w` (a bare number is seconds).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: expected a number with a unit (ms, s, m, h, d, w)"))?;
    let millis = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 604_800_000,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (ms, s, m, h, d, w)")),
    };
    n.checked_mul(millis)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{s}`: too long"))
}

/// Default local store: `$STRATA_STORE`, else `$XDG_DATA_HOME/strata`, else
/// `~/.local/share/strata`.
pub fn default_location() -> Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = var("STRATA_STORE") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = var("XDG_DATA_HOME") {
        return Ok(Path::new(&p).join("strata"));
    }
    let home = var("HOME").ok_or_else(|| {
        Error::Invalid(
            "no store given and neither STRATA_STORE, XDG_DATA_HOME nor HOME is set".into(),
        )
    })?;
    Ok(Path::new(&home).join(".local/share/strata"))
}
