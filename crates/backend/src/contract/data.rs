//! The contract's inputs: a seeded generator, bf16 tensors written to a scratch safetensors
//! file and mapped back (so weights reach the backend only through
//! [`Backend::load_weight`]), input tables embedded into activation buffers, and batches.
//!
//! Invariant: the host reads every value the reference uses from the same mapped file the
//! backend loaded, never from a second copy that could drift from it; and every embed of
//! inputs is checked bit for bit against the table before an op runs on it.
//! Rejected: `TensorView::owned` buffers (they would skip the file path real weights take).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tf_checkpoint::safetensors::SafetensorsFile;
use tf_checkpoint::write::{write_safetensors, OutTensor};
use tf_checkpoint::{DType, TensorFormat, TensorView};

use super::ContractError;
use crate::batch::{BatchMeta, SeqMeta};
use crate::Backend;

/// Tokens per KV block in every batch the contract makes (the engine's block size).
pub const BLOCK_SIZE: usize = 16;

/// splitmix64 (Steele, Lea, Flood 2014): small, seeded, fast enough for a billion draws.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// A generator for one unit: the run's seed mixed with the unit's label (FNV-1a), so a
    /// unit sees the same data whichever other units run.
    pub fn derive(seed: u64, label: &str) -> Rng {
        let h = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        });
        Rng::new(seed ^ h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Approximately standard normal: the sum of four 16-bit uniforms, centred and scaled
    /// to unit variance (Irwin-Hall), so within +-3.47.
    pub fn normalish(&mut self) -> f32 {
        let r = self.next_u64();
        let s: u32 = (0..4).map(|i| ((r >> (16 * i)) & 0xffff) as u32).sum();
        ((s as f64 / 65536.0 - 2.0) * 3f64.sqrt()) as f32
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }

    /// `n` distinct values of `0..universe`, in random order.
    pub fn sample(&mut self, n: usize, universe: usize) -> Vec<u32> {
        let mut all: Vec<u32> = (0..universe as u32).collect();
        self.shuffle(&mut all);
        all.truncate(n);
        all
    }
}

/// bf16 bits of `v`, rounded to nearest even.
pub fn bf16_bits(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// A bf16 matrix `(rows, cols)` in a mapped file, read as exact f64.
#[derive(Clone, Copy, Debug)]
pub struct Bf16Mat<'a> {
    pub bytes: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Bf16Mat<'a> {
    /// A view [`Scratch::bf16`] made (it checked the format and length), a vector as one row.
    pub fn of(view: &'a TensorView) -> Bf16Mat<'a> {
        let (rows, cols) = view.rows_cols();
        Bf16Mat { bytes: view.bytes(), rows, cols }
    }

    pub fn get(&self, r: usize, c: usize) -> f64 {
        let i = 2 * (r * self.cols + c);
        half::bf16::from_bits(u16::from_le_bytes([self.bytes[i], self.bytes[i + 1]])).to_f64()
    }

    /// Row `r` as f64 into `out[..cols]`.
    pub fn row_into(&self, r: usize, out: &mut [f64]) {
        let row = &self.bytes[2 * r * self.cols..2 * (r + 1) * self.cols];
        for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
            *o = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64();
        }
    }

    pub fn row(&self, r: usize) -> Vec<f64> {
        let mut v = vec![0.0; self.cols];
        self.row_into(r, &mut v);
        v
    }

    /// bf16 bits of row `r`, widened to f32 bits (what `read_f32` of an exact copy returns).
    pub fn row_f32_bits(&self, r: usize) -> impl Iterator<Item = u32> + '_ {
        let row = &self.bytes[2 * r * self.cols..2 * (r + 1) * self.cols];
        row.chunks_exact(2).map(|b| (u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
    }
}

/// A fresh directory of scratch safetensors files, removed when dropped.
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    pub fn new(parent: &Path) -> Result<Scratch, ContractError> {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("tensorfold-contract-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|source| ContractError::Scratch { path: dir.clone(), source })?;
        Ok(Scratch { dir })
    }

    /// Writes a bf16 tensor of `shape` whose element i is `bf16(gen(i))` to its own file
    /// and maps it back.
    pub fn bf16(
        &self,
        name: &str,
        shape: &[usize],
        mut gen: impl FnMut(usize) -> f32,
    ) -> Result<TensorView, ContractError> {
        let n: usize = shape.iter().product();
        let mut bytes = Vec::with_capacity(2 * n);
        for i in 0..n {
            bytes.extend_from_slice(&bf16_bits(gen(i)).to_le_bytes());
        }
        let path = self.dir.join(format!("{name}.safetensors"));
        let t = OutTensor { name: name.into(), dtype: DType::BF16, shape: shape.to_vec(), bytes };
        write_safetensors(&path, &mut [t], &BTreeMap::new())?;
        let file = SafetensorsFile::open(&path)?;
        let view = file.tensors.into_iter().next();
        match view {
            Some(v) if v.format == TensorFormat::Plain(DType::BF16) && v.bytes().len() == 2 * n => {
                Ok(v)
            }
            _ => Err(ContractError::Setup(format!(
                "{} does not read back as the bf16 {shape:?} tensor just written",
                path.display()
            ))),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Mapped views stay valid after the files are unlinked (POSIX); a failure to clean a
        // temporary directory is not worth failing the contract for.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Rows of inputs on the device (a weight `embed` gathers from) and their mapped bytes.
pub struct Table<B: Backend> {
    pub view: TensorView,
    pub w: B::Weight,
}

impl<B: Backend> Table<B> {
    /// A `(rows, cols)` table whose element (r, c) is `bf16(gen(r, c))`.
    pub fn new(
        be: &B,
        scratch: &Scratch,
        name: &str,
        (rows, cols): (usize, usize),
        mut gen: impl FnMut(usize, usize) -> f32,
    ) -> Result<Table<B>, ContractError> {
        let view = scratch.bf16(name, &[rows, cols], |i| gen(i / cols, i % cols))?;
        let w = be.load_weight(&view)?;
        Ok(Table { view, w })
    }

    pub fn mat(&self) -> Bf16Mat<'_> {
        Bf16Mat::of(&self.view)
    }

    /// Embeds the batch's tokens (rows of this table) into `out` and checks every bit.
    pub fn embed(
        &self,
        be: &B,
        batch: &B::Batch,
        tokens: &[u32],
        out: &mut B::Tensor,
    ) -> Result<(), ContractError> {
        be.embed(&self.w, batch, out)?;
        let m = self.mat();
        let got = read(be, out, (tokens.len(), m.cols), "embed of inputs")?;
        for (r, &t) in tokens.iter().enumerate() {
            let want = m.row_f32_bits(t as usize);
            let row = &got[r * m.cols..(r + 1) * m.cols];
            if let Some(c) = row.iter().zip(want).position(|(g, w)| g.to_bits() != w) {
                return Err(ContractError::Setup(format!(
                    "embed of input table `{}` row {t} gave a different value in column {c}: \
                     inputs cannot be placed, no gate can be judged",
                    self.view.name
                )));
            }
        }
        Ok(())
    }
}

/// `read_f32` of `rows` rows, checked to hold `rows * cols` values (a backend's output is
/// input to the contract: a wrong length fails the unit, it must not panic the harness).
pub fn read<B: Backend>(
    be: &B,
    t: &B::Tensor,
    (rows, cols): (usize, usize),
    op: &str,
) -> Result<Vec<f32>, ContractError> {
    let v = be.read_f32(t, rows)?;
    if v.len() != rows * cols {
        return Err(ContractError::Setup(format!(
            "{op}: read_f32 of {rows} rows of {cols} returned {} values",
            v.len()
        )));
    }
    Ok(v)
}

/// A step of independent rows (each its own sequence, like decode rows of many requests) at
/// the given tokens and positions; every row's logits are wanted.
pub fn row_batch(tokens: &[u32], positions: &[u32]) -> BatchMeta {
    let n = tokens.len();
    BatchMeta {
        tokens: tokens.to_vec(),
        positions: positions.to_vec(),
        row_seq: (0..n as u32).collect(),
        seqs: positions
            .iter()
            .map(|&p| SeqMeta { block_table: vec![0; p as usize / BLOCK_SIZE + 1] })
            .collect(),
        logit_rows: (0..n as u32).collect(),
        block_size: BLOCK_SIZE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_seeded_and_normalish_has_unit_scale() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
        let xs: Vec<f64> = (0..20000).map(|_| a.normalish() as f64).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "{mean} {var}");
        assert!(xs.iter().all(|x| x.abs() <= 3.47));
        let s = a.sample(10, 10);
        let mut sorted = s.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<u32>>());
        assert_ne!(Rng::derive(1, "a").next_u64(), Rng::derive(1, "b").next_u64());
    }

    #[test]
    fn scratch_round_trips_bf16_through_a_safetensors_file() {
        let s = Scratch::new(&std::env::temp_dir()).unwrap();
        let v = s.bf16("t", &[2, 3], |i| [1.0, -2.5, 0.0, 3.0, 1e-3, 7.0][i]).unwrap();
        let m = Bf16Mat::of(&v);
        assert_eq!((m.rows, m.cols), (2, 3));
        assert_eq!(m.row(0), vec![1.0, -2.5, 0.0]);
        assert_eq!(m.get(1, 1), half::bf16::from_f32(1e-3).to_f64());
        let bits: Vec<u32> = m.row_f32_bits(1).collect();
        assert_eq!(bits[0], 3.0f32.to_bits());
    }

    #[test]
    fn row_batches_validate() {
        let b = row_batch(&[5, 6, 7], &[0, 15, 16]);
        b.validate(Some(1)).unwrap();
        assert_eq!(b.seqs[2].block_table.len(), 2);
    }
}
