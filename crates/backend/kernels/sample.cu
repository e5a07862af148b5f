// Sampling on the GPU. argmax: the greedy token of each logits row, the host rule of
// `sampler::argmax` (and `tf_backend::argmax_row`): the highest value, ties to the lowest id,
// NaN never wins, id 0 when no value is above -inf.
//
// One block per row. Each thread scans its ids in increasing order (ids i, i + 1024, ...; f32
// rows of a multiple of 4 ids: the 4 ids of 16-byte chunks i, i + 1024, ...; one id a load
// took 51 us for a 128,256-id row on the H200, ncu, session 12), keeping the first strict
// maximum it meets (so its lowest id among equal values); the block then reduces the (value,
// id) pairs by "higher value, else lower id". That order is total on non-NaN values
// and associative, so the result does not depend on the reduction tree: it is exactly the
// lowest id holding the row's maximum, as the host's left-to-right scan finds. +0 and -0
// compare equal on both sides, so the lower id wins there too.

#define ARGMAX_THREADS 1024
#define NO_ID 0xffffffffu

__device__ __forceinline__ void better(float& v, u32& i, float ov, u32 oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

// The greedy token of row `r` (this block's), in thread 0 (other threads: unspecified).
__device__ __forceinline__ u32 row_argmax(const void* logits, int is_f32, u32 cols, u32 r) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ u32 si[ARGMAX_THREADS / 32];
    const u64 base = (u64)r * cols;
    float bv = __int_as_float(0xff800000);  // -inf: only a value above it is ever taken
    u32 bi = NO_ID;
    const float* row = (const float*)logits + base;
    if (is_f32 && cols % 4 == 0 && ((u64)row & 15) == 0) {
        // f32 rows (the logits): 16-byte loads of 4 ids, four loads in flight a thread; each
        // thread still meets its ids in increasing order.
        const u32 quads = cols / 4, T = blockDim.x;
        u32 q = threadIdx.x;
        auto scan = [&](float4 v, u32 id) {
            const float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (u32 j = 0; j < 4; j++)
                if (x[j] > bv) bv = x[j], bi = id + j;
        };
        for (; q + 3 * T < quads; q += 4 * T) {
            float4 v[4];
#pragma unroll
            for (u32 u = 0; u < 4; u++) v[u] = ((const float4*)row)[q + u * T];
#pragma unroll
            for (u32 u = 0; u < 4; u++) scan(v[u], 4 * (q + u * T));
        }
        for (; q < quads; q += T) scan(((const float4*)row)[q], 4 * q);
    } else {
        for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = ld_act(logits, base + c, is_f32);
            if (v > bv) {
                bv = v;
                bi = c;
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(bv, bi, ov, oi);
    }
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        const u32 warps = blockDim.x / 32;
        bv = lane < warps ? sv[lane] : __int_as_float(0xff800000);
        bi = lane < warps ? si[lane] : NO_ID;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
            better(bv, bi, ov, oi);
        }
    }
    return bi == NO_ID ? 0u : bi;
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_f32(const void* logits, int is_f32, u32* out, u32 cols) {
    pdl_wait();
    pdl_launch();
    const u32 t = row_argmax(logits, is_f32, cols, blockIdx.x);
    if (threadIdx.x == 0) out[blockIdx.x] = t;
}

// Decode ahead (one block; a step of one row and one logits row, `cuda/ahead.rs`): the row's
// greedy token t (argmax_f32's rule) becomes the next step's input on the device: the step
// metadata's token slot `meta[tok_at]` := t and its position `meta[pos_at]` := p + 1, and t
// is written to host-mapped memory `ring[(p + 1) % ring_len]`, where the host reads it
// without a copy. Launched last in its step, after every kernel that reads the metadata
// (each waited for its predecessor), so the step it ends is unchanged; the next step, issued
// by the host before this token is read, reads the advanced metadata.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_ahead(const void* logits, int is_f32, u32 cols, u32* meta, u32 tok_at, u32 pos_at,
             volatile u32* ring, u32 ring_len) {
    pdl_wait();
    pdl_launch();
    const u32 t = row_argmax(logits, is_f32, cols, 0);
    if (threadIdx.x == 0) {
        const u32 q = meta[pos_at] + 1;
        meta[tok_at] = t;
        meta[pos_at] = q;
        ring[q % ring_len] = t;
        __threadfence_system();
    }
}

// ---------------------------------------------------------------------------------------------
// sample_rows: temperature / top-k / top-p / min-p sampling, the definition of
// crates/backend/src/sample.rs operation for operation (read its header first). Weights are
// integers W = min(floor(exp_portable((v - max) / t) 2^S), 2^S) computed in f64 with
// __dadd_rn / __dsub_rn / __dmul_rn / __ddiv_rn (never contracted into fma), so each equals
// the host's bit for bit; every cut is a sum of integers, so no reduction order matters.
//
// One block per row. Candidates are ids with W > 0; "pred" adds the cuts made so far: the
// composite (order key << 32 | id) at most `cut` (top-k, top-p) and W >= `floor` (min-p).
// A select finds the first candidate in order whose running count / weight exceeds T: three
// radix passes over the order key (11, 11, 10 bits; a shared histogram of u64 sums per digit,
// each thread adding runs of equal digits at once so equal logits do not contend), then the
// id inside the chosen logit by 1024-id tiles in id order. W lives in `wbuf` (rows x cols).
// Per-row parameters `prm`, 4 u64 a row: f64 bits of the temperature (<= 0: greedy), top_k |
// P << 32, M, b (the 53-bit uniform).

#define SAMPLE_THREADS 1024
#define SAMPLE_BUCKETS 2048

__device__ __forceinline__ double exp_portable(double x) {
    if (!(x >= -64.0)) return 0.0;
    const double inv_ln2 = __longlong_as_double(0x3ff71547652b82feLL);
    const double ln2_hi = __longlong_as_double(0x3fe62e42fee00000LL);
    const double ln2_lo = __longlong_as_double(0x3dea39ef35793c76LL);
    const double k = floor(__dadd_rn(__dmul_rn(x, inv_ln2), 0.5));
    const double r = __dsub_rn(__dsub_rn(x, __dmul_rn(k, ln2_hi)), __dmul_rn(k, ln2_lo));
    const long long c[13] = {0x3ff0000000000000LL, 0x3ff0000000000000LL, 0x3fe0000000000000LL,
                             0x3fc5555555555555LL, 0x3fa5555555555555LL, 0x3f81111111111111LL,
                             0x3f56c16c16c16c17LL, 0x3f2a01a01a01a01aLL, 0x3efa01a01a01a01aLL,
                             0x3ec71de3a556c734LL, 0x3e927e4fb7789f5cLL, 0x3e5ae64567f544e4LL,
                             0x3e21eed8eff8d898LL};
    double p = __longlong_as_double(c[12]);
#pragma unroll
    for (int i = 11; i >= 0; --i) p = __dadd_rn(__dmul_rn(p, r), __longlong_as_double(c[i]));
    return __dmul_rn(p, __longlong_as_double((long long)(1023 + (int)k) << 52));
}

// -0.0 read as +0.0.
__device__ __forceinline__ float canon(float v) { return v == 0.0f ? 0.0f : v; }

__device__ __forceinline__ u32 order_key(float v) {
    const u32 b = __float_as_uint(canon(v));
    const u32 asc = (b >> 31) ? ~b : (b | 0x80000000u);
    return ~asc;
}

__device__ __forceinline__ float key_value(u32 key) {
    const u32 asc = ~key;
    return __uint_as_float((asc >> 31) ? (asc & 0x7fffffffu) : ~asc);
}

__device__ __forceinline__ u64 weight_of(float v, float max, double t, u32 s) {
    const double x = __ddiv_rn(__dsub_rn((double)canon(v), (double)max), t);
    const u64 w = __double2ull_rz(__dmul_rn(exp_portable(x), (double)(1ull << s)));
    return w < (1ull << s) ? w : (1ull << s);
}

struct RowCtx {
    const void* logits;
    int is_f32;
    const u64* w;  // this row's weights
    u64 base;      // this row's first element in `logits`
    u32 cols;
    u64 cut;       // composite bound (key << 32 | id)
    u64 floor;     // min-p bound on W
    float max;     // the row's finite maximum (+0.0 for a zero)
    double t;      // temperature
};

__device__ __forceinline__ bool pred(const RowCtx& r, u32 id, u32 key, u64 w) {
    return w > 0 && w >= r.floor && ((((u64)key) << 32) | id) <= r.cut;
}

// Sum of x over the block (every thread gets it); `red` holds 32 u64.
__device__ u64 block_sum(u64 x, u64* red) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) red[warp] = x;
    __syncthreads();
    u64 t = 0;
    for (u32 i = 0; i < blockDim.x / 32; ++i) t += red[i];
    return t;
}

// Sum over the row of W (by_weight) or 1 for every candidate that passes pred.
__device__ u64 row_total(const RowCtx& r, bool by_weight, u64* red) {
    u64 acc = 0;
    for (u32 id = threadIdx.x; id < r.cols; id += blockDim.x) {
        const u64 w = r.w[id];
        if (w == 0) continue;
        const u32 key = order_key(ld_act(r.logits, r.base + id, r.is_f32));
        if (pred(r, id, key, w)) acc += by_weight ? w : 1;
    }
    return block_sum(acc, red);
}

// Shared state of a select.
struct SelShared {
    u64 hist[SAMPLE_BUCKETS];
    u64 red[32];
    u64 t;
    u32 digit;
    u32 found;
};

// The first bucket whose running sum exceeds sh.t: sets sh.digit and sh.t -= the sum before.
__device__ void pick_bucket(SelShared& sh, u32 buckets) {
    const u32 i = threadIdx.x;
    const u64 h0 = 2 * i < buckets ? sh.hist[2 * i] : 0;
    const u64 h1 = 2 * i + 1 < buckets ? sh.hist[2 * i + 1] : 0;
    const u64 own = h0 + h1;
    u64 inc = own;
    const u32 lane = i % 32, warp = i / 32;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= (u32)o) inc += y;
    }
    const u64 t = sh.t;
    __syncthreads();
    if (lane == 31) sh.red[warp] = inc;
    __syncthreads();
    u64 before = inc - own;
    for (u32 j = 0; j < warp; ++j) before += sh.red[j];
    __syncthreads();
    if (t >= before && t - before < h0) {
        sh.digit = 2 * i;
        sh.t = t - before;
    } else if (t >= before + h0 && t - before - h0 < h1) {
        sh.digit = 2 * i + 1;
        sh.t = t - before - h0;
    }
    __syncthreads();
}

// Adds `v` to bucket `d` of the shared histogram through a per-thread run accumulator.
struct Run {
    u32 d;
    u64 acc;
    __device__ void add(u64* hist, u32 nd, u64 v) {
        if (nd != d) {
            if (acc) atomicAdd(&hist[d], acc);
            d = nd;
            acc = 0;
        }
        acc += v;
    }
    __device__ void flush(u64* hist) {
        if (acc) atomicAdd(&hist[d], acc);
    }
};

// The composite (key << 32 | id) of the first candidate passing pred whose running count
// (by_weight false) or weight exceeds t.
__device__ u64 select(const RowCtx& r, u64 t, bool by_weight, u32 s, SelShared& sh) {
    if (threadIdx.x == 0) sh.t = t;
    u32 prefix = 0;
    const u32 shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    for (int level = 0; level < 3; ++level) {
        const u32 shift = shifts[level], mask = (1u << widths[level]) - 1;
        __syncthreads();  // every thread has read the previous level's digit
        for (u32 b = threadIdx.x; b < SAMPLE_BUCKETS; b += blockDim.x) sh.hist[b] = 0;
        if (threadIdx.x == 0) sh.digit = mask;  // never kept: the invariant t < total holds
        __syncthreads();
        Run run = {0, 0};
        for (u32 id = threadIdx.x; id < r.cols; id += blockDim.x) {
            const u64 w = r.w[id];
            if (w == 0) continue;
            const u32 key = order_key(ld_act(r.logits, r.base + id, r.is_f32));
            if (level > 0 && (key >> (shift + widths[level])) != prefix) continue;
            if (!pred(r, id, key, w)) continue;
            run.add(sh.hist, (key >> shift) & mask, by_weight ? w : 1);
        }
        run.flush(sh.hist);
        __syncthreads();
        pick_bucket(sh, mask + 1);
        prefix = (prefix << widths[level]) | sh.digit;
    }
    // One logit (key `prefix`): its candidates share one weight; take the m-th in id order.
    const u64 tt = sh.t;
    const u64 gw = weight_of(key_value(prefix), r.max, r.t, s);
    u64 m = by_weight ? tt / gw : tt;
    if (threadIdx.x == 0) sh.found = 0xffffffffu;
    __syncthreads();
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (u32 tile = 0; tile < r.cols; tile += blockDim.x) {
        const u32 id = tile + threadIdx.x;
        bool f = false;
        if (id < r.cols) {
            const u64 w = r.w[id];
            if (w > 0) {
                const u32 key = order_key(ld_act(r.logits, r.base + id, r.is_f32));
                f = key == prefix && pred(r, id, key, w);
            }
        }
        const u32 ballot = __ballot_sync(0xffffffffu, f);
        if (lane == 0) sh.red[warp] = __popc(ballot);
        __syncthreads();
        u64 before = __popc(ballot & ((1u << lane) - 1));
        u64 count = 0;
        for (u32 j = 0; j < blockDim.x / 32; ++j) {
            if (j < warp) before += sh.red[j];
            count += sh.red[j];
        }
        if (m < count) {
            if (f && before == m) sh.found = id;
            __syncthreads();
            break;
        }
        m -= count;
        __syncthreads();
    }
    __syncthreads();
    const u32 found = sh.found;
    __syncthreads();
    return (((u64)prefix) << 32) | found;
}

// The greedy token of the row (argmax_f32's rule), every thread gets it.
__device__ u32 block_argmax(const void* logits, int is_f32, u64 base, u32 cols, SelShared& sh) {
    float bv = __int_as_float(0xff800000);
    u32 bi = NO_ID;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = ld_act(logits, base + c, is_f32);
        if (v > bv) {
            bv = v;
            bi = c;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(bv, bi, ov, oi);
    }
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) sh.red[warp] = ((u64)__float_as_uint(bv) << 32) | bi;
    __syncthreads();
    float v = __int_as_float(0xff800000);
    u32 idx = NO_ID;
    for (u32 j = 0; j < blockDim.x / 32; ++j) {
        better(v, idx, __uint_as_float((u32)(sh.red[j] >> 32)), (u32)sh.red[j]);
    }
    __syncthreads();
    return idx == NO_ID ? 0u : idx;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_rows(const void* logits, int is_f32, const u64* prm, u64* wbuf, u32* out, u32 cols,
            u32 s) {
    pdl_wait();
    pdl_launch();
    __shared__ SelShared sh;
    const u64 row = blockIdx.x;
    const double t = __longlong_as_double((long long)prm[4 * row]);
    const u32 top_k = (u32)prm[4 * row + 1], top_p = (u32)(prm[4 * row + 1] >> 32);
    const u64 min_p = prm[4 * row + 2], bits = prm[4 * row + 3];
    RowCtx r = {logits, is_f32, wbuf + row * cols, row * cols, cols, ~0ull, 0, 0.0f, t};
    // The finite maximum, and whether the row holds +inf.
    float mx = __int_as_float(0xff800000);
    int inf = 0;
    for (u32 id = threadIdx.x; id < cols; id += blockDim.x) {
        const float v = ld_act(logits, r.base + id, is_f32);
        inf |= v == __int_as_float(0x7f800000);
        if (v > mx && v != __int_as_float(0x7f800000)) mx = v;
    }
    inf = __syncthreads_or(inf);
    mx = warp_max(mx);
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sh.red[warp] = __float_as_uint(mx);
    __syncthreads();
    for (u32 j = 0; j < blockDim.x / 32; ++j) mx = fmaxf(mx, __uint_as_float((u32)sh.red[j]));
    __syncthreads();
    if (!(t > 0.0) || inf || !(mx > __int_as_float(0xff800000))) {
        const u32 tok = block_argmax(logits, is_f32, r.base, cols, sh);
        if (threadIdx.x == 0) out[row] = tok;
        return;
    }
    r.max = canon(mx);
    u64* w = wbuf + row * cols;
    for (u32 id = threadIdx.x; id < cols; id += blockDim.x) {
        const float v = ld_act(logits, r.base + id, is_f32);
        w[id] = isfinite(v) ? weight_of(v, r.max, t, s) : 0;
    }
    __syncthreads();
    if (top_k > 0 && (u64)top_k < row_total(r, false, sh.red)) {
        r.cut = select(r, top_k - 1, false, s, sh);
    }
    if (top_p < (1u << 24)) {
        const u64 total = row_total(r, true, sh.red);
        const u64 lo = (u64)top_p * total, hi = __umul64hi((u64)top_p, total);
        u64 need = ((hi << 40) | (lo >> 24)) + ((lo & 0xffffffull) != 0);
        need = need > 0 ? need : 1;
        r.cut = select(r, need - 1, true, s, sh);
    }
    if (min_p > 0) r.floor = min_p << (s - 24);
    const u64 total = row_total(r, true, sh.red);
    const u64 lo = bits * total, hi = __umul64hi(bits, total);
    const u64 chosen = select(r, (hi << 11) | (lo >> 53), true, s, sh);
    if (threadIdx.x == 0) out[row] = (u32)chosen;
}

// ---------------------------------------------------------------------------------------------
// penalize_rows: each logits row copied to f32 (`dst`, rows x cols) with its penalties applied,
// the definition of crates/backend/src/penalty.rs operation for operation: a positive logit
// divided by the repetition penalty, any other multiplied (when it is not 1), then (when
// presence or frequency is not 0, for ids generated n > 0 times) v - (presence + frequency n),
// then v + b for each biased id (logit_bias), every operation rounded once (__f*_rn: nothing
// contracted into an fma), so each value is the host's bit for bit. sample_rows then reads
// `dst` as f32 rows. One block per row; the copy, a barrier, one thread per penalized id, a
// barrier, one thread per biased id (each id at most once a pass: no two threads write one
// element at once). Per-row parameters `pen`, 4 u64 a row: repetition | presence << 32 (f32
// bits), frequency | count << 32, the row's first penalized entry, its first biased entry |
// their count << 32; entries are id | n << 32 (penalized) or id | bias bits << 32 (biased).

__device__ __forceinline__ float penalize_value(float v, u32 n, float rep, float pres, float freq) {
    if (rep != 1.0f) v = v > 0.0f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
    if (n > 0 && (pres != 0.0f || freq != 0.0f)) {
        v = __fsub_rn(v, __fadd_rn(pres, __fmul_rn(freq, __uint2float_rn(n))));
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
penalize_rows(const void* logits, int is_f32, const u64* pen, const u64* seen, float* dst,
              u32 cols) {
    pdl_wait();
    pdl_launch();
    const u64 row = blockIdx.x, base = row * cols;
    for (u32 id = threadIdx.x; id < cols; id += blockDim.x) {
        dst[base + id] = ld_act(logits, base + id, is_f32);
    }
    __syncthreads();
    const u64* p = pen + 4 * row;
    const float rep = __uint_as_float((u32)p[0]), pres = __uint_as_float((u32)(p[0] >> 32));
    const float freq = __uint_as_float((u32)p[1]);
    const u32 count = (u32)(p[1] >> 32), biased = (u32)(p[3] >> 32);
    const u64* ids = seen + p[2];
    for (u32 j = threadIdx.x; j < count; j += blockDim.x) {
        const u32 id = (u32)ids[j], n = (u32)(ids[j] >> 32);
        if (id < cols) dst[base + id] = penalize_value(dst[base + id], n, rep, pres, freq);
    }
    __syncthreads();
    const u64* bias = seen + (u32)p[3];
    for (u32 j = threadIdx.x; j < biased; j += blockDim.x) {
        const u32 id = (u32)bias[j];
        const float b = __uint_as_float((u32)(bias[j] >> 32));
        if (id < cols) dst[base + id] = __fadd_rn(dst[base + id], b);
    }
}
