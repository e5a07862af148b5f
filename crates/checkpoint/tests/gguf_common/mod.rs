//! Shared helpers of the GGUF tests: where the test model and fixtures are, a byte-level GGUF
//! image builder (so malformed files can be made exactly), a small llama-shaped model, and
//! comparison of decoded metadata with the JSON written by tools/fixtures/gguf_dequant.py.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use tf_checkpoint::gguf::GgufValue;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

/// The test model, located as scripts/fetch-model.sh places it; fails if absent.
pub fn model_path() -> PathBuf {
    let cache = std::env::var_os("TENSORFOLD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache"));
    let p = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "test model {} not found: run scripts/fetch-model.sh", p.display());
    p
}

pub fn read_json(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join(name)).expect("fixture json");
    serde_json::from_str(&text).expect("fixture json parses")
}

pub fn read_f32s(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixtures().join(name)).expect("fixture bin");
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn hex(s: &serde_json::Value) -> u64 {
    let s = s.as_str().expect("bits string");
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex bits")
}

/// Asserts that `v` is the value the fixture JSON `want` describes (type and value; floats
/// by bit pattern; arrays element by element).
pub fn assert_value(key: &str, v: &GgufValue, want: &serde_json::Value) {
    let ty = want["type"].as_str().expect("type");
    let val = &want["value"];
    match (ty, v) {
        ("u8", GgufValue::U8(x)) => assert_eq!(u64::from(*x), val.as_u64().unwrap(), "{key}"),
        ("u16", GgufValue::U16(x)) => assert_eq!(u64::from(*x), val.as_u64().unwrap(), "{key}"),
        ("u32", GgufValue::U32(x)) => assert_eq!(u64::from(*x), val.as_u64().unwrap(), "{key}"),
        ("u64", GgufValue::U64(x)) => assert_eq!(*x, val.as_u64().unwrap(), "{key}"),
        ("i8", GgufValue::I8(x)) => assert_eq!(i64::from(*x), val.as_i64().unwrap(), "{key}"),
        ("i16", GgufValue::I16(x)) => assert_eq!(i64::from(*x), val.as_i64().unwrap(), "{key}"),
        ("i32", GgufValue::I32(x)) => assert_eq!(i64::from(*x), val.as_i64().unwrap(), "{key}"),
        ("i64", GgufValue::I64(x)) => assert_eq!(*x, val.as_i64().unwrap(), "{key}"),
        ("bool", GgufValue::Bool(x)) => assert_eq!(*x, val.as_bool().unwrap(), "{key}"),
        ("string", GgufValue::String(x)) => assert_eq!(x, val.as_str().unwrap(), "{key}"),
        ("f32", GgufValue::F32(x)) => {
            assert_eq!(u64::from(x.to_bits()), hex(&want["bits"]), "{key}")
        }
        ("f64", GgufValue::F64(x)) => assert_eq!(x.to_bits(), hex(&want["bits"]), "{key}"),
        ("array", GgufValue::Array(elem, items)) => {
            assert_eq!(elem.name(), want["elem"].as_str().unwrap(), "{key} element type");
            if let Some(all) = val.as_array() {
                assert_eq!(items.len(), all.len(), "{key} length");
                for (i, (x, w)) in items.iter().zip(all).enumerate() {
                    assert_value(&format!("{key}[{i}]"), x, w);
                }
            } else {
                // Long arrays: length, first elements and last element.
                assert_eq!(items.len() as u64, want["len"].as_u64().unwrap(), "{key} length");
                for (i, w) in want["head"].as_array().unwrap().iter().enumerate() {
                    assert_value(&format!("{key}[{i}]"), &items[i], w);
                }
                assert_value(&format!("{key}[last]"), items.last().unwrap(), &want["last"]);
            }
        }
        _ => panic!("{key}: expected {ty}, got {v:?}"),
    }
}

// ---------------------------------------------------------------------------- image builder

/// A metadata value to encode. `Raw` writes a type id then arbitrary bytes (for malformed
/// values); `Arr` holds its element type id.
#[derive(Clone, Debug)]
pub enum Val {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Arr(u32, Vec<Val>),
    Raw(u32, Vec<u8>),
}

pub fn s(x: &str) -> Val {
    Val::Str(x.to_string())
}

impl Val {
    fn type_id(&self) -> u32 {
        match self {
            Val::U8(_) => 0,
            Val::I8(_) => 1,
            Val::U16(_) => 2,
            Val::I16(_) => 3,
            Val::U32(_) => 4,
            Val::I32(_) => 5,
            Val::F32(_) => 6,
            Val::Bool(_) => 7,
            Val::Str(_) => 8,
            Val::Arr(..) => 9,
            Val::U64(_) => 10,
            Val::I64(_) => 11,
            Val::F64(_) => 12,
            Val::Raw(t, _) => *t,
        }
    }

    fn body(&self, out: &mut Vec<u8>) {
        match self {
            Val::U8(x) => out.push(*x),
            Val::I8(x) => out.extend(x.to_le_bytes()),
            Val::U16(x) => out.extend(x.to_le_bytes()),
            Val::I16(x) => out.extend(x.to_le_bytes()),
            Val::U32(x) => out.extend(x.to_le_bytes()),
            Val::I32(x) => out.extend(x.to_le_bytes()),
            Val::F32(x) => out.extend(x.to_le_bytes()),
            Val::Bool(x) => out.push(*x as u8),
            Val::Str(x) => put_str(out, x),
            Val::U64(x) => out.extend(x.to_le_bytes()),
            Val::I64(x) => out.extend(x.to_le_bytes()),
            Val::F64(x) => out.extend(x.to_le_bytes()),
            Val::Arr(t, items) => {
                out.extend(t.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for i in items {
                    i.body(out);
                }
            }
            Val::Raw(_, bytes) => out.extend(bytes),
        }
    }
}

pub fn put_str(out: &mut Vec<u8>, x: &str) {
    out.extend((x.len() as u64).to_le_bytes());
    out.extend(x.as_bytes());
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    /// ggml order (innermost first).
    pub ne: Vec<u64>,
    pub type_id: u32,
    /// `None`: placed after the previous tensor (aligned) and its data written;
    /// `Some`: the header claims this offset and no data is written for it.
    pub offset: Option<u64>,
    pub data: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    pub kvs: Vec<(String, Val)>,
    pub tensors: Vec<Tensor>,
    pub alignment: usize,
}

impl Default for Gguf {
    fn default() -> Self {
        Gguf { version: 3, kvs: Vec::new(), tensors: Vec::new(), alignment: 32 }
    }
}

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q8_0: u32 = 8;

/// Bytes of a tensor of `ne` elements in F32 / F16 / Q8_0 (the builder's own types).
pub fn nbytes(ne: &[u64], type_id: u32) -> usize {
    let n: u64 = ne.iter().product();
    (match type_id {
        F32 => n * 4,
        F16 => n * 2,
        Q8_0 => n / 32 * 34,
        _ => panic!("builder: give data explicitly for type {type_id}"),
    }) as usize
}

impl Gguf {
    pub fn kv(mut self, key: &str, v: Val) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    /// A tensor with deterministic non-zero data of the right size.
    pub fn tensor(self, name: &str, ne: &[u64], type_id: u32) -> Self {
        let len = nbytes(ne, type_id);
        let data = (0..len).map(|i| (i * 7 + name.len()) as u8 & 0x3F).collect();
        self.tensor_data(name, ne, type_id, data)
    }

    pub fn tensor_data(mut self, name: &str, ne: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            ne: ne.to_vec(),
            type_id,
            offset: None,
            data,
        });
        self
    }

    /// A tensor whose header offset is `offset`, with no data written.
    pub fn tensor_at(mut self, name: &str, ne: &[u64], type_id: u32, offset: u64) -> Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            ne: ne.to_vec(),
            type_id,
            offset: Some(offset),
            data: vec![],
        });
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let align = self.alignment;
        let up = |x: usize| x.div_ceil(align) * align;
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend(v.type_id().to_le_bytes());
            v.body(&mut out);
        }
        let mut next = 0usize;
        let mut placed = Vec::new();
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            let off = match t.offset {
                Some(o) => o,
                None => {
                    let o = up(next);
                    next = o + t.data.len();
                    placed.push((o, &t.data));
                    o as u64
                }
            };
            out.extend(off.to_le_bytes());
        }
        let data_start = up(out.len());
        out.resize(data_start, 0);
        for (o, d) in placed {
            out.resize(data_start + o, 0);
            out.extend(d.iter());
        }
        out
    }

    pub fn write(&self) -> tempfile::NamedTempFile {
        write_bytes(&self.bytes())
    }
}

pub fn write_bytes(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".gguf").tempfile().expect("tempfile");
    f.write_all(bytes).expect("write");
    f.flush().expect("flush");
    f
}

/// Geometry of [`mini_model`].
pub const HIDDEN: u64 = 64;
pub const HEADS: u32 = 4;
pub const KV_HEADS: u32 = 2;
pub const FFN: u64 = 128;
pub const LAYERS: u32 = 2;
pub const VOCAB: u64 = 32;

/// A small well-formed model of architecture `arch` with llama-style metadata and tensors
/// (Q8_0 matrices, F32 norms), tied embeddings, and a tiny vocabulary.
pub fn mini_model(arch: &str) -> Gguf {
    let k = |suffix: &str| format!("{arch}.{suffix}");
    let tokens: Vec<Val> = (0..VOCAB).map(|i| s(&format!("tok{i}"))).collect();
    let types: Vec<Val> = (0..VOCAB).map(|i| Val::I32(if i < 3 { 3 } else { 1 })).collect();
    let mut g = Gguf::default()
        .kv("general.architecture", s(arch))
        .kv(&k("block_count"), Val::U32(LAYERS))
        .kv(&k("context_length"), Val::U32(256))
        .kv(&k("embedding_length"), Val::U32(HIDDEN as u32))
        .kv(&k("feed_forward_length"), Val::U32(FFN as u32))
        .kv(&k("attention.head_count"), Val::U32(HEADS))
        .kv(&k("attention.head_count_kv"), Val::U32(KV_HEADS))
        .kv(&k("rope.freq_base"), Val::F32(500000.0))
        .kv(&k("attention.layer_norm_rms_epsilon"), Val::F32(1e-6))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.tokens", Val::Arr(8, tokens))
        .kv("tokenizer.ggml.token_type", Val::Arr(5, types))
        .kv("tokenizer.ggml.merges", Val::Arr(8, vec![s("t o"), s("to k")]))
        .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(2))
        .kv("tokenizer.chat_template", s("{{ messages }}"))
        .tensor("token_embd.weight", &[HIDDEN, VOCAB], Q8_0)
        .tensor("output_norm.weight", &[HIDDEN], F32);
    let (q, kv) = (HIDDEN, HIDDEN / HEADS as u64 * KV_HEADS as u64);
    for l in 0..LAYERS {
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        g = g
            .tensor(&b("attn_norm"), &[HIDDEN], F32)
            .tensor(&b("attn_q"), &[HIDDEN, q], Q8_0)
            .tensor(&b("attn_k"), &[HIDDEN, kv], Q8_0)
            .tensor(&b("attn_v"), &[HIDDEN, kv], Q8_0)
            .tensor(&b("attn_output"), &[q, HIDDEN], Q8_0)
            .tensor(&b("ffn_norm"), &[HIDDEN], F32)
            .tensor(&b("ffn_gate"), &[HIDDEN, FFN], Q8_0)
            .tensor(&b("ffn_up"), &[HIDDEN, FFN], Q8_0)
            .tensor(&b("ffn_down"), &[FFN, HIDDEN], Q8_0);
    }
    g
}
