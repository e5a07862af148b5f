//! Malformed GGUF files: each defect gives `CheckpointError::Malformed` naming the file, the
//! key or tensor, and the problem; none panics, reads out of bounds or allocates what the
//! header claims. Byte images are built here (gguf_common) and written to temp files.

mod gguf_common;

use std::os::unix::fs::FileExt;

use gguf_common::*;
use tf_checkpoint::gguf::GgufFile;
use tf_checkpoint::CheckpointError;

/// Opens `bytes` as a GGUF file and returns the Malformed message, checking it names the file.
fn malformed(bytes: &[u8]) -> String {
    let f = write_bytes(bytes);
    match GgufFile::open(f.path()) {
        Err(CheckpointError::Malformed { path, format, what }) => {
            assert_eq!(path, f.path());
            assert_eq!(format, "GGUF");
            let shown = CheckpointError::Malformed { path, format, what: what.clone() }.to_string();
            assert!(shown.contains(&f.path().display().to_string()), "{shown}");
            what
        }
        Err(e) => panic!("expected Malformed, got {e}"),
        Ok(_) => panic!("expected Malformed, file opened"),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

fn one_tensor() -> Gguf {
    Gguf::default().kv("general.architecture", s("llama")).tensor("a.weight", &[32, 2], F32)
}

#[test]
fn well_formed_image_opens() {
    let f = one_tensor().write();
    let g = GgufFile::open(f.path()).unwrap();
    assert_eq!(g.tensors.len(), 1);
    assert_eq!(g.tensors[0].shape, vec![2, 32]);
    assert_eq!(g.tensors[0].len, Some(256));
    assert_eq!(g.tensors[0].offset % 32, 0);
    assert_eq!(g.tensor_view("a.weight").unwrap().bytes().len(), 256);
}

/// The image and the offset of its data section.
fn mini_image() -> (Vec<u8>, usize) {
    let img = mini_model("llama").bytes();
    let f = write_bytes(&img);
    let data = GgufFile::open(f.path()).unwrap().data_offset;
    (img, data)
}

#[test]
fn every_truncation_is_refused() {
    let (img, data_offset) = mini_image();
    // Every cut point inside the header, and a spread of them inside the data.
    let cuts = (0..data_offset).chain((data_offset..img.len()).step_by(97));
    for cut in cuts {
        let msg = malformed(&img[..cut]);
        assert!(
            msg.contains("truncated") || msg.contains("past the end") || msg.contains("cannot fit"),
            "cut {cut}: {msg}"
        );
    }
    let key = b"tokenizer.chat_template";
    let key_cut = img.windows(key.len()).position(|w| w == key).unwrap() + 10;
    assert_has(
        &malformed(&img[..key_cut]),
        &["truncated", "string of 23 bytes in key of metadata entry 15"],
    );
}

#[test]
fn truncated_value_names_the_key() {
    let img = Gguf::default().kv("general.name", s("a long enough name")).bytes();
    let cut = img.windows(6).position(|w| w == b"a long").unwrap() + 3;
    assert_has(
        &malformed(&img[..cut]),
        &["truncated", "string of 18 bytes in metadata key `general.name`"],
    );
}

#[test]
fn tensor_offset_past_the_end() {
    let img = one_tensor().tensor_at("b.weight", &[32], F32, 1 << 40).bytes();
    assert_has(&malformed(&img), &["tensor `b.weight`", "past the end of the file"]);
    let img = one_tensor().tensor_at("b.weight", &[32], F32, 256).bytes();
    assert_has(&malformed(&img), &["tensor `b.weight`", "runs past the end of the file"]);
}

#[test]
fn string_length_past_the_end() {
    let mut raw = (1u64 << 40).to_le_bytes().to_vec();
    raw.extend(b"abc");
    let img = Gguf::default().kv("general.name", Val::Raw(8, raw)).bytes();
    assert_has(
        &malformed(&img),
        &["metadata key `general.name`", "truncated", "1099511627776 bytes"],
    );
    let mut img = one_tensor().bytes();
    // The tensor name's length field sits right after the metadata.
    let at = img.windows(8).position(|w| w == b"a.weight").unwrap() - 8;
    img[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_has(&malformed(&img), &["name of tensor info 0", "truncated"]);
}

#[test]
fn array_count_huge() {
    let mut raw = 4u32.to_le_bytes().to_vec(); // u32 elements
    raw.extend((1u64 << 60).to_le_bytes());
    let img = Gguf::default().kv("tokenizer.ggml.scores", Val::Raw(9, raw)).bytes();
    assert_has(
        &malformed(&img),
        &["metadata key `tokenizer.ggml.scores`", "array of 1152921504606846976 u32", "cannot fit"],
    );
    let mut raw = 8u32.to_le_bytes().to_vec(); // strings: 8 bytes each at least
    raw.extend(u64::MAX.to_le_bytes());
    let img = Gguf::default().kv("tokenizer.ggml.tokens", Val::Raw(9, raw)).bytes();
    assert_has(&malformed(&img), &["tokenizer.ggml.tokens", "cannot fit"]);
}

#[test]
fn shape_overflowing_usize() {
    let img = Gguf::default().tensor_at("big", &[1 << 32, 1 << 32, 1 << 32], F32, 0).bytes();
    assert_has(&malformed(&img), &["tensor `big`", "more elements than usize"]);
    let img = Gguf::default().tensor_at("big", &[1 << 62], F32, 0).bytes();
    assert_has(&malformed(&img), &["tensor `big`", "overflows usize"]);
    let img = Gguf::default().tensor_at("neg", &[u64::MAX], F32, 0).bytes();
    assert_has(&malformed(&img), &["tensor `neg`", "do not fit"]);
}

#[test]
fn too_many_dims() {
    let img = Gguf::default().tensor_at("t5", &[1, 1, 1, 1, 1], F32, 0).bytes();
    assert_has(&malformed(&img), &["tensor `t5`", "n_dims 5"]);
}

#[test]
fn duplicate_tensor_names() {
    let img = one_tensor().tensor("a.weight", &[32], F32).bytes();
    assert_has(&malformed(&img), &["tensor `a.weight`", "duplicate tensor name"]);
}

#[test]
fn duplicate_metadata_keys() {
    let img = Gguf::default().kv("general.name", s("a")).kv("general.name", s("b")).bytes();
    assert_has(&malformed(&img), &["metadata key `general.name`", "duplicate"]);
}

#[test]
fn overlapping_tensor_data() {
    let img = one_tensor().tensor_at("b.weight", &[8], F32, 224).bytes();
    assert_has(&malformed(&img), &["`a.weight`", "`b.weight`", "overlap"]);
    // Touching ranges are fine.
    let f = one_tensor().tensor("b.weight", &[32], F32).write();
    let file = GgufFile::open(f.path()).unwrap();
    assert_eq!(file.tensors[1].offset, file.tensors[0].offset + 256);
}

#[test]
fn misaligned_offset() {
    let img = one_tensor().tensor_at("b.weight", &[1], F32, 260).bytes();
    assert_has(
        &malformed(&img),
        &["tensor `b.weight`", "offset 260", "multiple of the alignment 32"],
    );
}

#[test]
fn header_counts_of_two_to_the_63() {
    let mut img = one_tensor().bytes();
    img[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
    assert_has(&malformed(&img), &["9223372036854775808 tensors", "cannot fit"]);
    let mut img = one_tensor().bytes();
    img[16..24].copy_from_slice(&(1u64 << 63).to_le_bytes());
    assert_has(&malformed(&img), &["9223372036854775808 metadata entries", "cannot fit"]);
}

#[test]
fn versions_and_magic() {
    let mut g = one_tensor();
    g.version = 1;
    assert_has(&malformed(&g.bytes()), &["version 1", "not supported"]);
    g.version = 4;
    assert_has(&malformed(&g.bytes()), &["version 4", "not supported"]);
    g.version = 3u32.swap_bytes();
    assert_has(&malformed(&g.bytes()), &["big-endian"]);
    let mut img = one_tensor().bytes();
    img[0] = b'g';
    assert_has(&malformed(&img), &["bad magic", "not a GGUF file"]);
    assert_has(&malformed(&[]), &["truncated", "magic"]);
}

#[test]
fn bad_alignment() {
    let img = one_tensor().kv("general.alignment", Val::U32(24)).bytes();
    assert_has(&malformed(&img), &["general.alignment", "24 is not a power of two"]);
    let img = one_tensor().kv("general.alignment", Val::U32(0)).bytes();
    assert_has(&malformed(&img), &["general.alignment", "0 is not a power of two"]);
    let img = one_tensor().kv("general.alignment", Val::U64(32)).bytes();
    assert_has(&malformed(&img), &["general.alignment", "expected u32, found u64"]);
}

#[test]
fn custom_alignment_is_honoured() {
    let mut g = Gguf::default()
        .kv("general.alignment", Val::U32(256))
        .tensor("a.weight", &[32], F32)
        .tensor("b.weight", &[8], F32);
    g.alignment = 256;
    let f = g.write();
    let file = GgufFile::open(f.path()).unwrap();
    assert_eq!(file.alignment, 256);
    assert_eq!(file.data_offset % 256, 0);
    // a.weight holds 128 bytes; b.weight starts at the next multiple of 256.
    assert_eq!(file.tensors[1].offset - file.data_offset, 256);
    // An offset aligned to 32 but not 256 is refused under alignment 256.
    let mut g = Gguf::default()
        .kv("general.alignment", Val::U32(256))
        .tensor("a.weight", &[32], F32)
        .tensor_at("b.weight", &[8], F32, 128);
    g.alignment = 256;
    assert_has(&malformed(&g.bytes()), &["tensor `b.weight`", "multiple of the alignment 256"]);
}

#[test]
fn bad_values() {
    let img = Gguf::default().kv("x.t", Val::Raw(13, vec![0; 8])).bytes();
    assert_has(&malformed(&img), &["metadata key `x.t`", "unknown value type 13"]);
    let img = Gguf::default()
        .kv("x.a", Val::Raw(9, [77u32.to_le_bytes().as_slice(), &0u64.to_le_bytes()].concat()))
        .bytes();
    assert_has(&malformed(&img), &["metadata key `x.a`", "unknown array element type 77"]);
    let img = Gguf::default().kv("x.b", Val::Raw(7, vec![2])).bytes();
    assert_has(&malformed(&img), &["metadata key `x.b`", "bool byte is 2"]);
    let img = Gguf::default()
        .kv("x.s", Val::Raw(8, [2u64.to_le_bytes().as_slice(), &[0xC3, 0x28]].concat()))
        .bytes();
    assert_has(&malformed(&img), &["metadata key `x.s`", "not UTF-8"]);
    let mut nested = Val::Arr(4, vec![Val::U32(1)]);
    for _ in 1..tf_checkpoint::gguf::MAX_ARRAY_DEPTH {
        nested = Val::Arr(9, vec![nested]);
    }
    // MAX_ARRAY_DEPTH levels of arrays are read; one more is refused.
    assert!(GgufFile::open(Gguf::default().kv("x.n", nested.clone()).write().path()).is_ok());
    let img = Gguf::default().kv("x.n", Val::Arr(9, vec![nested])).bytes();
    assert_has(&malformed(&img), &["metadata key `x.n`", "nested deeper than 8"]);
}

#[test]
fn partial_blocks_are_refused() {
    let img = Gguf::default().tensor_at("q", &[48, 2], Q8_0, 0).bytes();
    assert_has(&malformed(&img), &["tensor `q`", "row of 48 elements", "Q8_0 blocks of 32"]);
}

#[test]
fn random_corruption_never_panics() {
    let (img, header_len) = mini_image();
    let f = write_bytes(&img);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut errors = 0;
    for _ in 0..1500 {
        let mut bad = img.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % header_len;
            bad[at] = next() as u8;
        }
        // Only the header changes: rewrite it in place (the data stays as written).
        f.as_file().write_all_at(&bad[..header_len], 0).unwrap();
        // Ok or Err are both acceptable; a panic fails the test.
        if let Err(e) = tf_checkpoint::Checkpoint::open(f.path()) {
            assert!(!e.to_string().is_empty());
            errors += 1;
        }
    }
    assert!(errors > 0, "corruption must be detected at least sometimes");
}
