//! Segments: immutable Parquet files of rows in key order, named by SHA-256.
//!
//! A segment is split into row groups of at most [`GROUP_ROWS`] rows; the
//! first key of every group is kept in the file's key-value metadata
//! (`strata.segment`), so a lookup or a directory listing decodes only the
//! groups it needs. A reader verifies the SHA-256 before parsing, checks the
//! schema and the group index, and checks key order and field validity of
//! every group it decodes. Any failure is `Error::Corrupt` naming the file;
//! a panic inside the Parquet decoder is caught and reported the same way.

use crate::error::{Error, IoContext, Result};
use crate::row::{check_path_len, BlobLoc, Codec, Kind, Meta, Row, MAX_NAME};
use arrow_array::builder::{
    BinaryBuilder, FixedSizeBinaryBuilder, Int64Builder, UInt32Builder, UInt64Builder, UInt8Builder,
};
use arrow_array::{
    Array, ArrayRef, BinaryArray, FixedSizeBinaryArray, Int64Array, RecordBatch, UInt32Array,
    UInt64Array, UInt8Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// Segment format version (see docs/FORMAT.md, "Segment").
/// 1: initial layout. 2: `uid` and `gid` columns appended (a version 1
/// segment reads as owner 0:0). 3: blob location 3, chunked (the `pack`
/// column holds the chunk list's digest). 4: kinds `p`, `s`, `c`, `b` and
/// the `link`, `nlink`, `rdev` and `xattrs` columns appended (an older
/// segment reads as none of them).
pub const SEGMENT_VERSION: u32 = 4;
/// Rows per row group: the unit a lookup decodes.
pub const GROUP_ROWS: usize = 4096;
/// Rows per segment before the writer starts a new file.
pub const SEGMENT_ROWS: usize = 65536;
/// Largest segment file a reader accepts.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
const META_KEY: &str = "strata.segment";

/// Columns written without zstd: dictionary and run-length encoding leave
/// nothing for it to gain (small enumerations, per-directory parents) or the
/// bytes are random (digests), and a compressed column chunk costs a reader
/// a compression and a decompression context per row group (parquet's codec
/// makes both). Decoding the wide benchmark tree's 1M rows took 160 ms with
/// every column compressed and takes 110 ms without these; the files are
/// the same size.
const RAW_COLUMNS: [&str; 15] = [
    "parent",
    "kind",
    "mode",
    "digest",
    "blob",
    "pack",
    "codec",
    "target",
    "first_gen",
    "changed_gen",
    "uid",
    "gid",
    "link",
    "nlink",
    "rdev",
];

/// Columns of a version 1 segment; version 2 appends `uid` and `gid`.
const V1_COLUMNS: usize = 17;
/// Columns of a version 2 or 3 segment; version 4 appends `link`, `nlink`,
/// `rdev` and `xattrs`.
const V3_COLUMNS: usize = 19;

fn schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            Arc::new(Schema::new(vec![
                Field::new("parent", DataType::Binary, false),
                Field::new("name", DataType::Binary, false),
                Field::new("kind", DataType::UInt8, false),
                Field::new("mode", DataType::UInt32, false),
                Field::new("size", DataType::UInt64, false),
                Field::new("mtime_ns", DataType::Int64, false),
                Field::new("digest", DataType::FixedSizeBinary(32), true),
                Field::new("blob", DataType::UInt8, false),
                Field::new("pack", DataType::FixedSizeBinary(32), true),
                Field::new("offset", DataType::UInt64, false),
                Field::new("stored_len", DataType::UInt64, false),
                Field::new("codec", DataType::UInt8, false),
                Field::new("target", DataType::Binary, true),
                Field::new("first_gen", DataType::UInt64, false),
                Field::new("changed_gen", DataType::UInt64, false),
                Field::new("ino", DataType::UInt64, false),
                Field::new("ctime_ns", DataType::Int64, false),
                Field::new("uid", DataType::UInt32, false),
                Field::new("gid", DataType::UInt32, false),
                Field::new("link", DataType::UInt64, false),
                Field::new("nlink", DataType::UInt32, false),
                Field::new("rdev", DataType::UInt64, false),
                Field::new("xattrs", DataType::Binary, true),
            ]))
        })
        .clone()
}

/// The group index stored in the file's key-value metadata.
#[derive(Debug, Serialize, Deserialize)]
struct SegmentMeta {
    version: u32,
    rows: u64,
    groups: Vec<GroupMeta>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct GroupMeta {
    rows: u64,
    /// `[hex(parent), hex(name)]` of the group's first row.
    first: [String; 2],
}

/// What the writer reports for each finished segment file.
#[derive(Debug, Clone)]
pub struct SegmentFile {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub rows: u64,
    pub first: (Vec<u8>, Vec<u8>),
    pub last: (Vec<u8>, Vec<u8>),
}

/// A `Write` that hashes everything written through it.
struct HashingFile {
    file: File,
    sha: Sha256,
    written: u64,
}

impl Write for HashingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.sha.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

struct OpenSegment {
    writer: ArrowWriter<HashingFile>,
    path: PathBuf,
    rows: u64,
    groups: Vec<GroupMeta>,
    first: (Vec<u8>, Vec<u8>),
    last: (Vec<u8>, Vec<u8>),
}

/// Streams rows (already in key order) into one or more segment files in
/// `dir`. Rows are grouped here; each group is encoded and written by a
/// writer thread, so encoding overlaps with whatever produces the rows. At
/// most [`GROUPS_IN_FLIGHT`] groups wait for that thread.
pub struct SegmentWriter {
    buf: Vec<Row>,
    last_key: Option<(Vec<u8>, Vec<u8>)>,
    tx: Option<SyncSender<Vec<Row>>>,
    worker: Option<JoinHandle<Result<Vec<SegmentFile>>>>,
}

/// Groups queued for the writer thread.
const GROUPS_IN_FLIGHT: usize = 2;

impl SegmentWriter {
    pub fn new(dir: &Path) -> Result<SegmentWriter> {
        let (tx, rx) = sync_channel::<Vec<Row>>(GROUPS_IN_FLIGHT);
        let files = GroupWriter {
            dir: dir.to_path_buf(),
            open: None,
            done: Vec::new(),
        };
        let worker = std::thread::Builder::new()
            .name("segment-writer".into())
            .spawn(move || files.run(rx))
            .ctx("spawn segment writer", dir)?;
        Ok(SegmentWriter {
            buf: Vec::with_capacity(GROUP_ROWS),
            last_key: None,
            tx: Some(tx),
            worker: Some(worker),
        })
    }

    pub fn push(&mut self, row: Row) -> Result<()> {
        if let Some((p, n)) = &self.last_key {
            if crate::row::key_cmp(p, n, &row.parent, &row.name) != std::cmp::Ordering::Less {
                return Err(Error::internal(format!(
                    "segment rows out of order at path=`{}`",
                    crate::row::show(&row.path())
                )));
            }
        }
        self.last_key = Some((row.parent.clone(), row.name.clone()));
        self.buf.push(row);
        if self.buf.len() == GROUP_ROWS {
            self.send()?;
        }
        Ok(())
    }

    /// Hand the buffered group to the writer thread; if it stopped, its
    /// error is the answer.
    fn send(&mut self) -> Result<()> {
        let rows = std::mem::replace(&mut self.buf, Vec::with_capacity(GROUP_ROWS));
        let sent = self.tx.as_ref().map(|tx| tx.send(rows).is_ok());
        if sent == Some(true) {
            return Ok(());
        }
        self.tx = None;
        self.join()?;
        Err(Error::internal("segment writer stopped early"))
    }

    fn join(&mut self) -> Result<Vec<SegmentFile>> {
        let worker = self
            .worker
            .take()
            .ok_or_else(|| Error::internal("segment writer already finished"))?;
        worker
            .join()
            .map_err(|_| Error::internal("segment writer panicked"))?
    }

    pub fn finish(mut self) -> Result<Vec<SegmentFile>> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        self.tx = None;
        self.join()
    }
}

impl Drop for SegmentWriter {
    /// An abandoned writer (an error upstream) stops its thread.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The writer thread's state: the open segment file and the finished ones.
struct GroupWriter {
    dir: PathBuf,
    open: Option<OpenSegment>,
    done: Vec<SegmentFile>,
}

impl GroupWriter {
    fn run(mut self, rx: Receiver<Vec<Row>>) -> Result<Vec<SegmentFile>> {
        for rows in rx {
            self.flush_group(rows)?;
        }
        self.close_segment()?;
        Ok(self.done)
    }

    fn flush_group(&mut self, rows: Vec<Row>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if self.open.is_none() {
            self.open = Some(self.open_segment()?);
        }
        let seg = self.open.as_mut().expect("opened above");
        let first = (rows[0].parent.clone(), rows[0].name.clone());
        let last = rows
            .last()
            .map(|r| (r.parent.clone(), r.name.clone()))
            .expect("non-empty");
        if seg.rows == 0 {
            seg.first = first.clone();
        }
        seg.last = last;
        seg.groups.push(GroupMeta {
            rows: rows.len() as u64,
            first: [hex::encode(&first.0), hex::encode(&first.1)],
        });
        seg.rows += rows.len() as u64;
        let batch = to_batch(&rows)?;
        let path = seg.path.clone();
        seg.writer
            .write(&batch)
            .map_err(|e| parquet_err("write", &path, e))?;
        seg.writer
            .flush()
            .map_err(|e| parquet_err("flush", &path, e))?;
        if seg.rows as usize >= SEGMENT_ROWS {
            self.close_segment()?;
        }
        Ok(())
    }

    fn open_segment(&self) -> Result<OpenSegment> {
        let (path, file) = crate::token::fresh_file(&self.dir, "segment")?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("valid level"),
            ))
            .set_statistics_enabled(EnabledStatistics::None)
            .set_max_row_group_row_count(Some(GROUP_ROWS))
            .set_created_by(format!("strata {}", env!("CARGO_PKG_VERSION")));
        for column in RAW_COLUMNS {
            props =
                props.set_column_compression(ColumnPath::from(column), Compression::UNCOMPRESSED);
        }
        let props = props.build();
        let sink = HashingFile {
            file,
            sha: Sha256::new(),
            written: 0,
        };
        let writer = ArrowWriter::try_new(sink, schema(), Some(props))
            .map_err(|e| parquet_err("open", &path, e))?;
        Ok(OpenSegment {
            writer,
            path,
            rows: 0,
            groups: Vec::new(),
            first: Default::default(),
            last: Default::default(),
        })
    }

    fn close_segment(&mut self) -> Result<()> {
        let Some(mut seg) = self.open.take() else {
            return Ok(());
        };
        let meta = SegmentMeta {
            version: SEGMENT_VERSION,
            rows: seg.rows,
            groups: seg.groups,
        };
        let meta_json = serde_json::to_string(&meta)
            .map_err(|e| Error::internal_from("encode the segment metadata", e))?;
        seg.writer
            .append_key_value_metadata(KeyValue::new(META_KEY.to_string(), meta_json));
        let mut sink = seg
            .writer
            .into_inner()
            .map_err(|e| parquet_err("close", &seg.path, e))?;
        sink.file.flush().ctx("write", &seg.path)?;
        sink.file.sync_all().ctx("fsync", &seg.path)?;
        let name = hex::encode(sink.sha.finalize());
        let final_path = self.dir.join(format!("{name}.parquet"));
        std::fs::rename(&seg.path, &final_path).ctx("rename", &final_path)?;
        self.done.push(SegmentFile {
            name,
            path: final_path,
            size: sink.written,
            rows: seg.rows,
            first: seg.first,
            last: seg.last,
        });
        Ok(())
    }
}

fn parquet_err(op: &'static str, path: &Path, e: parquet::errors::ParquetError) -> Error {
    Error::io(op, path, io::Error::other(e.to_string()))
}

fn to_batch(rows: &[Row]) -> Result<RecordBatch> {
    let n = rows.len();
    let mut parent = BinaryBuilder::with_capacity(n, n * 16);
    let mut name = BinaryBuilder::with_capacity(n, n * 16);
    let mut kind = UInt8Builder::with_capacity(n);
    let mut mode = UInt32Builder::with_capacity(n);
    let mut size = UInt64Builder::with_capacity(n);
    let mut mtime = Int64Builder::with_capacity(n);
    let mut digest = FixedSizeBinaryBuilder::with_capacity(n, 32);
    let mut blob = UInt8Builder::with_capacity(n);
    let mut pack = FixedSizeBinaryBuilder::with_capacity(n, 32);
    let mut offset = UInt64Builder::with_capacity(n);
    let mut stored = UInt64Builder::with_capacity(n);
    let mut codec = UInt8Builder::with_capacity(n);
    let mut target = BinaryBuilder::with_capacity(n, 0);
    let mut first = UInt64Builder::with_capacity(n);
    let mut changed = UInt64Builder::with_capacity(n);
    let mut ino = UInt64Builder::with_capacity(n);
    let mut ctime = Int64Builder::with_capacity(n);
    let mut uid = UInt32Builder::with_capacity(n);
    let mut gid = UInt32Builder::with_capacity(n);
    let mut link = UInt64Builder::with_capacity(n);
    let mut nlink = UInt32Builder::with_capacity(n);
    let mut rdev = UInt64Builder::with_capacity(n);
    let mut xattrs = BinaryBuilder::with_capacity(n, 0);
    let fsb = |e: arrow_schema::ArrowError| Error::internal_from("build a segment column", e);
    for r in rows {
        parent.append_value(&r.parent);
        name.append_value(&r.name);
        kind.append_value(r.kind.code());
        mode.append_value(r.mode);
        size.append_value(r.size);
        mtime.append_value(r.mtime_ns);
        match &r.digest {
            Some(d) => digest.append_value(d).map_err(fsb)?,
            None => digest.append_null(),
        }
        let (tag, p, o, l, c) = match r.blob {
            BlobLoc::None => (0, None, 0, 0, 0),
            BlobLoc::Standalone => (1, None, 0, 0, 0),
            BlobLoc::Chunked { list, data } => (3, Some(list), 0, data, 0),
            BlobLoc::Packed {
                pack,
                offset,
                len,
                codec,
            } => (2, Some(pack), offset, len, codec.code()),
        };
        blob.append_value(tag);
        match p {
            Some(p) => pack.append_value(p).map_err(fsb)?,
            None => pack.append_null(),
        }
        offset.append_value(o);
        stored.append_value(l);
        codec.append_value(c);
        target.append_option(r.target.as_deref());
        first.append_value(r.first_gen);
        changed.append_value(r.changed_gen);
        ino.append_value(r.ino);
        ctime.append_value(r.ctime_ns);
        uid.append_value(r.uid);
        gid.append_value(r.gid);
        let meta = r.meta();
        link.append_value(meta.link);
        nlink.append_value(meta.nlink);
        rdev.append_value(meta.rdev);
        match meta.xattrs.is_empty() {
            true => xattrs.append_null(),
            false => xattrs.append_value(&meta.xattrs),
        }
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(parent.finish()),
        Arc::new(name.finish()),
        Arc::new(kind.finish()),
        Arc::new(mode.finish()),
        Arc::new(size.finish()),
        Arc::new(mtime.finish()),
        Arc::new(digest.finish()),
        Arc::new(blob.finish()),
        Arc::new(pack.finish()),
        Arc::new(offset.finish()),
        Arc::new(stored.finish()),
        Arc::new(codec.finish()),
        Arc::new(target.finish()),
        Arc::new(first.finish()),
        Arc::new(changed.finish()),
        Arc::new(ino.finish()),
        Arc::new(ctime.finish()),
        Arc::new(uid.finish()),
        Arc::new(gid.finish()),
        Arc::new(link.finish()),
        Arc::new(nlink.finish()),
        Arc::new(rdev.finish()),
        Arc::new(xattrs.finish()),
    ];
    RecordBatch::try_new(schema(), cols)
        .map_err(|e| Error::internal_from("assemble a segment row group", e))
}

/// One group's place in a parsed segment.
#[derive(Debug, Clone)]
struct Group {
    rows: usize,
    first: (Vec<u8>, Vec<u8>),
}

/// A verified, parsed segment held in memory.
pub struct Segment {
    name: String,
    bytes: Bytes,
    meta: ArrowReaderMetadata,
    groups: Vec<Group>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("groups", &self.groups.len())
            .finish()
    }
}

impl Segment {
    /// Verify `bytes` against `name` (its SHA-256) and parse the footer.
    pub fn parse(name: &str, bytes: Vec<u8>) -> Result<Segment> {
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != name {
            return Err(Error::corrupt(
                "segment",
                name,
                format!("sha256 mismatch: actual={actual}"),
            ));
        }
        Segment::parse_verified(name, bytes)
    }

    /// Parse the footer of bytes whose SHA-256 this process has already
    /// checked against `name` (a segment read again after it left a cache);
    /// decoding still checks everything it reads.
    pub fn parse_verified(name: &str, bytes: Vec<u8>) -> Result<Segment> {
        let bytes = Bytes::from(bytes);
        let meta = guard(name, || {
            ArrowReaderMetadata::load(&bytes, ArrowReaderOptions::new())
        })?;
        let (version, groups) = parse_group_index(name, &meta)?;
        let full = schema();
        let want = match version {
            1 => &full.fields()[..V1_COLUMNS],
            2 | 3 => &full.fields()[..V3_COLUMNS],
            _ => &full.fields()[..],
        };
        if meta.schema().fields()[..] != *want {
            return Err(Error::corrupt(
                "segment",
                name,
                format!("schema differs from segment v{version}"),
            ));
        }
        Ok(Segment {
            name: name.to_string(),
            bytes,
            meta,
            groups,
        })
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    pub fn rows(&self) -> u64 {
        self.groups.iter().map(|g| g.rows as u64).sum()
    }

    /// The key of the first row of group `i`, from the group index.
    pub fn group_first(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.groups.get(i).map(|g| (&g.first.0[..], &g.first.1[..]))
    }

    /// Index of the last group whose first key is <= `(parent, name)`.
    pub fn group_for(&self, parent: &[u8], name: &[u8]) -> usize {
        let idx = self
            .groups
            .partition_point(|g| crate::row::key_cmp(&g.first.0, &g.first.1, parent, name).is_le());
        idx.saturating_sub(1)
    }

    /// Decode and validate one row group.
    pub fn read_group(&self, i: usize) -> Result<Vec<Row>> {
        let group = self
            .groups
            .get(i)
            .ok_or_else(|| Error::internal(format!("group {i} out of range")))?;
        let batches = guard(&self.name, || {
            ParquetRecordBatchReaderBuilder::new_with_metadata(
                self.bytes.clone(),
                self.meta.clone(),
            )
            .with_row_groups(vec![i])
            .with_batch_size(GROUP_ROWS)
            .build()?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Into::into)
        })?;
        let mut rows = Vec::with_capacity(group.rows);
        for b in &batches {
            decode_batch(&self.name, b, &mut rows)?;
        }
        self.check_group(group, &rows)?;
        Ok(rows)
    }

    /// Content digests and locations of one group, decoding only those
    /// columns (for the commit's dedupe index). Rows without content are
    /// skipped; location fields are validated as in [`Segment::read_group`].
    pub fn read_blob_refs(&self, i: usize, out: &mut Vec<([u8; 32], BlobLoc)>) -> Result<()> {
        for b in &self.project(i, &BLOB_COLUMNS)? {
            decode_blob_refs(&self.name, b, out)?;
        }
        Ok(())
    }

    /// Locations of one group's stored content, decoding only the location
    /// columns (for a sweep's pack live ratios); validated as in
    /// [`Segment::read_group`].
    pub fn read_locs(&self, i: usize, out: &mut Vec<BlobLoc>) -> Result<()> {
        for b in &self.project(i, &BLOB_COLUMNS[1..])? {
            let locs = LocColumns::at(&self.name, b, 0)?;
            for r in 0..b.num_rows() {
                let loc = locs.loc(r)?;
                if loc != BlobLoc::None {
                    out.push(loc);
                }
            }
        }
        Ok(())
    }

    /// Row group `i` decoded for the given root columns only.
    fn project(&self, i: usize, columns: &[usize]) -> Result<Vec<RecordBatch>> {
        guard(&self.name, || {
            let mask = ProjectionMask::roots(self.meta.parquet_schema(), columns.iter().copied());
            ParquetRecordBatchReaderBuilder::new_with_metadata(
                self.bytes.clone(),
                self.meta.clone(),
            )
            .with_row_groups(vec![i])
            .with_projection(mask)
            .with_batch_size(GROUP_ROWS)
            .build()?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Into::into)
        })
    }

    fn check_group(&self, group: &Group, rows: &[Row]) -> Result<()> {
        if rows.len() != group.rows {
            return Err(Error::corrupt(
                "segment",
                &self.name,
                "row group length differs from index",
            ));
        }
        if rows.first().map(|r| (&r.parent, &r.name)) != Some((&group.first.0, &group.first.1)) {
            return Err(Error::corrupt(
                "segment",
                &self.name,
                "row group first key differs from index",
            ));
        }
        for w in rows.windows(2) {
            if w[0].key_cmp(&w[1]) != std::cmp::Ordering::Less {
                return Err(Error::corrupt(
                    "segment",
                    &self.name,
                    "rows out of key order",
                ));
            }
        }
        Ok(())
    }
}

fn guard<T>(name: &str, f: impl FnOnce() -> parquet::errors::Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::corrupt("segment", name, format!("parquet: {e}"))),
        Err(_) => Err(Error::corrupt("segment", name, "parquet decoder panicked")),
    }
}

/// The segment's version and group index.
fn parse_group_index(name: &str, meta: &ArrowReaderMetadata) -> Result<(u32, Vec<Group>)> {
    let md = meta.metadata();
    let kv = md
        .file_metadata()
        .key_value_metadata()
        .and_then(|kvs| kvs.iter().find(|kv| kv.key == META_KEY));
    let text = kv
        .and_then(|kv| kv.value.as_deref())
        .ok_or_else(|| Error::corrupt("segment", name, "missing strata.segment metadata"))?;
    let sm: SegmentMeta = serde_json::from_str(text)
        .map_err(|e| Error::corrupt("segment", name, format!("group index: {e}")))?;
    if sm.version > SEGMENT_VERSION {
        return Err(Error::NewerFormat {
            what: "segment",
            found: sm.version,
            supported: SEGMENT_VERSION,
        });
    }
    if sm.groups.len() != md.num_row_groups() {
        return Err(Error::corrupt(
            "segment",
            name,
            "group index count differs from parquet row groups",
        ));
    }
    let mut groups = Vec::with_capacity(sm.groups.len());
    for (i, g) in sm.groups.iter().enumerate() {
        let rg_rows = md.row_group(i).num_rows() as u64;
        if g.rows != rg_rows || g.rows == 0 || g.rows as usize > GROUP_ROWS {
            return Err(Error::corrupt(
                "segment",
                name,
                "group index row count mismatch",
            ));
        }
        let first = (unhex(name, &g.first[0])?, unhex(name, &g.first[1])?);
        if let Some(prev) = groups.last().map(|p: &Group| &p.first) {
            if crate::row::key_cmp(&prev.0, &prev.1, &first.0, &first.1).is_ge() {
                return Err(Error::corrupt(
                    "segment",
                    name,
                    "group index out of key order",
                ));
            }
        }
        groups.push(Group {
            rows: g.rows as usize,
            first,
        });
    }
    Ok((sm.version, groups))
}

fn unhex(name: &str, s: &str) -> Result<Vec<u8>> {
    hex::decode(s).map_err(|_| Error::corrupt("segment", name, "group index key is not hex"))
}

fn col<'a, T: 'static>(name: &str, b: &'a RecordBatch, i: usize) -> Result<&'a T> {
    b.column(i)
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| Error::corrupt("segment", name, format!("column {i} has the wrong type")))
}

fn decode_batch(name: &str, b: &RecordBatch, out: &mut Vec<Row>) -> Result<()> {
    let parent = col::<BinaryArray>(name, b, 0)?;
    let names = col::<BinaryArray>(name, b, 1)?;
    let kind = col::<UInt8Array>(name, b, 2)?;
    let mode = col::<UInt32Array>(name, b, 3)?;
    let size = col::<UInt64Array>(name, b, 4)?;
    let mtime = col::<Int64Array>(name, b, 5)?;
    let digest = col::<FixedSizeBinaryArray>(name, b, 6)?;
    let locs = LocColumns::at(name, b, 7)?;
    let target = col::<BinaryArray>(name, b, 12)?;
    let first = col::<UInt64Array>(name, b, 13)?;
    let changed = col::<UInt64Array>(name, b, 14)?;
    let ino = col::<UInt64Array>(name, b, 15)?;
    let ctime = col::<Int64Array>(name, b, 16)?;
    let owner = match b.num_columns() > V1_COLUMNS {
        true => Some((
            col::<UInt32Array>(name, b, 17)?,
            col::<UInt32Array>(name, b, 18)?,
        )),
        false => None,
    };
    let meta = match b.num_columns() > V3_COLUMNS {
        true => Some(MetaColumns {
            link: col(name, b, 19)?,
            nlink: col(name, b, 20)?,
            rdev: col(name, b, 21)?,
            xattrs: col(name, b, 22)?,
        }),
        false => None,
    };
    let bad = |what: &str| Error::corrupt("segment", name, format!("invalid {what}"));
    for i in 0..b.num_rows() {
        let kind = Kind::from_code(kind.value(i)).ok_or_else(|| bad("kind"))?;
        let blob = locs.loc(i)?;
        let row = Row {
            parent: parent.value(i).to_vec(),
            name: names.value(i).to_vec(),
            kind,
            mode: mode.value(i),
            size: size.value(i),
            mtime_ns: mtime.value(i),
            digest: if digest.is_valid(i) {
                Some(fixed32(digest.value(i)).ok_or_else(|| bad("digest"))?)
            } else {
                None
            },
            blob,
            target: target.is_valid(i).then(|| target.value(i).to_vec()),
            first_gen: first.value(i),
            changed_gen: changed.value(i),
            ino: ino.value(i),
            ctime_ns: ctime.value(i),
            uid: owner.map_or(0, |o| o.0.value(i)),
            gid: owner.map_or(0, |o| o.1.value(i)),
            meta: match &meta {
                Some(m) => m.meta(name, i)?,
                None => None,
            },
        };
        check_row(name, &row)?;
        out.push(row);
    }
    Ok(())
}

/// The version 4 metadata columns of a batch.
struct MetaColumns<'a> {
    link: &'a UInt64Array,
    nlink: &'a UInt32Array,
    rdev: &'a UInt64Array,
    xattrs: &'a BinaryArray,
}

impl MetaColumns<'_> {
    fn meta(&self, name: &str, i: usize) -> Result<Option<Box<Meta>>> {
        let xattrs = match self.xattrs.is_valid(i) {
            true => self.xattrs.value(i).to_vec(),
            false => Vec::new(),
        };
        crate::format::xattrs::decode(&xattrs, name)?;
        Ok(Meta {
            link: self.link.value(i),
            nlink: self.nlink.value(i),
            rdev: self.rdev.value(i),
            xattrs,
        }
        .boxed())
    }
}

/// Columns a blob-reference scan decodes: digest, blob, pack, offset, stored_len, codec.
const BLOB_COLUMNS: [usize; 6] = [6, 7, 8, 9, 10, 11];

/// The five columns that locate a blob, starting at column `first`.
struct LocColumns<'a> {
    name: &'a str,
    blob: &'a UInt8Array,
    pack: &'a FixedSizeBinaryArray,
    offset: &'a UInt64Array,
    stored: &'a UInt64Array,
    codec: &'a UInt8Array,
}

impl<'a> LocColumns<'a> {
    fn at(name: &'a str, b: &'a RecordBatch, first: usize) -> Result<LocColumns<'a>> {
        Ok(LocColumns {
            name,
            blob: col(name, b, first)?,
            pack: col(name, b, first + 1)?,
            offset: col(name, b, first + 2)?,
            stored: col(name, b, first + 3)?,
            codec: col(name, b, first + 4)?,
        })
    }

    fn loc(&self, i: usize) -> Result<BlobLoc> {
        let bad = |what: &str| Error::corrupt("segment", self.name, format!("invalid {what}"));
        Ok(match self.blob.value(i) {
            0 => BlobLoc::None,
            1 => BlobLoc::Standalone,
            3 if self.pack.is_valid(i) => BlobLoc::Chunked {
                list: fixed32(self.pack.value(i)).ok_or_else(|| bad("chunk list digest"))?,
                data: self.stored.value(i),
            },
            2 if self.pack.is_valid(i) => BlobLoc::Packed {
                pack: fixed32(self.pack.value(i)).ok_or_else(|| bad("pack digest"))?,
                offset: self.offset.value(i),
                len: self.stored.value(i),
                codec: Codec::from_code(self.codec.value(i)).ok_or_else(|| bad("codec"))?,
            },
            _ => return Err(bad("blob location")),
        })
    }
}

fn decode_blob_refs(name: &str, b: &RecordBatch, out: &mut Vec<([u8; 32], BlobLoc)>) -> Result<()> {
    let digest = col::<FixedSizeBinaryArray>(name, b, 0)?;
    let locs = LocColumns::at(name, b, 1)?;
    for i in 0..b.num_rows() {
        let loc = locs.loc(i)?;
        if loc == BlobLoc::None || !digest.is_valid(i) {
            continue;
        }
        let d = fixed32(digest.value(i))
            .ok_or_else(|| Error::corrupt("segment", name, "invalid digest"))?;
        out.push((d, loc));
    }
    Ok(())
}

fn fixed32(s: &[u8]) -> Option<[u8; 32]> {
    s.try_into().ok()
}

/// Field-level consistency every stored row must have.
fn check_row(name: &str, row: &Row) -> Result<()> {
    let bad = |what: &str| {
        Error::corrupt(
            "segment",
            name,
            format!("row {what}: path=`{}`", crate::row::show(&row.path())),
        )
    };
    if row.name.len() > MAX_NAME || check_path_len(&row.parent).is_err() {
        return Err(bad("path over limit"));
    }
    let bad_name =
        row.name.contains(&b'/') || row.name.contains(&0) || row.name == b"." || row.name == b"..";
    if bad_name || row.parent.contains(&0) || (row.name.is_empty() && !row.parent.is_empty()) {
        return Err(bad("name invalid"));
    }
    if row.parent.len() + 1 + row.name.len() > crate::row::MAX_PATH {
        return Err(bad("path over limit"));
    }
    let consistent = match row.kind {
        Kind::File => {
            row.digest.is_some()
                && row.target.is_none()
                && (row.blob != BlobLoc::None || row.size == 0)
        }
        Kind::Symlink => row.target.is_some() && row.blob == BlobLoc::None,
        Kind::Dir | Kind::Tombstone => row.target.is_none() && row.blob == BlobLoc::None,
        Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => {
            row.target.is_none() && row.blob == BlobLoc::None && row.digest.is_none()
        }
    };
    if !consistent {
        return Err(bad("fields inconsistent with kind"));
    }
    Ok(())
}
