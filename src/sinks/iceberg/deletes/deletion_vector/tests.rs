//! Unit tests of the `deletion-vector-v1` codec on hand-built bytes (the Iceberg-Java fixture is
//! checked in `puffin/tests.rs`).

use super::*;

/// Frames `vector` (the portable bitmap) as a blob: BE length of magic + vector, magic, vector,
/// BE CRC-32 of magic + vector.
fn frame(vector: &[u8]) -> Vec<u8> {
    let mut content = MAGIC.to_vec();
    content.extend_from_slice(vector);
    let mut blob = (content.len() as u32).to_be_bytes().to_vec();
    blob.extend_from_slice(&content);
    blob.extend_from_slice(&crc32fast::hash(&content).to_be_bytes());
    blob
}

/// Standard-format 32-bit bitmap with one array container (key 0) holding `values`.
fn array_bitmap(values: &[u16]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&12346u32.to_le_bytes()); // SERIAL_COOKIE_NO_RUNCONTAINER
    b.extend_from_slice(&1u32.to_le_bytes()); // one container
    b.extend_from_slice(&0u16.to_le_bytes()); // container key
    b.extend_from_slice(&(values.len() as u16 - 1).to_le_bytes()); // cardinality - 1
    b.extend_from_slice(&16u32.to_le_bytes()); // offset of the container: after this 16-byte header
    for v in values {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

#[test]
fn crc_is_iso_hdlc_like_java_util_zip() {
    // The CRC-32/ISO-HDLC check value (java.util.zip.CRC32 of "123456789").
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
}

#[test]
fn blob_matches_hand_built_spec_layout() {
    let dv = DeletionVector::from_positions([15, 3, 7, 8, 9, 8]).unwrap();
    let mut vector = 1u64.to_le_bytes().to_vec(); // one 32-bit bitmap
    vector.extend_from_slice(&0u32.to_le_bytes()); // its key
    vector.extend_from_slice(&array_bitmap(&[3, 7, 8, 9, 15]));
    let expected = frame(&vector);
    assert_eq!(&expected[..8], &[0, 0, 0, 0x2a, 0xD1, 0xD3, 0x39, 0x64]);
    assert_eq!(dv.serialize_blob().unwrap(), expected);
    assert_eq!(DeletionVector::deserialize_blob(&expected).unwrap(), dv);
}

#[test]
fn roaring_treemap_layout_is_the_portable_one() {
    // What roaring-rs writes is the portable layout, also across keys (sparse: key 2 only).
    for positions in [
        vec![1, 2, 70_000, 4_000_000_000],
        vec![(2u64 << 32) + 5, 3 << 33],
    ] {
        let dv = DeletionVector::from_positions(positions).unwrap();
        let mut rs = Vec::new();
        dv.positions.serialize_into(&mut rs).unwrap();
        assert_eq!(frame(&rs), dv.serialize_blob().unwrap());
    }
    let high = DeletionVector::from_positions([(2u64 << 32) + 5]).unwrap();
    let ours = high.serialize_blob().unwrap();
    assert_eq!(&ours[8..16], &1u64.to_le_bytes());
    assert_eq!(&ours[16..20], &2u32.to_le_bytes());

    // Java's dense form (empty bitmaps for keys 0 and 1) reads back to the same set.
    let empty_bitmap = [0x3A, 0x30, 0, 0, 0, 0, 0, 0];
    let mut dense = 3u64.to_le_bytes().to_vec();
    for key in 0u32..2 {
        dense.extend_from_slice(&key.to_le_bytes());
        dense.extend_from_slice(&empty_bitmap);
    }
    dense.extend_from_slice(&ours[16..ours.len() - 4]);
    assert_eq!(
        DeletionVector::deserialize_blob(&frame(&dense)).unwrap(),
        high
    );
}

#[test]
fn empty_vector() {
    let dv = DeletionVector::new();
    let blob = dv.serialize_blob().unwrap();
    assert_eq!(blob, frame(&0u64.to_le_bytes()));
    assert_eq!(blob.len(), 4 + 4 + 8 + 4);
    let back = DeletionVector::deserialize_blob(&blob).unwrap();
    assert!(back.is_empty());
    assert_eq!(back.cardinality(), 0);
}

#[test]
fn containers_are_run_length_encoded_like_java() {
    // 10_000 consecutive positions: one run (6 bytes) beats a bitmap (8 KiB).
    let run = DeletionVector::from_positions(0..10_000).unwrap();
    let blob = run.serialize_blob().unwrap();
    assert_eq!(
        &blob[20..22],
        &12347u16.to_le_bytes(),
        "SERIAL_COOKIE: has run containers"
    );
    assert_eq!(blob.len(), 4 + 4 + 8 + 4 + (4 + 1) + 4 + (2 + 4) + 4);
    // 5_000 even positions: a bitmap container, no run beats it.
    let evens = DeletionVector::from_positions((0..5_000).map(|i| i * 2)).unwrap();
    let blob = evens.serialize_blob().unwrap();
    assert_eq!(&blob[20..24], &12346u32.to_le_bytes());
    assert_eq!(blob.len(), 4 + 4 + 8 + 4 + 8 + 4 + 4 + 8192 + 4);
    // Array vs run at the margin: 2 runs of 2 (4 values = 8 bytes) vs 2 + 2*4 = 10: array.
    let margin = DeletionVector::from_positions([1, 2, 10, 11]).unwrap();
    assert_eq!(
        &margin.serialize_blob().unwrap()[20..24],
        &12346u32.to_le_bytes()
    );
    // 3 runs of 4: array 24 bytes vs run 14: run.
    let runs =
        DeletionVector::from_positions([1, 2, 3, 4, 10, 11, 12, 13, 20, 21, 22, 23]).unwrap();
    assert_eq!(
        &runs.serialize_blob().unwrap()[20..22],
        &12347u16.to_le_bytes()
    );
}

#[test]
fn reencoding_a_decoded_vector_is_stable() {
    let mut dv = DeletionVector::from_positions((0..3_000).chain([5_000_000, 1 << 33])).unwrap();
    dv.merge(&DeletionVector::from_positions((10_000..20_000).step_by(3)).unwrap());
    let blob = dv.serialize_blob().unwrap();
    let back = DeletionVector::deserialize_blob(&blob).unwrap();
    assert_eq!(back, dv);
    assert_eq!(back.serialize_blob().unwrap(), blob);
}

#[test]
fn set_operations() {
    let mut a = DeletionVector::from_positions([1, 5, 9]).unwrap();
    let b = DeletionVector::from_positions([5, 6, (3u64 << 32) + 1]).unwrap();
    assert!(a.contains(5) && !a.contains(6));
    assert!(!a.insert(5).unwrap());
    assert!(a.insert(2).unwrap());
    a.merge(&b);
    assert_eq!(a.cardinality(), 6);
    assert_eq!(
        a.iter().collect::<Vec<_>>(),
        vec![1, 2, 5, 6, 9, (3u64 << 32) + 1]
    );
    assert_eq!((&a).into_iter().count(), 6);
}

#[test]
fn position_limit_is_javas() {
    let mut dv = DeletionVector::new();
    assert!(dv.insert(MAX_POSITION).unwrap());
    assert_eq!(
        dv.insert(MAX_POSITION + 1),
        Err(DeletionVectorError::PositionOutOfRange {
            position: MAX_POSITION + 1
        })
    );
    assert_eq!(
        dv.insert(u64::MAX).unwrap_err().kind(),
        "deletion_vector_limit"
    );
    let blob = dv.serialize_blob().unwrap();
    assert_eq!(DeletionVector::deserialize_blob(&blob).unwrap(), dv);
}

#[test]
fn malformed_blobs_are_typed_errors() {
    let good = DeletionVector::from_positions([3, 7, 8, 9, 15])
        .unwrap()
        .serialize_blob()
        .unwrap();
    for len in 0..FRAME_BYTES {
        assert_eq!(
            DeletionVector::deserialize_blob(&good[..len]),
            Err(DeletionVectorError::Truncated { len })
        );
    }
    assert!(matches!(
        DeletionVector::deserialize_blob(&good[..good.len() - 1]),
        Err(DeletionVectorError::LengthMismatch {
            declared: 42,
            actual: 41,
            ..
        })
    ));
    let mut longer = good.clone();
    longer.push(0);
    assert!(matches!(
        DeletionVector::deserialize_blob(&longer),
        Err(DeletionVectorError::LengthMismatch { .. })
    ));

    let mut magic = good.clone();
    magic[4] = 0xD2;
    assert!(matches!(
        DeletionVector::deserialize_blob(&magic),
        Err(DeletionVectorError::BadMagic {
            found: [0xD2, 0xD3, 0x39, 0x64]
        })
    ));

    let mut crc = good.clone();
    let last = crc.len() - 1;
    crc[last] ^= 1;
    assert!(matches!(
        DeletionVector::deserialize_blob(&crc),
        Err(DeletionVectorError::CrcMismatch { .. })
    ));
    let mut body = good.clone();
    body[30] ^= 0x40;
    assert_eq!(
        DeletionVector::deserialize_blob(&body).unwrap_err().kind(),
        "deletion_vector_corrupt"
    );
}

#[test]
fn malformed_vectors_with_valid_crc_are_rejected() {
    let bitmap = array_bitmap(&[1, 2]);
    let with = |count: u64, keys: &[u32], trailing: &[u8]| {
        let mut v = count.to_le_bytes().to_vec();
        for k in keys {
            v.extend_from_slice(&k.to_le_bytes());
            v.extend_from_slice(&bitmap);
        }
        v.extend_from_slice(trailing);
        DeletionVector::deserialize_blob(&frame(&v))
    };
    assert!(with(2, &[0, 1], &[]).is_ok());
    let reason = |r: Result<DeletionVector, DeletionVectorError>| match r {
        Err(DeletionVectorError::Bitmap { reason, .. }) => reason,
        other => panic!("expected a bitmap error, got {other:?}"),
    };
    assert!(reason(with(2, &[1, 0], &[])).contains("not above"));
    assert!(reason(with(2, &[1, 1], &[])).contains("not above"));
    assert!(reason(with(1, &[i32::MAX as u32], &[])).contains("above"));
    assert!(reason(with(1, &[0], &[0])).contains("after the last bitmap"));
    assert!(reason(with(3, &[0, 1], &[])).contains("truncated bitmap key"));
    assert!(reason(with(u64::MAX, &[0], &[])).contains("does not fit"));
    assert!(reason(DeletionVector::deserialize_blob(&frame(&[1, 0, 0]))).contains("count"));
    // A bitmap with an unknown cookie.
    let mut v = 1u64.to_le_bytes().to_vec();
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&[9; 12]);
    assert!(reason(DeletionVector::deserialize_blob(&frame(&v))).contains("key 0"));
}

#[test]
fn no_panic_on_any_truncation_or_byte_flip() {
    let dv = DeletionVector::from_positions((0..100).chain(200..5_000).chain([1 << 32])).unwrap();
    let good = dv.serialize_blob().unwrap();
    for len in 0..good.len() {
        assert!(DeletionVector::deserialize_blob(&good[..len]).is_err());
    }
    // Re-frame every corrupted vector with a valid length and CRC, so the bitmap parser sees it.
    let vector = &good[8..good.len() - 4];
    for i in 0..vector.len().min(400) {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut v = vector.to_vec();
            v[i] ^= flip;
            let _ = DeletionVector::deserialize_blob(&frame(&v));
        }
    }
}
