//! Encodings are pinned (golden values) and every parser of stored bytes
//! turns damage into a typed error, never a panic.

mod common;

use strata::format::{journal, manifest::Manifest, pack, rowcodec, segment::Segment};
use strata::identity::IdentityHasher;
use strata::row::{BlobLoc, Codec, Kind, Row};
use strata::Error;

fn sample_rows() -> Vec<Row> {
    let mut dir = Row::tombstone(Vec::new(), b"docs".to_vec());
    dir.kind = Kind::Dir;
    dir.mode = 0o755;
    let mut file = Row::tombstone(b"docs".to_vec(), b"a\xff.txt".to_vec());
    file.kind = Kind::File;
    file.mode = 0o644;
    file.size = 5;
    file.digest = Some(*blake3::hash(b"hello").as_bytes());
    file.blob = BlobLoc::Packed {
        pack: [7; 32],
        offset: 16,
        len: 5,
        codec: Codec::Raw,
    };
    file.mtime_ns = 1_700_000_000_123_456_789;
    file.first_gen = 1;
    file.changed_gen = 2;
    file.ino = 42;
    file.ctime_ns = 1_700_000_000_000_000_001;
    file.uid = 1000;
    file.gid = 100;
    let mut link = Row::tombstone(b"docs".to_vec(), b"link".to_vec());
    link.kind = Kind::Symlink;
    link.mode = 0o777;
    link.size = 7;
    link.target = Some(b"a\xff.txt".to_vec());
    vec![dir, file, link]
}

/// `sample_rows` with a linked file carrying attributes, a FIFO and a
/// device (segment and journal version 4), in key order.
fn rows_with_meta() -> Vec<Row> {
    let [dir, mut file, link]: [Row; 3] = sample_rows().try_into().unwrap();
    file.meta = strata::row::Meta {
        link: 0x1234_5679,
        nlink: 2,
        rdev: 0,
        xattrs: strata::format::xattrs::encode(vec![
            (b"user.a".to_vec(), b"1".to_vec()),
            (b"system.posix_acl_access".to_vec(), vec![2, 0, 0, 0]),
        ])
        .unwrap(),
    }
    .boxed();
    let mut fifo = Row::tombstone(b"docs".to_vec(), b"fifo".to_vec());
    fifo.kind = Kind::Fifo;
    fifo.mode = 0o600;
    let mut dev = Row::tombstone(b"docs".to_vec(), b"tty".to_vec());
    dev.kind = Kind::CharDev;
    dev.mode = 0o620;
    dev.meta = strata::row::Meta {
        rdev: 0x8801,
        ..Default::default()
    }
    .boxed();
    vec![dir, file, fifo, link, dev]
}

#[test]
fn segment_columns_keep_their_codecs_and_read_back() {
    use parquet::basic::Compression;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let t = tempfile::tempdir().unwrap();
    let mut writer = strata::format::segment::SegmentWriter::new(t.path()).unwrap();
    for row in rows_with_meta() {
        writer.push(row).unwrap();
    }
    let file = writer.finish().unwrap().remove(0);
    let bytes = std::fs::read(&file.path).unwrap();
    let reader = SerializedFileReader::new(bytes::Bytes::from(bytes.clone())).unwrap();
    let zstd = [
        "name",
        "size",
        "mtime_ns",
        "offset",
        "stored_len",
        "ino",
        "ctime_ns",
        "xattrs",
    ];
    for chunk in reader.metadata().row_group(0).columns() {
        let column = chunk.column_path().string();
        let compressed = !matches!(chunk.compression(), Compression::UNCOMPRESSED);
        assert_eq!(compressed, zstd.contains(&column.as_str()), "{column}");
    }
    let segment = Segment::parse(&file.name, bytes).unwrap();
    assert_eq!(segment.read_group(0).unwrap(), rows_with_meta());
}

#[test]
fn identity_encoding_is_pinned() {
    let mut h = IdentityHasher::new();
    for r in &sample_rows() {
        h.push(r);
    }
    assert_eq!(h.finish(), GOLDEN_IDENTITY, "rows without metadata");
    let mut h = IdentityHasher::new();
    for r in &rows_with_meta() {
        h.push(r);
    }
    assert_eq!(h.finish(), GOLDEN_IDENTITY_META);
}

#[test]
fn row_record_encoding_is_pinned_and_round_trips() {
    let rows = sample_rows();
    let mut buf = Vec::new();
    rowcodec::encode(&rows[1], &mut buf);
    assert_eq!(
        hex::encode(blake3::hash(&buf).as_bytes()),
        GOLDEN_ROW_RECORD
    );
    assert_eq!(rowcodec::decode(&buf, "golden").unwrap(), rows[1]);
    for cut in 0..buf.len() {
        assert!(
            matches!(
                rowcodec::decode(&buf[..cut], "t"),
                Err(Error::Corrupt { .. })
            ),
            "truncated at {cut}"
        );
    }
    let mut long = buf.clone();
    long.push(0);
    assert!(matches!(
        rowcodec::decode(&long, "t"),
        Err(Error::Corrupt { .. })
    ));
    // With the metadata tail (version 4): cut anywhere, it fails or (cut
    // exactly before the tail) decodes as a different row; the journal's
    // framing and seal are what catch such a cut.
    let with = &rows_with_meta()[1];
    let mut buf = Vec::new();
    rowcodec::encode(with, &mut buf);
    assert_eq!(
        hex::encode(blake3::hash(&buf).as_bytes()),
        GOLDEN_ROW_RECORD_META
    );
    assert_eq!(&rowcodec::decode(&buf, "golden").unwrap(), with);
    for cut in 0..buf.len() {
        match rowcodec::decode(&buf[..cut], "t") {
            Err(Error::Corrupt { .. }) => {}
            Ok(r) => assert!(r.meta.is_none() && &r != with, "cut at {cut}"),
            Err(e) => panic!("cut at {cut}: {e}"),
        }
    }
}

#[test]
fn journal_seal_catches_any_damage() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("j");
    let good = common::sealed_journal(&path, &sample_rows());
    let mut r = journal::JournalReader::open(&path).unwrap();
    let mut n = 0;
    while r.next_row().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 3);
    for i in (0..good.len()).step_by(7) {
        let mut bad = good.clone();
        bad[i] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert!(
            matches!(
                journal::JournalReader::open(&path),
                Err(Error::Corrupt { .. })
            ),
            "flip at {i}"
        );
    }
    std::fs::write(&path, &good[..good.len() - 10]).unwrap();
    assert!(matches!(
        journal::JournalReader::open(&path),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn pack_parser_refuses_damage_by_digest_and_structure() {
    let t = tempfile::tempdir().unwrap();
    let mut w = pack::PackWriter::create(t.path()).unwrap();
    w.append([1; 32], Codec::Raw, 5, b"hello").unwrap();
    let sealed = w.seal().unwrap();
    let bytes = std::fs::read(&sealed.path).unwrap();
    assert_eq!(pack::parse(&sealed.name, &bytes).unwrap().len(), 1);
    let mut bad = bytes.clone();
    bad[20] ^= 1;
    assert!(matches!(
        pack::parse(&sealed.name, &bad),
        Err(Error::Corrupt { .. })
    ));
    for cut in [0, 8, 16, bytes.len() - 1] {
        let b = &bytes[..cut];
        let name = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b));
        assert!(
            matches!(pack::parse(&name, b), Err(Error::Corrupt { .. })),
            "cut {cut}"
        );
    }
}

#[test]
fn segment_and_manifest_parsers_never_panic_on_garbage() {
    let mut seed = 1u64;
    for len in [0usize, 1, 4, 8, 12, 100, 4096] {
        for _ in 0..20 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 33) as u8
                })
                .collect();
            let mut framed = bytes.clone();
            if len >= 12 {
                framed[..4].copy_from_slice(b"PAR1");
                framed[len - 4..].copy_from_slice(b"PAR1");
            }
            for b in [&bytes, &framed] {
                let name = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b));
                assert!(Segment::parse(&name, b.to_vec()).is_err());
                assert!(matches!(
                    Manifest::decode(&name, b),
                    Err(Error::Corrupt { .. })
                ));
            }
        }
    }
}

const GOLDEN_IDENTITY: &str = "af0c5c67e343e860819ed3ec82f9064b7437e6c2c48922bbc699b39b5910c3b4";
const GOLDEN_ROW_RECORD: &str = "744067e4b358a661d8b2a3d5cde8c1751d1404dbe9f791167f64092b0b892745";
const GOLDEN_IDENTITY_META: &str =
    "09eaa0480c3f5fdec6590a361b66c1ef00d2625ebee22b5eebcfd9d32aea912f";
const GOLDEN_ROW_RECORD_META: &str =
    "3ce5ef3a6fec924710d635b76e669e748553d146b50dbff53f2e56bc63496be9";
