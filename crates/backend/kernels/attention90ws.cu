// Attention, part 4 (one unit after attention90.cu): the wgmma prefill CTA with its loads on
// a warpgroup of their own (sm_90a, head_dim 128). Per M-row it computes attention.cu's
// definition with attention90.cu's operations in attention90.cu's order (aw_scores,
// softmax_tile, aw_split_all, aw_pv_all, aw_close_split, aw_rescale, aw_write_out): only
// who brings K and V, and how the two wgmma warpgroups wait for them, change.
//
// Why: attention_wg_hd128's 256 threads copy each K and V tile themselves and meet at one CTA
// barrier a tile, so both warpgroups run their softmax and their splits at the same moment
// and leave the tensor cores idle together (session 14's ncu: issue slots 40% busy, 0.58
// eligible warps a scheduler; session 22: 232 us a layer at 2,048 rows against cuDNN's 89
// for half the products). Here (as FlashAttention-3's producer / consumer split; read, not
// copied) warpgroup 0 only copies: it gives its registers up (setmaxnreg), and for each K
// or V tile waits until both consumers freed the buffer (`empty`), copies the tile by 16-byte
// cp.async with attention90.cu's swizzle and zero fill, and arrives on the buffer's `full`
// mbarrier when they land (cp.async.mbarrier.arrive.noinc; the consumers fence the proxies
// after their wait: TF_AWS_NOINC below). Warpgroups 1 and 2 each run attend_wg's loop on
// their 64 M-rows, waiting on
// `full` before the scores of a K tile and before P V of a V tile, and freeing a buffer (one
// arrival a warp) once the wgmma that read it completed; no CTA barrier in the loop, so one
// warpgroup's softmax can run beside the other's products.
//
// Order of the copies, the same for both sides: per row tile K(0), then K(t + 1) (when it
// exists) and V(t) for t = 0, 1, ...; buffers K and V alternate two each, counters running
// on across the row tiles of a CTA. Each buffer the producer waits for was freed by
// consumers that needed only copies before it, so the wait always ends (with TF_AWS_NOINC=0
// the producer signals a copy one copy late, and the buffers it waits for needed only
// copies at least two before).
//
// Measured and dropped (session 23, H200, bit-equal): on full tiles, the exps by ex2.approx.ftz
// when a warp vote finds every argument >= -126 (the row's smallest score gives its smallest
// argument), which drops fexp's range fix, 3 of its 4 instructions (~7% of the consumer's
// instructions a tile): 197.5 / 198.4 us against 197.7 / 197.6 at 2,048 rows, prefill level.
// The consumers' instruction count does not set the pace (the tensor pipe is 37% busy, ncu):
// the waits on their own wgmma chains do, per 64-position tile. Also (same session): three K
// and three V buffers (the third pair past the pins): 195.2 / 197.6 us against 198.4 / 198.8,
// prefill 8,192 / 32,768 no faster (27.3k / 15.07k against 27.6k / 15.09k): the copies were
// not late with two. And turns between the consumers (FlashAttention-3's ping-pong: named
// barriers so their product batches alternate): 199.2 / 199.5 us against 196.7 / 197.8,
// 8,192 rows 2,536 / 2,552 against 2,490 / 2,501: slower.

// TF_AWS_NOINC (1, the default; a knob through TENSORFOLD_KERNEL_DEFINES): each producer
// thread arrives on a copy's `full` mbarrier by cp.async.mbarrier.arrive.noinc right after
// issuing it (the arrival fires when the thread's copies so far have landed), and each
// consumer thread fences the proxies (fence.proxy.async) after its wait, before its wgmma read
// the tile; 0: the producer waits for the copy before the newest (wait_group 1), fences and
// arrives, signalling each copy one copy late. Only when the consumers may start changes.
// Session 24 (H200, same bits: tests/cuda_attention.rs 7 shapes and the 66,000-position case,
// check exact fingerprints unchanged): 2,048 rows 193.5 / 193.9 / 193.7 us a call against
// 198.0 / 197.4 / 197.5, 8,192 rows 2,479 / 2,482 / 2,483 against 2,503 / 2,504 / 2,505
// (alternated); call 3's ncu had put 2.5% of the CTA's stall samples on the consumers' wait
// for V.
#ifndef TF_AWS_NOINC
#define TF_AWS_NOINC 1
#endif

#if WG_ENABLED
#define AWS_THREADS (AW_THREADS + 128)
// The mbarriers after the block table: full K, full V, empty K, empty V, two each; then 8
// bytes a consumer thread that only pin the softmax in place (aws_consume).
#define AWS_BAR (AW_T + AW_TBL * 4)
#define AWS_SMEM (AWS_BAR + 64 + 8 * AW_THREADS + 1024)

__device__ __forceinline__ void aws_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void aws_bar(u32 id) {
    asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

// Where copy number c of kind kind (0 K, 1 V) lives: buffer c % 2 (attention90.cu's tiles),
// its `full` and `empty` mbarriers; both sides count copies the same way.
struct AwsRing {
    u32 sbase, bars;
    __device__ __forceinline__ u32 buf(u32 kind, u32 c) const {
        return sbase + (kind ? AW_V : AW_K) + (c % 2) * AW_TILE;
    }
    __device__ __forceinline__ u32 full(u32 kind, u32 c) const { return bars + 8 * (2 * kind + c % 2); }
    __device__ __forceinline__ u32 empty(u32 kind, u32 c) const {
        return bars + 32 + 8 * (2 * kind + c % 2);
    }
    __device__ __forceinline__ static u32 parity(u32 c) { return (c / 2) & 1; }
};

// The producer side.
struct AwsQueue {
    AwsRing r;
    u32 count[2];  // copies of each kind so far
    u32 pend;      // the full mbarrier of the copy not yet signalled (0: none)
};

// One copy: wait for its buffer, copy, then signal the copy before it.
__device__ __forceinline__ void aws_copy(AwsQueue& Q, u32 kind, const bf16* pool,
                                         const AwTable& table, u32 t, u32 n, u64 base, u64 gofs,
                                         u32 p) {
    const u32 c = Q.count[kind]++;
    mbar_wait_parity(Q.r.empty(kind, c), AwsRing::parity(c) ^ 1);
    aw_load_kv<128, false>(Q.r.buf(kind, c), pool, table, t, n, base, gofs, p);
#if TF_AWS_NOINC
    // The arrival fires when this thread's copies so far have landed (the consumers fence).
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(Q.r.full(kind, c))
                 : "memory");
#else
    cp_async_commit();
    if (Q.pend) {
        cp_async_wait<1>();
        fence_proxy_async();
        aws_arrive(Q.pend);
    }
    Q.pend = Q.r.full(kind, c);
#endif
}

// The producer's part of one row tile of kv head g: its block table into tbl (when it fits),
// then K(0), and K(t + 1), V(t) for every tile t.
__device__ void aws_produce(const Args& A, const Tile& tile, u32 g, u32* tbl, AwsQueue& Q, u32 p) {
    const KvAt at = kv_at<128>(A, tile, g);
    AwTable tb = {at.table, (u32)__ffs(A.bs) - 1};
    const u32 nblk = (tile.n + A.bs - 1) >> tb.shift;
    if (nblk <= AW_TBL) {
        aws_bar(1);  // every producer thread has issued the previous row tile's copies
        for (u32 i = p; i < nblk; i += 128) tbl[i] = at.table[i];
        aws_bar(1);
        tb.ids = tbl;
    }
    const u32 nt = (tile.n + TK - 1) / TK;
    aws_copy(Q, 0, A.pool, tb, 0, tile.n, at.base, at.gofs, p);
    for (u32 t = 0; t < nt; t++) {
        if (t + 1 < nt) aws_copy(Q, 0, A.pool, tb, t + 1, tile.n, at.base, at.gofs, p);
        aws_copy(Q, 1, A.pool, tb, t, tile.n, at.base, at.gofs + at.plane, p);
    }
}

// The consumer side: waits for copy c of a kind and frees its buffer after use.
struct AwsTake {
    AwsRing r;
    u32 pin;
    u32 count[2];
    __device__ __forceinline__ u32 take(u32 kind, u32 c) const {
        mbar_wait_parity(r.full(kind, c), AwsRing::parity(c));
        // The producer's copies (generic proxy) before this thread's wgmma reads (async proxy).
        if (TF_AWS_NOINC) fence_proxy_async();
        return r.buf(kind, c);
    }
    __device__ __forceinline__ void give(u32 kind, u32 c, u32 lane) const {
        __syncwarp();
        if (lane == 0) aws_arrive(r.empty(kind, c));
    }
};

// One row tile of kv head g on consumer warpgroup wg (its 64 M-rows, ct: the thread's index
// among the consumers): attend_wg's loop with the producer's buffers.
__device__ void aws_consume(const Args& A, const Tile& tile, u32 g, u32 G, u32 ct, float4* Os,
                            AwsTake& T) {
    const u32 wg = ct / 128, warp = (ct % 128) / 32, lane = ct & 31;
    aws_bar(2 + wg);  // the warpgroup's wgmmas of the previous row tile read q no more
    aw_store_q(T.r.sbase, A, tile, g, G, wg * 1024 + ct % 128, 128, (wg + 1) * 1024);
    fence_proxy_async();  // q is read by wgmma (the async proxy) after the barrier
    aws_bar(2 + wg);
    int prow[2];
    row_positions(prow, A, tile, G, 64 * wg + 16 * warp, lane);
    const float NEG = -__int_as_float(0x7f800000);
    float M[2] = {NEG, NEG}, L[2] = {0.0f, 0.0f};
    float m[2] = {NEG, NEG}, l[2] = {0.0f, 0.0f}, o[64];
#pragma unroll
    for (int e = 0; e < 64; e++) o[e] = 0.0f;
    const u32 nt = (tile.n + TK - 1) / TK;
    const u32 qb = T.r.sbase + wg * 64 * 128;
    const u32 k0 = T.count[0], v0 = T.count[1];
    T.count[0] += nt;
    T.count[1] += nt;
    float s[8][4], alpha[2];
    aw_scores(s, qb, T.take(0, k0));
    wg_wait<0>();
    T.give(0, k0, lane);
    softmax_tile<8>(s, 0, prow, A.scale, lane, NEG, m, l, alpha);
    auto step = [&](u32 t, const bool NEXT) {
        const bool fresh = NEXT && ((t + 1) * TK) % SPLIT == 0;
        u32 a[4][3][4];
        aw_split_all(s, a);
        if (NEXT) aw_scores(s, qb, T.take(0, k0 + t + 1));
        aw_pv_all(o, a, T.take(1, v0 + t));
        const float mf[2] = {m[0], m[1]}, lf[2] = {l[0], l[1]};
        if (NEXT) {
            wg_wait<1>();  // the scores of t + 1
            T.give(0, k0 + t + 1, lane);
            if (fresh)
                for (int k = 0; k < 2; k++) { m[k] = NEG; l[k] = 0.0f; }
            // Tiles wholly at or below every row of the warp need no causal compare (the
            // same values: the compare would keep every score).
            const int lo = min(prow[0], prow[1]);
            if (__all_sync(0xffffffffu, (int)((t + 1) * TK + TK - 1) <= lo))
                softmax_tile<8, true>(s, t + 1, prow, A.scale, lane, NEG, m, l, alpha);
            else
                softmax_tile<8>(s, t + 1, prow, A.scale, lane, NEG, m, l, alpha);
            // Pins the softmax before the wait below: l needs every p of the tile, and ptxas
            // keeps this store ahead of the wait; without it ptxas sank ~28 of the 34 exps
            // past the wait (the PTX has them before it), so they ran after P V, not beside it.
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(T.pin + 8 * ct), "f"(l[0]),
                         "f"(l[1])
                         : "memory");
        }
        wg_wait<0>();  // o holds P(t) V(t)
        T.give(1, v0 + t, lane);
        if (!NEXT || fresh) aw_close_split((t * TK) / SPLIT == 0, M, L, mf, lf, o, Os + ct);
        // o * 1 is o, bit for bit: a warp whose rows kept their maxima skips the products.
        if (NEXT && !__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f))
            aw_rescale(o, alpha);
    };
    for (u32 t = 0; t + 1 < nt; t++) step(t, true);
    step(nt - 1, false);
    aw_write_out(A, tile, g, G, prow, L, Os + ct, 64 * wg + 16 * warp, lane);
}
#endif  // WG_ENABLED

// The prefill entry with a copy warpgroup (walk mode), head_dim 128, sm_90a: attention_wg_hd128's
// grid and rows. block AWS_THREADS (384); dynamic shared memory AWS_SMEM.
#if ATTN_PART(2)
extern "C" __global__ void __launch_bounds__(384, 1) attention_ws_hd128(ATTN_PARAMS) {
    pdl_wait();
    pdl_launch();
#if WG_ENABLED
    ATTN_ARGS(0);
    extern __shared__ __align__(16) unsigned char aw_smem[];
    __shared__ u32 starts[AW_MROWS / 32];
    const AwCta c = aw_cta(aw_smem, a, starts);
    const u32 bars = c.sbase + AWS_BAR;
    if (threadIdx.x == 0) {
        for (u32 i = 0; i < 4; i++) {
            mbar_init_at(bars + 8 * i, 128);      // full: every producer thread
            mbar_init_at(bars + 32 + 8 * i, 8);   // empty: every consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // The role from a shuffle, so ptxas knows it is warp-uniform (gemm90ws.cu).
    const u32 role = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    if (role == 0) {
        // 56 + 2 x 224 registers a thread over the warpgroups: no spills either side (40 / 232
        // spilled the producer's pointers).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
        AwsQueue Q = {{c.sbase, bars}, {0, 0}, 0};
        aw_each_tile(a, c, starts,
                     [&](const Tile& tile) { aws_produce(a, tile, c.g, c.tbl, Q, threadIdx.x); });
        cp_async_commit();
        cp_async_wait<0>();  // no copy outlives its thread
        if (Q.pend) {        // TF_AWS_NOINC=0: the last copy's signal
            fence_proxy_async();
            aws_arrive(Q.pend);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;" ::: "memory");
    AwsTake T = {{c.sbase, bars}, bars + 64, {0, 0}};
    aw_each_tile(a, c, starts, [&](const Tile& tile) {
        aws_consume(a, tile, c.g, c.G, threadIdx.x - 128, c.Os, T);
    });
#endif
}
#endif
