// The MoE after its router in one persistent launch: gate/up + SwiGLU, down, and the combine
// with the residual add and the next norm (cuda_moe.experts_add_norm's three Triton launches).
//
// Why one launch: each of those kernels pays a ramp to the copy rate and a drain at its end,
// and the down weights can only be fetched once the gate/up kernel is done. Here one CTA per
// SM streams its share of every weight the MoE reads, gate/up then down, through a ring of
// STAGES shared-memory slots filled by bulk async copies (cp.async.bulk, the copy engine), so
// each SM keeps STAGES * SLOT bytes in flight whatever the number of pairs, and the down
// weights arrive while the gate/up work and the grid barrier between the phases run. The
// shared expert's gate/up units are requested before griddepcontrol.wait: weights never
// change, and its id is fixed (slot TOPK of every row, id NE).
//
// Exactness: a unit (one pair's GU_ROWS gate and up rows, or DN_ROWS down rows) is computed
// by one CTA in one fixed order (each lane's elements in order, a fixed butterfly across the
// warp, the warps in order), the same code whichever CTA takes it and however many rows came,
// so a row's bits depend on its own inputs alone. Which CTA takes a unit does change with R;
// nothing in the arithmetic does.
//
// Memory: x, resid and the weights were written before the router's launch (read through the
// read-only cache); top_i and top_w are the router's (this kernel may start while it runs, so
// they are read at L2 after griddepcontrol.wait); act and y are written by other CTAs of this
// launch (stored and read at L2, ordered by the grid barrier).
//
// Compiled at run time by NVRTC (cuda_moe_tail.py) with -D for HD (hidden), ID (expert width),
// TOPK (routed slots), NE (experts; id NE is the shared expert), STAGES and SLOT (bytes).
// No headers: bf16 is handled as its bits.

typedef unsigned short bf16;
typedef unsigned long long u64;

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int S = TOPK + 1;                          // slots per row: the routed, then the shared
constexpr int GU_ROWS = SLOT / (4 * HD);             // gate rows (and as many up rows) per A unit
constexpr int UA = ID / GU_ROWS;                     // A units per pair
constexpr int DN_ROWS = SLOT / (2 * ID);             // down rows per B unit
constexpr int UB = HD / DN_ROWS;                     // B units per pair
constexpr int A_WPR = WARPS / (2 * GU_ROWS);         // warps per weight row in an A unit
constexpr int A_SPAN = HD / A_WPR;                   // a warp's elements of that row
constexpr int A_VEC = A_SPAN / 256;                  // 8-element loads per lane
constexpr int B_RPW = DN_ROWS / WARPS;               // down rows per warp
constexpr int B_VEC = ID / 256;
constexpr int C_EPT = HD / THREADS;                  // combine: elements per thread
static_assert(GU_ROWS >= 1 && ID % GU_ROWS == 0 && A_WPR >= 1 && WARPS % (2 * GU_ROWS) == 0, "A units");
static_assert(HD % (A_WPR * 256) == 0 && A_VEC >= 1, "A spans");
static_assert(DN_ROWS >= WARPS && DN_ROWS % WARPS == 0 && HD % DN_ROWS == 0 && ID % 256 == 0, "B units");
static_assert(C_EPT == 8, "the combine reads 8 contiguous elements a thread");

__device__ __forceinline__ float lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2bf(float f) {       // round to nearest even, as torch rounds
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
    acc = fmaf(lo(w.x), lo(x.x), acc); acc = fmaf(hi(w.x), hi(x.x), acc);
    acc = fmaf(lo(w.y), lo(x.y), acc); acc = fmaf(hi(w.y), hi(x.y), acc);
    acc = fmaf(lo(w.z), lo(x.z), acc); acc = fmaf(hi(w.z), hi(x.z), acc);
    acc = fmaf(lo(w.w), lo(x.w), acc); acc = fmaf(hi(w.w), hi(x.w), acc);
    return acc;
}

__device__ __forceinline__ float warp_sum(float v) {   // a fixed butterfly: every lane gets the same sum
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v;
}

__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(u64* b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(saddr(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect(u64* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, u64* b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* b, unsigned parity) {
    asm volatile("{\n\t.reg .pred p;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra WAIT_%=;\n}" :: "r"(saddr(b)), "r"(parity) : "memory");
}

// Every CTA of the grid past this point has finished what it wrote before (all CTAs are
// resident: one per SM, grid = SM count). ctr counts arrivals; target = G, then 2G.
__device__ __forceinline__ void grid_sync(unsigned* ctr, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr, 1u);
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

struct Unit { int pair, row, block; };

// A unit a: first the R shared pairs' units (known before the router is done), then the routed.
__device__ __forceinline__ Unit a_unit(int a, int R) {
    Unit u;
    if (a < R * UA) {
        u.row = a / UA; u.pair = u.row * S + TOPK; u.block = a % UA;
    } else {
        int a2 = a - R * UA, rem = a2 % (TOPK * UA);
        u.row = a2 / (TOPK * UA); u.pair = u.row * S + rem / UA; u.block = rem % UA;
    }
    return u;
}

__device__ __forceinline__ Unit b_unit(int b) {
    Unit u;
    u.pair = b / UB; u.row = u.pair / S; u.block = b % UB;
    return u;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
moe_tail(const bf16* __restrict__ x, const float* __restrict__ top_w, const int* __restrict__ top_i,
         const bf16* gu_all, const bf16* shared_gu, const bf16* down_all, const bf16* shared_down,
         const bf16* __restrict__ resid, const bf16* __restrict__ norm_w,
         bf16* act, float* y, bf16* s_out, bf16* out, unsigned* ctr, int R, float eps, int pdl)
{
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    u64* mbar = reinterpret_cast<u64*>(smem + STAGES * SLOT);
    float* part = reinterpret_cast<float*>(mbar + STAGES);          // [WARPS]
    const int G = gridDim.x, c = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int P = R * S, NA = P * UA, NB = P * UB;
    const int nA = c < NA ? (NA - 1 - c) / G + 1 : 0;
    const int nB = c < NB ? (NB - 1 - c) / G + 1 : 0;
    const int T = nA + nB;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&mbar[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // thread 0 requests unit j into slot j % STAGES
    auto issue = [&](int j) {
        const int slot = j % STAGES;
        unsigned char* dst = ring + slot * SLOT;
        if (j < nA) {
            const Unit u = a_unit(c + j * G, R);
            const int e = (u.pair % S == TOPK) ? NE : __ldcg(top_i + u.pair);
            const bf16* base = e == NE ? shared_gu : gu_all + (size_t)e * (2 * ID) * HD;
            mbar_expect(&mbar[slot], SLOT);
            bulk_copy(dst, base + (size_t)(u.block * GU_ROWS) * HD, SLOT / 2, &mbar[slot]);
            bulk_copy(dst + SLOT / 2, base + (size_t)(ID + u.block * GU_ROWS) * HD, SLOT / 2, &mbar[slot]);
        } else {
            const Unit u = b_unit(c + (j - nA) * G);
            const int e = (u.pair % S == TOPK) ? NE : __ldcg(top_i + u.pair);
            const bf16* base = e == NE ? shared_down : down_all + (size_t)e * HD * ID;
            mbar_expect(&mbar[slot], SLOT);
            bulk_copy(dst, base + (size_t)(u.block * DN_ROWS) * ID, SLOT, &mbar[slot]);
        }
    };

    int issued = 0;
    if (tid == 0) {   // before the wait: only the shared expert's units (nothing the router writes)
        while (issued < nA && issued < STAGES && c + issued * G < R * UA) issue(issued++);
    }
    if (pdl) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    if (tid == 0) {
        while (issued < T && issued < STAGES) issue(issued++);
    }

    // gate/up + SwiGLU: act[pair, j] = silu(g_j . x_row) * (u_j . x_row)
    for (int i = 0; i < nA; ++i) {
        const int slot = i % STAGES;
        const Unit u = a_unit(c + i * G, R);
        mbar_wait(&mbar[slot], (i / STAGES) & 1);
        const bf16* w = reinterpret_cast<const bf16*>(ring + slot * SLOT);
        const int wr = warp / A_WPR, k0 = (warp % A_WPR) * A_SPAN;
        float acc = 0.f;
#pragma unroll
        for (int v = 0; v < A_VEC; ++v) {
            const int k = k0 + v * 256 + lane * 8;
            const uint4 wv = *reinterpret_cast<const uint4*>(w + wr * HD + k);
            const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + (size_t)u.row * HD + k));
            acc = dot8(wv, xv, acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) part[warp] = acc;
        __syncthreads();
        if (tid < GU_ROWS) {
            float g = 0.f, up = 0.f;
#pragma unroll
            for (int h = 0; h < A_WPR; ++h) {
                g += part[tid * A_WPR + h];
                up += part[(GU_ROWS + tid) * A_WPR + h];
            }
            act[(size_t)u.pair * ID + u.block * GU_ROWS + tid] = f2bf(g / (1.f + expf(-g)) * up);
        }
        __syncthreads();
        if (tid == 0 && issued < T) issue(issued++);
    }
    grid_sync(ctr, G);            // every pair's act written

    // down: y[pair, n] = d_n . act[pair] (fp32)
    for (int i = nA; i < T; ++i) {
        const int slot = i % STAGES;
        const Unit u = b_unit(c + (i - nA) * G);
        mbar_wait(&mbar[slot], (i / STAGES) & 1);
        const bf16* w = reinterpret_cast<const bf16*>(ring + slot * SLOT);
#pragma unroll
        for (int q = 0; q < B_RPW; ++q) {
            const int rr = warp * B_RPW + q;
            float acc = 0.f;
#pragma unroll
            for (int v = 0; v < B_VEC; ++v) {
                const int k = v * 256 + lane * 8;
                const uint4 wv = *reinterpret_cast<const uint4*>(w + rr * ID + k);
                const uint4 av = __ldcg(reinterpret_cast<const uint4*>(act + (size_t)u.pair * ID + k));
                acc = dot8(wv, av, acc);
            }
            acc = warp_sum(acc);
            if (lane == 0) __stcg(y + (size_t)u.pair * HD + u.block * DN_ROWS + rr, acc);
        }
        __syncthreads();
        if (tid == 0 && issued < T) issue(issued++);
    }
    grid_sync(ctr, 2 * G);        // every pair's y written

    // combine (CTA r for row r): the routed slots in slot order, the shared expert, the residual
    // add and the norm, each rounding as cuda_moe._combine rounds
    if (c < R) {
        const int r = c, n0 = tid * C_EPT;
        float tot[C_EPT];
#pragma unroll
        for (int e = 0; e < C_EPT; ++e) tot[e] = 0.f;
        for (int s = 0; s < TOPK; ++s) {
            const float wt = __ldcg(top_w + r * S + s);
            const float* ys = y + (size_t)(r * S + s) * HD + n0;
            const float4 a = __ldcg(reinterpret_cast<const float4*>(ys));
            const float4 b = __ldcg(reinterpret_cast<const float4*>(ys + 4));
            tot[0] = fmaf(wt, a.x, tot[0]); tot[1] = fmaf(wt, a.y, tot[1]);
            tot[2] = fmaf(wt, a.z, tot[2]); tot[3] = fmaf(wt, a.w, tot[3]);
            tot[4] = fmaf(wt, b.x, tot[4]); tot[5] = fmaf(wt, b.y, tot[5]);
            tot[6] = fmaf(wt, b.z, tot[6]); tot[7] = fmaf(wt, b.w, tot[7]);
        }
        const float sg = __ldcg(top_w + r * S + TOPK);
        const float* ysh = y + (size_t)(r * S + TOPK) * HD + n0;
        const float4 a = __ldcg(reinterpret_cast<const float4*>(ysh));
        const float4 b = __ldcg(reinterpret_cast<const float4*>(ysh + 4));
        const float shv[C_EPT] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const uint4 rv = __ldg(reinterpret_cast<const uint4*>(resid + (size_t)r * HD + n0));
        const uint4 nv = __ldg(reinterpret_cast<const uint4*>(norm_w + n0));
        const float res[C_EPT] = {lo(rv.x), hi(rv.x), lo(rv.y), hi(rv.y), lo(rv.z), hi(rv.z), lo(rv.w), hi(rv.w)};
        const float nw[C_EPT] = {lo(nv.x), hi(nv.x), lo(nv.y), hi(nv.y), lo(nv.z), hi(nv.z), lo(nv.w), hi(nv.w)};
        float sm[C_EPT];
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < C_EPT; ++e) {
            const float ex = round_bf(sg * round_bf(shv[e]));
            const float o = round_bf(round_bf(tot[e]) + ex);
            sm[e] = round_bf(res[e] + o);
            ss = fmaf(sm[e], sm[e], ss);
        }
        ss = warp_sum(ss);
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) total += part[w];
        const float rs = rsqrtf(total / HD + eps);
        unsigned sp[4], op[4];
#pragma unroll
        for (int e = 0; e < C_EPT; e += 2) {
            sp[e / 2] = (unsigned)f2bf(sm[e]) | ((unsigned)f2bf(sm[e + 1]) << 16);
            op[e / 2] = (unsigned)f2bf(sm[e] * rs * (1.f + nw[e]))
                        | ((unsigned)f2bf(sm[e + 1] * rs * (1.f + nw[e + 1])) << 16);
        }
        *reinterpret_cast<uint4*>(s_out + (size_t)r * HD + n0) = make_uint4(sp[0], sp[1], sp[2], sp[3]);
        *reinterpret_cast<uint4*>(out + (size_t)r * HD + n0) = make_uint4(op[0], op[1], op[2], op[3]);
    }

    // the last CTA out puts the counter back for the next launch (every CTA is past both syncs)
    if (tid == 0) {
        if (atomicAdd(ctr + 1, 1u) == (unsigned)G - 1) {
            ctr[0] = 0;
            ctr[1] = 0;
            __threadfence();
        }
    }
}
