//! Malformed safetensors files, one per way a header can lie. Each must be refused with a
//! `Malformed` error naming the file, the tensor (where there is one) and the problem, without
//! panicking, reading out of bounds or allocating what the header claims.

use std::path::PathBuf;

use tf_checkpoint::safetensors::SafetensorsFile;
use tf_checkpoint::CheckpointError;

/// A file image: 8-byte little-endian header length, the header, the byte buffer.
fn image(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

struct Case {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn write(bytes: &[u8]) -> Case {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    std::fs::write(&path, bytes).unwrap();
    Case { _dir: dir, path }
}

/// Opens `bytes` and checks the refusal: `Malformed`, naming the file and containing every
/// fragment of `says`.
fn refused(bytes: &[u8], says: &[&str]) -> String {
    let case = write(bytes);
    let err = SafetensorsFile::open(&case.path).expect_err("must be refused");
    let msg = err.to_string();
    eprintln!("{msg}");
    match &err {
        CheckpointError::Malformed { path, format, .. } => {
            assert_eq!(path, &case.path, "{msg}");
            assert_eq!(*format, "safetensors", "{msg}");
        }
        other => panic!("want Malformed, got {other:?}"),
    }
    assert!(msg.contains(&*case.path.to_string_lossy()), "{msg}");
    for s in says {
        assert!(msg.contains(s), "`{s}` not in: {msg}");
    }
    msg
}

fn json_case(header: &str, data_len: usize, says: &[&str]) -> String {
    refused(&image(header.as_bytes(), &vec![0u8; data_len]), says)
}

#[test]
fn a_valid_image_opens() {
    // The builder itself is right: the same shape of file with consistent offsets opens.
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}}"#;
    let case = write(&image(h.as_bytes(), &[0u8; 10]));
    let f = SafetensorsFile::open(&case.path).unwrap();
    assert_eq!(f.tensors.len(), 2);
    assert_eq!(f.tensors[1].bytes().len(), 2);
    assert!(f.metadata.is_empty());
}

#[test]
fn shorter_than_the_length_prefix() {
    refused(&[], &["0 bytes", "8-byte header length"]);
    refused(&[1, 0, 0], &["3 bytes"]);
}

#[test]
fn header_length_2_pow_63() {
    let mut bytes = (1u64 << 63).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    refused(&bytes, &["header length 9223372036854775808", "past the end"]);
    refused(&u64::MAX.to_le_bytes(), &["header length 18446744073709551615", "past the end"]);
}

#[test]
fn header_length_past_the_file_end() {
    let mut bytes = 100u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}    ");
    refused(&bytes, &["header length 100", "past the end", "14 bytes"]);
}

#[test]
fn header_length_over_the_limit() {
    // A sparse file: the claimed header fits in the file but exceeds the 100 MB cap.
    let case = write(&(150_000_000u64).to_le_bytes());
    let f = std::fs::OpenOptions::new().write(true).open(&case.path).unwrap();
    f.set_len(150_000_100).unwrap();
    let msg = SafetensorsFile::open(&case.path).unwrap_err().to_string();
    assert!(msg.contains("header length 150000000 exceeds"), "{msg}");
}

#[test]
fn header_not_utf8() {
    refused(&image(b"{\"a\xff\":{}}", &[]), &["not UTF-8"]);
}

#[test]
fn header_not_json() {
    refused(&image(b"{\"a\": [1, 2", &[]), &["not a valid JSON object"]);
    refused(&image(b"[1, 2]", &[]), &["not a valid JSON object"]);
    refused(&image(b"{} trailing", &[]), &["not a valid JSON object"]);
}

#[test]
fn data_offsets_past_the_end() {
    let h = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    json_case(h, 12, &["tensor `w`", "[0, 16]", "past the end", "12 bytes"]);
    let far = r#"{"w":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551611,18446744073709551615]}}"#;
    json_case(far, 4, &["tensor `w`", "past the end"]);
}

#[test]
fn begin_after_end() {
    let h = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}}"#;
    json_case(h, 8, &["tensor `w`", "[8, 4]", "begin after end"]);
}

#[test]
fn overlapping_tensors() {
    let h = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
               "b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
    json_case(h, 16, &["`b`", "overlap", "`a`"]);
    // One range inside another, listed in the other order.
    let nested = r#"{"inner":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},
                    "outer":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}}"#;
    json_case(nested, 16, &["`inner`", "overlap", "`outer`"]);
    // Empty tensors may share an offset with anything.
    let empty = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                   "e":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]}}"#;
    let case = write(&image(empty.as_bytes(), &[0u8; 16]));
    assert!(SafetensorsFile::open(&case.path).is_ok());
}

#[test]
fn offsets_inconsistent_with_dtype_and_shape() {
    let h = r#"{"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}}"#;
    json_case(h, 16, &["tensor `w`", "8 bytes", "BF16", "[3, 2]", "needs 12"]);
}

#[test]
fn shape_product_overflows() {
    let h = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16]}}"#;
    json_case(h, 16, &["tensor `w`", "overflows"]);
    let h = r#"{"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,16]}}"#;
    json_case(h, 16, &["tensor `w`", "overflows"]);
}

#[test]
fn unknown_dtype() {
    let h = r#"{"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}"#;
    json_case(h, 4, &["tensor `w`", "unknown or unsupported dtype \"F8_E4M3\""]);
}

#[test]
fn bad_entries() {
    let neg = r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#;
    json_case(neg, 4, &["tensor `w`", "-1"]);
    let missing = r#"{"w":{"dtype":"F32","shape":[1]}}"#;
    json_case(missing, 4, &["tensor `w`", "data_offsets"]);
    let not_obj = r#"{"w":[1,2,3]}"#;
    json_case(not_obj, 0, &["tensor `w`"]);
    let three = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#;
    json_case(three, 8, &["tensor `w`"]);
}

#[test]
fn duplicate_tensor_in_one_header() {
    let h = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
               "w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    json_case(h, 2, &["key `w` appears twice"]);
}

#[test]
fn metadata_must_map_strings_to_strings() {
    let h = r#"{"__metadata__":{"format":"pt","n":3}}"#;
    json_case(h, 0, &["`__metadata__` key `n`", "not a string"]);
    json_case(r#"{"__metadata__":"mlx"}"#, 0, &["`__metadata__` is not an object"]);
}

#[test]
fn huge_claims_do_not_allocate() {
    // A 1 GiB-per-element claim backed by a few bytes: refused from arithmetic alone.
    let h = r#"{"w":{"dtype":"F32","shape":[268435456,1024],"data_offsets":[0,1099511627776]}}"#;
    json_case(h, 4, &["tensor `w`", "past the end"]);
}
