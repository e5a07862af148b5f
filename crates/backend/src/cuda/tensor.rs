//! Device buffers of the CUDA backend: activations, weights, the paged KV pool, step metadata.
//!
//! - [`CudaTensor`]: `(max_rows, cols)` bf16 or f32, row-major, plus the valid row count, set
//!   by the op that writes it (as the CPU backend's `CpuTensor`: a buffer made for a 2,048-row
//!   prefill serves a 1-row decode unchanged).
//! - [`CudaWeight`]: a bf16 matrix copied up once straight from the mapped file's bytes, or a
//!   vector (one-dimensional tensor: norm weights, biases) decoded to f32 on the host first,
//!   since every op reads vectors as f32 and they are small. Quantized GGUF formats and
//!   f16/f32 matrices are refused by name.
//! - [`CudaKv`]: the pool, layout in `kernels/kv.cu`: block, layer, K then V, each plane
//!   `[kv_head][slot][dim]` bf16 (a warp reads one position's head as one coalesced row).
//! - [`CudaBatch`]: the validated [`BatchMeta`] kept on the host for checks, and one device
//!   buffer of u32: tokens, positions, each row's offset into the flat block tables, the
//!   logit rows, the flat tables. Offsets depend on (rows, logit rows) only, and the buffer is
//!   the backend's persistent one while no other batch is alive, so consecutive steps of one
//!   shape launch with the same arguments (CUDA graphs, `graph.rs`).

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use tf_checkpoint::{DType, TensorFormat, TensorView};

use crate::batch::{BatchMeta, KvGeometry};
use crate::error::{BackendError, Result};
use crate::ActDType;

/// The device address of a buffer, for a kernel argument. Event tracking is off (one stream),
/// so the returned guard does nothing.
pub(crate) fn dptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _guard) = buf.device_ptr(stream);
    p
}

/// An activation buffer on the device.
pub struct CudaTensor {
    pub(crate) buf: CudaSlice<u8>,
    pub(crate) dtype: ActDType,
    pub(crate) rows: usize,
    pub(crate) max_rows: usize,
    pub(crate) cols: usize,
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (d, r, m, c) = (self.dtype, self.rows, self.max_rows, self.cols);
        write!(f, "CudaTensor({d:?}, {r} of {m} rows x {c})")
    }
}

impl CudaTensor {
    pub fn dtype(&self) -> ActDType {
        self.dtype
    }
    /// Valid rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }
    /// Sets the valid row count (tests fill a tensor, then use a prefix of it).
    pub fn set_rows(&mut self, rows: usize) -> Result<()> {
        if rows > self.max_rows {
            return Err(BackendError::shape(
                "set_rows",
                format!("{rows} rows in a tensor of {}", self.max_rows),
            ));
        }
        self.rows = rows;
        Ok(())
    }
    pub(crate) fn is_f32(&self) -> i32 {
        (self.dtype == ActDType::F32) as i32
    }
    pub(crate) fn elem_bytes(&self) -> usize {
        match self.dtype {
            ActDType::Bf16 => 2,
            ActDType::F32 => 4,
        }
    }
    /// Checks that `rows` rows of `cols` fit, for an op writing this tensor.
    pub(crate) fn check_out(&self, op: &'static str, rows: usize, cols: usize) -> Result<()> {
        if self.cols != cols || rows > self.max_rows {
            return Err(BackendError::shape(
                op,
                format!(
                    "output is ({}, {}) but the op writes ({rows}, {cols})",
                    self.max_rows, self.cols
                ),
            ));
        }
        Ok(())
    }
}

/// What a weight holds on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    /// bf16 `(n, k)`, row-major, bytes as in the file.
    Bf16Matrix,
    /// f32 values of a one-dimensional tensor.
    F32Vector,
}

/// A weight resident on the device.
pub struct CudaWeight {
    pub(crate) name: String,
    pub(crate) kind: WeightKind,
    pub(crate) buf: CudaSlice<u8>,
    /// Rows (1 for a vector) and elements per row.
    pub(crate) n: usize,
    pub(crate) k: usize,
}

impl std::fmt::Debug for CudaWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaWeight({} {:?} [{}, {}])", self.name, self.kind, self.n, self.k)
    }
}

impl CudaWeight {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn kind(&self) -> WeightKind {
        self.kind
    }
    /// (rows, elements per row).
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    /// Checks this is a vector of `len` values (for norm weights and biases).
    pub(crate) fn check_vector(&self, op: &'static str, len: usize) -> Result<()> {
        if self.kind != WeightKind::F32Vector || self.k != len {
            return Err(BackendError::shape(
                op,
                format!("`{}` is [{}, {}], expected a vector of {len}", self.name, self.n, self.k),
            ));
        }
        Ok(())
    }
    pub(crate) fn check_matrix(&self, op: &'static str) -> Result<()> {
        if self.kind != WeightKind::Bf16Matrix {
            return Err(BackendError::shape(op, format!("`{}` is not a matrix", self.name)));
        }
        Ok(())
    }
}

/// How a checkpoint tensor becomes a device weight: `Ok((kind, host f32 values of a vector))`.
pub(crate) fn plan_weight(view: &TensorView) -> Result<(WeightKind, Option<Vec<f32>>)> {
    let name = &view.name;
    let (n, k) = view.rows_cols();
    if n == 0 || k == 0 {
        return Err(BackendError::shape(
            "load_weight",
            format!("`{name}`: empty shape {:?}", view.shape),
        ));
    }
    let want = view.format.tensor_bytes(&view.shape);
    if want != Some(view.bytes().len()) {
        return Err(BackendError::shape(
            "load_weight",
            format!(
                "`{name}`: shape {:?} in {} needs {want:?} bytes, the tensor has {}",
                view.shape,
                view.format,
                view.bytes().len()
            ),
        ));
    }
    let vector = view.shape.len() <= 1;
    let refuse = |what: String| {
        Err(BackendError::Device(format!(
            "weight {name}: {what} is not implemented on the CUDA backend; use a bf16 \
             checkpoint, e.g. `tensorfold export`"
        )))
    };
    match view.format {
        TensorFormat::Plain(DType::BF16) if !vector => Ok((WeightKind::Bf16Matrix, None)),
        TensorFormat::Plain(d @ (DType::F16 | DType::F32)) if !vector => {
            refuse(format!("a {} matrix", d.safetensors_name()))
        }
        TensorFormat::Plain(d @ (DType::BF16 | DType::F16 | DType::F32)) => {
            let b = view.bytes();
            let vals: Vec<f32> = match d {
                DType::BF16 => b
                    .chunks_exact(2)
                    .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                    .collect(),
                DType::F16 => b
                    .chunks_exact(2)
                    .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                    .collect(),
                _ => b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            };
            Ok((WeightKind::F32Vector, Some(vals)))
        }
        TensorFormat::Plain(d) => refuse(d.safetensors_name().to_string()),
        TensorFormat::Ggml(t) => refuse(t.name().to_string()),
    }
}

/// How the pool orders its regions (a K plane, then a V plane) of (block, layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLayout {
    /// Every layer of a block together (region `block * layers + layer`): the default.
    BlockMajor,
    /// Every block of a layer together (region `layer * blocks + block`): a sequence's blocks
    /// of one layer lie 2 planes apart instead of 2 x layers planes (2 MB on llama3-8b).
    LayerMajor,
}

impl KvLayout {
    /// `TENSORFOLD_KV_LAYOUT=layer` picks [`KvLayout::LayerMajor`], anything else (or unset)
    /// block-major: an A/B switch for measurements (the values stored and read are the same,
    /// only their addresses differ). Read once.
    pub(crate) fn from_env() -> KvLayout {
        static LAYOUT: std::sync::OnceLock<KvLayout> = std::sync::OnceLock::new();
        *LAYOUT.get_or_init(|| match std::env::var("TENSORFOLD_KV_LAYOUT").as_deref() {
            Ok("layer") => KvLayout::LayerMajor,
            _ => KvLayout::BlockMajor,
        })
    }

    /// (bstride, loff): the region of (block b, `layer`) is `b * bstride + loff`, counted in
    /// regions of 2 planes. The kernels (kv.cu, rope.cu, attention.cu) take exactly these.
    pub(crate) fn region(self, g: &KvGeometry, layer: usize) -> (usize, usize) {
        match self {
            KvLayout::BlockMajor => (g.layers, layer),
            KvLayout::LayerMajor => (1, layer * g.num_blocks),
        }
    }
}

/// The paged KV pool of every layer (bf16).
pub struct CudaKv {
    pub(crate) geom: KvGeometry,
    pub(crate) buf: CudaSlice<u16>,
    /// Elements of one plane: kv_heads * block_size * head_dim.
    pub(crate) plane: usize,
    pub(crate) layout: KvLayout,
}

impl std::fmt::Debug for CudaKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaKv({:?})", self.geom)
    }
}

impl CudaKv {
    /// Elements of the pool for `geom` and of one plane; `Err` on an empty or overflowing one.
    pub(crate) fn sizes(g: &KvGeometry) -> Result<(usize, usize)> {
        if g.layers == 0 || g.kv_heads == 0 || g.head_dim == 0 || g.block_size == 0 {
            return Err(BackendError::shape("alloc_kv", format!("empty geometry {g:?}")));
        }
        let plane = g.kv_heads.checked_mul(g.head_dim).and_then(|x| x.checked_mul(g.block_size));
        let total = plane
            .and_then(|p| p.checked_mul(2 * g.layers))
            .and_then(|x| x.checked_mul(g.num_blocks));
        match (plane, total) {
            (Some(p), Some(t)) if t > 0 && t <= u32::MAX as usize * 64 => Ok((t, p)),
            _ => Err(BackendError::shape("alloc_kv", format!("{g:?} is empty or overflows"))),
        }
    }

    /// The kernels' (bstride, loff) of `layer` ([`KvLayout::region`]) as u32.
    pub(crate) fn region(&self, op: &'static str, layer: usize) -> Result<(u32, u32)> {
        let (stride, off) = self.layout.region(&self.geom, layer);
        match (u32::try_from(stride), u32::try_from(off)) {
            (Ok(a), Ok(b)) => Ok((a, b)),
            _ => Err(BackendError::shape(op, format!("layer {layer} of {:?}", self.geom))),
        }
    }

    /// Checks that `batch` fits this pool and `layer` exists.
    pub(crate) fn check_batch(
        &self,
        op: &'static str,
        layer: usize,
        batch: &CudaBatch,
    ) -> Result<()> {
        self.geom.check_batch(op, layer, &batch.meta, batch.max_block)
    }
}

/// Offsets (in u32 elements) of each array inside [`CudaBatch`]'s device buffer.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BatchLayout {
    pub tokens: usize,
    pub positions: usize,
    pub row_table: usize,
    pub logit_rows: usize,
    pub tables: usize,
}

/// A validated step, uploaded.
pub struct CudaBatch {
    pub(crate) meta: BatchMeta,
    /// Largest block id any row needs (checked against the pool at use).
    pub(crate) max_block: Option<u32>,
    /// The metadata on the device: the backend's persistent buffer (`fixed`) or its own.
    pub(crate) dev: std::sync::Arc<CudaSlice<u32>>,
    pub(crate) at: BatchLayout,
    /// Whether `dev` is the backend's buffer at a fixed address (steps may then be graphed).
    pub(crate) fixed: bool,
}

impl std::fmt::Debug for CudaBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBatch({} rows)", self.meta.rows())
    }
}

impl CudaBatch {
    pub fn rows(&self) -> usize {
        self.meta.rows()
    }
    pub fn meta(&self) -> &BatchMeta {
        &self.meta
    }
    /// The device address of array `off` of the buffer.
    pub(crate) fn ptr(&self, stream: &CudaStream, off: usize) -> u64 {
        dptr(&*self.dev, stream) + 4 * off as u64
    }

    /// The host image of the device buffer and its layout, after `meta.validate`.
    pub(crate) fn host_image(meta: &BatchMeta) -> (Vec<u32>, BatchLayout, Option<u32>) {
        let rows = meta.rows();
        let mut seq_off = Vec::with_capacity(meta.seqs.len());
        let mut tables = Vec::new();
        for s in &meta.seqs {
            seq_off.push(tables.len() as u32);
            tables.extend_from_slice(&s.block_table);
        }
        let at = BatchLayout {
            tokens: 0,
            positions: rows,
            row_table: 2 * rows,
            logit_rows: 3 * rows,
            tables: 3 * rows + meta.logit_rows.len(),
        };
        let mut img = Vec::with_capacity(at.tables + tables.len() + 1);
        img.extend_from_slice(&meta.tokens);
        img.extend_from_slice(&meta.positions);
        img.extend(meta.row_seq.iter().map(|&s| seq_off[s as usize]));
        img.extend_from_slice(&meta.logit_rows);
        img.extend_from_slice(&tables);
        img.push(0); // never empty
        (img, at, Self::max_block(meta))
    }

    /// The largest block id any row of `meta` needs, after `meta.validate`.
    pub(crate) fn max_block(meta: &BatchMeta) -> Option<u32> {
        let mut max_block = None;
        for r in 0..meta.rows() {
            let seq = &meta.seqs[meta.row_seq[r] as usize];
            let need = meta.positions[r] as usize / meta.block_size + 1;
            max_block = max_block.max(seq.block_table[..need].iter().copied().max());
        }
        max_block
    }
}

#[cfg(test)]
mod tests {
    use super::KvLayout;
    use crate::batch::KvGeometry;

    const G: KvGeometry =
        KvGeometry { layers: 5, kv_heads: 2, head_dim: 8, block_size: 4, num_blocks: 7 };

    /// Whether `region` (layer -> (bstride, loff)) gives every (block, layer) its own region
    /// inside the pool; the first clash or overflow otherwise.
    fn own_regions(region: impl Fn(usize) -> (usize, usize)) -> Result<(), String> {
        let mut seen = [false; G.layers * G.num_blocks];
        for layer in 0..G.layers {
            let (stride, off) = region(layer);
            for b in 0..G.num_blocks {
                let r = b * stride + off;
                match seen.get_mut(r) {
                    None => return Err(format!("block {b} layer {layer}: region {r} is outside")),
                    Some(true) => return Err(format!("block {b} layer {layer}: region {r} again")),
                    Some(s) => *s = true,
                }
            }
        }
        Ok(())
    }

    /// Both layouts give every (block, layer) its own region, and block-major is the layout
    /// the kernels had before the layout became a choice (`block * layers + layer`).
    #[test]
    fn kv_layouts_give_every_block_and_layer_its_own_region() {
        for layout in [KvLayout::BlockMajor, KvLayout::LayerMajor] {
            assert_eq!(own_regions(|l| layout.region(&G, l)), Ok(()), "{layout:?}");
        }
        for (layer, b) in [(0, 0), (3, 6), (4, 2)] {
            let (stride, off) = KvLayout::BlockMajor.region(&G, layer);
            assert_eq!(b * stride + off, b * G.layers + layer);
        }
        // The control: stride 1 with the layer as offset reuses regions, and the check says so.
        assert!(own_regions(|l| (1, l)).is_err());
    }
}
