//! The reference side of the judge: `tools/reference/hf_logits.py` output, validated once.
//!
//! A reference is the JSON file (format `tensorfold-ref-logits/1`: the token history and, per
//! position, the top-k ids and logits, the float64 log-sum-exp `lse` of the full row and its
//! minimum) and optionally the raw full rows it describes under `full_logits` (a `.bin` of
//! little-endian bf16, f32 or f64 values, row-major `(positions, vocab)`, no header).
//!
//! Invariants: after [`Reference::new`] every row has `k >= 2` distinct in-vocabulary ids
//! sorted by logit descending; every token id is in the vocabulary; full rows, when present,
//! have exactly `positions x vocab` values. Finiteness is NOT checked here: the judge refuses a
//! non-finite row by position and side before comparing anything, so it must see such rows.
//! The full rows are kept as raw bytes and decoded one row at a time (a 2,000-position bf16
//! file is 200 MB; decoding all of it to f64 would need 800 MB).
//!
//! Rejected: parsing the JSON here (that needs `serde_json` in the engine; the caller parses
//! into [`RefFile`] with it and hands the typed value over).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::JudgeError;

/// The format tag `hf_logits.py` writes.
pub const REF_FORMAT: &str = "tensorfold-ref-logits/1";

/// `hf_logits.py` output as parsed (field names are the JSON keys).
#[derive(Clone, Debug, Deserialize)]
pub struct RefFile {
    pub format: String,
    pub model: String,
    pub dtype: String,
    #[serde(default)]
    pub attn: Option<String>,
    #[serde(default)]
    pub versions: Versions,
    pub k: usize,
    pub vocab_size: usize,
    pub tokens: Vec<u32>,
    #[serde(default)]
    pub full_logits: Option<FullDesc>,
    pub positions: Vec<RefRow>,
}

/// `{package: version or null}` as the reference tool records them.
pub type Versions = BTreeMap<String, Option<String>>;

/// One reference position: the row predicting the token after it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct RefRow {
    /// Top-k token ids, logit descending, lowest id first among equals.
    pub ids: Vec<u32>,
    /// Their logits (model-dtype values, exact).
    pub logits: Vec<f64>,
    /// `log(sum_v exp(l_v))` over the whole vocabulary, in float64.
    pub lse: f64,
    /// The smallest logit of the row.
    pub min: f64,
}

/// `full_logits` of the JSON: where the full rows are and how they are stored.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct FullDesc {
    pub file: String,
    pub dtype: FullDType,
    pub rows: usize,
    pub vocab: usize,
    pub bytes: u64,
}

/// Element type of a full-rows `.bin`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FullDType {
    Bf16,
    F32,
    F64,
}

impl FullDType {
    pub fn size(self) -> usize {
        match self {
            FullDType::Bf16 => 2,
            FullDType::F32 => 4,
            FullDType::F64 => 8,
        }
    }
}

/// Every logit of every reference position, raw; decoded a row at a time.
#[derive(Clone, Debug)]
pub struct FullRows {
    dtype: FullDType,
    vocab: usize,
    rows: usize,
    bytes: Vec<u8>,
}

impl FullRows {
    /// Wraps raw bytes of `rows x vocab` values of `dtype`; refuses any other length.
    pub fn from_bytes(
        bytes: Vec<u8>,
        dtype: FullDType,
        rows: usize,
        vocab: usize,
    ) -> Result<FullRows, JudgeError> {
        let want = rows.checked_mul(vocab).and_then(|n| n.checked_mul(dtype.size()));
        if want != Some(bytes.len()) {
            return Err(JudgeError::Reference(format!(
                "full rows: {} bytes, expected {rows} rows x {vocab} x {} bytes",
                bytes.len(),
                dtype.size()
            )));
        }
        Ok(FullRows { dtype, vocab, rows, bytes })
    }

    /// Reads the `.bin` at `path` as `desc` describes it (size checked before reading).
    pub fn read(path: &Path, desc: &FullDesc) -> Result<FullRows, JudgeError> {
        let bad = |m: String| JudgeError::Reference(format!("{}: {m}", path.display()));
        let len = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?.len();
        if len != desc.bytes {
            return Err(bad(format!("{len} bytes, but the JSON records {}", desc.bytes)));
        }
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        FullRows::from_bytes(bytes, desc.dtype, desc.rows, desc.vocab)
            .map_err(|e| bad(e.to_string()))
    }

    /// Values of f64 rows given directly (synthetic references in tests).
    pub fn from_f64(rows: &[Vec<f64>]) -> Result<FullRows, JudgeError> {
        let vocab = rows.first().map_or(0, Vec::len);
        if rows.iter().any(|r| r.len() != vocab) {
            return Err(JudgeError::Reference("full rows of different lengths".into()));
        }
        let bytes = rows.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
        FullRows::from_bytes(bytes, FullDType::F64, rows.len(), vocab)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row `i` decoded exactly to f64 (bf16 and f32 embed in f64). `i < rows()`.
    pub fn row(&self, i: usize) -> Vec<f64> {
        let size = self.dtype.size();
        let start = i * self.vocab * size;
        let raw = &self.bytes[start..start + self.vocab * size];
        match self.dtype {
            FullDType::Bf16 => raw
                .chunks_exact(2)
                .map(|c| {
                    f64::from(f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                })
                .collect(),
            FullDType::F32 => raw
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            FullDType::F64 => raw
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        }
    }
}

/// A validated reference: tokens, per-position summaries, optionally full rows.
#[derive(Clone, Debug)]
pub struct Reference {
    pub model: String,
    pub dtype: String,
    pub versions: Versions,
    pub vocab: usize,
    pub k: usize,
    pub tokens: Vec<u32>,
    pub rows: Vec<RefRow>,
    pub full: Option<FullRows>,
}

impl Reference {
    /// Checks the file's shape (format, lengths, k, id ranges, full-rows geometry).
    pub fn new(file: RefFile, full: Option<FullRows>) -> Result<Reference, JudgeError> {
        let bad = |m: String| Err(JudgeError::Reference(m));
        if file.format != REF_FORMAT {
            return bad(format!("format `{}`, expected `{REF_FORMAT}`", file.format));
        }
        let (n, vocab) = (file.tokens.len(), file.vocab_size);
        if n == 0 || file.positions.len() != n {
            return bad(format!("{n} tokens but {} positions", file.positions.len()));
        }
        if file.k < 2 || file.k > vocab {
            return bad(format!("k = {} (need 2 <= k <= vocab {vocab})", file.k));
        }
        if let Some(t) = file.tokens.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!("token id {t} outside the vocabulary of {vocab}"));
        }
        for (i, r) in file.positions.iter().enumerate() {
            check_row(i, r, file.k, vocab)?;
        }
        if let Some(f) = &full {
            if f.rows() != n || f.vocab() != vocab {
                return bad(format!(
                    "full rows are {} x {}, the JSON has {n} positions x vocab {vocab}",
                    f.rows(),
                    f.vocab()
                ));
            }
        }
        Ok(Reference {
            model: file.model,
            dtype: file.dtype,
            versions: file.versions,
            vocab,
            k: file.k,
            tokens: file.tokens,
            rows: file.positions,
            full,
        })
    }
}

/// A row's top-k: k distinct in-vocabulary ids, logits non-increasing (NaN is left to the
/// judge's refusal, so comparisons involving NaN are not treated as disorder here).
fn check_row(i: usize, r: &RefRow, k: usize, vocab: usize) -> Result<(), JudgeError> {
    let bad = |m: &str| Err(JudgeError::Reference(format!("position {i}: {m}")));
    if r.ids.len() != k || r.logits.len() != k {
        return bad(&format!(
            "{} ids and {} logits, expected k = {k}",
            r.ids.len(),
            r.logits.len()
        ));
    }
    if r.ids.iter().any(|&t| t as usize >= vocab) {
        return bad("a top-k id is outside the vocabulary");
    }
    let mut seen = r.ids.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != k {
        return bad("repeated top-k ids");
    }
    if r.logits.windows(2).any(|w| w[1] > w[0]) {
        return bad("top-k logits are not in descending order");
    }
    Ok(())
}
