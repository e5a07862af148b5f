//! The reader against a file written by the `safetensors` package's own serializer
//! (`tests/fixtures/hf/gen_fixtures.py`): every dtype, a scalar, an empty tensor and
//! `__metadata__`, with values stated in `expected.json` by the script. Plus robustness: no
//! truncation or single-byte corruption of that file may panic.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::Value;
use tf_checkpoint::safetensors::{open_single, SafetensorsFile};
use tf_checkpoint::{DType, TensorData, TensorFormat, TensorView};

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/tiny")
}

/// Element `i` of a plain tensor as f64 (ints and bools too), decoded here from the bytes.
fn element(t: &TensorView, i: usize) -> f64 {
    let TensorFormat::Plain(d) = t.format else { panic!("{} is not plain", t.name) };
    let b = &t.bytes()[i * d.size()..(i + 1) * d.size()];
    let a2 = || [b[0], b[1]];
    let a4 = || [b[0], b[1], b[2], b[3]];
    let a8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match d {
        DType::Bool => f64::from(b[0]),
        DType::U8 => f64::from(b[0]),
        DType::I8 => f64::from(b[0] as i8),
        DType::U16 => f64::from(u16::from_le_bytes(a2())),
        DType::I16 => f64::from(i16::from_le_bytes(a2())),
        DType::F16 => f16::from_le_bytes(a2()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(a2()).to_f64(),
        DType::U32 => f64::from(u32::from_le_bytes(a4())),
        DType::I32 => f64::from(i32::from_le_bytes(a4())),
        DType::F32 => f64::from(f32::from_le_bytes(a4())),
        DType::U64 => u64::from_le_bytes(a8()) as f64,
        DType::I64 => i64::from_le_bytes(a8()) as f64,
        DType::F64 => f64::from_le_bytes(a8()),
    }
}

#[test]
fn reads_every_dtype_written_by_the_reference_serializer() {
    let file = SafetensorsFile::open(&tiny().join("model.safetensors")).expect("opens");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny().join("expected.json")).unwrap())
            .unwrap();
    assert_eq!(file.metadata.get("format").map(String::as_str), Some("mlx"));
    let tensors = want["tensors"].as_object().unwrap();
    assert_eq!(file.tensors.len(), tensors.len());
    let dtypes = [
        ("f32", DType::F32),
        ("f64", DType::F64),
        ("f16", DType::F16),
        ("bf16", DType::BF16),
        ("i8", DType::I8),
        ("u8", DType::U8),
        ("i16", DType::I16),
        ("u16", DType::U16),
        ("i32", DType::I32),
        ("u32", DType::U32),
        ("i64", DType::I64),
        ("u64", DType::U64),
        ("bool", DType::Bool),
        ("scalar", DType::F32),
        ("empty", DType::F32),
    ];
    for (name, dtype) in dtypes {
        let t = file.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        let w = &tensors[name];
        assert_eq!(t.format, TensorFormat::Plain(dtype), "{name}");
        let shape: Vec<usize> =
            w["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(t.shape, shape, "{name}");
        let values = w["values"].as_array().unwrap();
        assert_eq!(t.numel(), values.len(), "{name}");
        assert_eq!(t.bytes().len(), values.len() * dtype.size(), "{name}");
        for (i, v) in values.iter().enumerate() {
            let want = match v {
                Value::Bool(b) => f64::from(u8::from(*b)),
                // u64/i64 beyond 2^53 compare as f64 on both sides; they differ from their
                // neighbours by far more than one f64 step in this fixture.
                _ => v.as_f64().unwrap(),
            };
            let got = element(t, i);
            assert!(
                got == want && got.is_sign_negative() == want.is_sign_negative(),
                "{name}[{i}]: {got} vs {want}"
            );
        }
        assert!(matches!(t.data, TensorData::Mapped { .. }), "{name} must be zero-copy");
    }
}

#[test]
fn views_share_one_mapping() {
    let w = open_single(&tiny().join("model.safetensors")).unwrap();
    let ptrs: Vec<*const u8> = w
        .tensors
        .values()
        .map(|t| match &t.data {
            TensorData::Mapped { map, .. } => map.as_ptr(),
            TensorData::Owned(_) => panic!("owned"),
        })
        .collect();
    assert!(ptrs.windows(2).all(|p| p[0] == p[1]));
    assert_eq!(w.metadata.get("format").map(String::as_str), Some("mlx"));
    assert_eq!(w.files, vec![tiny().join("model.safetensors")]);
}

#[test]
fn no_truncation_or_byte_flip_panics() {
    let good = std::fs::read(tiny().join("model.safetensors")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A fresh name per variant: rewriting one file in place makes ext4 flush on every
    // truncation (auto_da_alloc), which turns this test from milliseconds into seconds.
    let mut n = 0;
    let mut fresh = |bytes: &[u8]| {
        n += 1;
        let path = dir.path().join(format!("m{n}.safetensors"));
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let header_end = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut refused = 0;
    for len in 0..good.len() {
        let path = fresh(&good[..len]);
        // Every strict prefix cuts some tensor or the header: all must be refused.
        if SafetensorsFile::open(&path).is_err() {
            refused += 1;
        }
    }
    assert_eq!(refused, good.len(), "every truncation must be refused");
    for i in 0..header_end {
        for flip in [0x01u8, 0x20, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] ^= flip;
            let path = fresh(&bad);
            if let Ok(f) = SafetensorsFile::open(&path) {
                // Whatever was accepted must still be in bounds.
                for t in &f.tensors {
                    assert_eq!(Some(t.bytes().len()), t.format.tensor_bytes(&t.shape));
                }
            }
            std::fs::remove_file(path).unwrap();
        }
    }
}
