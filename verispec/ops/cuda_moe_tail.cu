// The MoE after its router in one persistent launch: gate/up + SwiGLU, down, and the combine
// with the residual add and the next norm (cuda_moe.experts_add_norm's three Triton launches).
//
// Why one launch: each of those kernels pays a ramp to the copy rate and a drain at its end,
// and the down weights can only be fetched once the gate/up kernel is done. Here one CTA per
// SM streams its share of every weight the MoE reads, gate/up then down, through a ring of
// STAGES = WARPS * SPW shared-memory slots filled by bulk async copies (cp.async.bulk, the copy
// engine), so each SM keeps up to STAGES * SLOT bytes in flight whatever the number of pairs,
// and the down weights arrive while the gate/up work and the grid barrier between the phases
// run. Each warp takes whole units (unit i by warp i % WARPS; no block-wide barrier per unit)
// through its own SPW slots: once it has read a slot it requests its next unit into it. (With
// slots shared by warps a fast warp could pass a barrier phase of the wrong parity and read a
// slot before its bytes: an illegal-instruction fault, device calls 71-74; a producer warp
// issuing every warp's units in order stalled on the slowest warp, calls 75-76.) The shared
// expert's gate/up units are requested before griddepcontrol.wait: weights never change, and
// its id is fixed (slot TOPK of every row, id NE). The next kernel is let launch only after the
// second grid barrier: launched right after the wait, its programs sat resident beside these and
// the forward lost 3-4x what this kernel lost alone (device call 78).
//
// Exactness: a unit (one pair's GU_ROWS gate and up rows, or DN_ROWS down rows) is computed
// by one warp in one fixed order (each lane's elements in order, then a fixed butterfly across
// the warp), the same code whichever CTA and warp take it and however many rows came, so a
// row's bits depend on its own inputs alone. Which CTA takes a unit changes with R; nothing in
// the arithmetic does.
//
// Memory: x, resid and the weights were written before the router's launch (read through the
// read-only cache); top_i and top_w are the router's (this kernel may start while it runs, so
// they are read at L2 after griddepcontrol.wait); act and y are written by other CTAs of this
// launch (stored and read at L2, ordered by the grid barrier). Nothing is written before the
// wait (the outputs may reuse memory the kernels before still read).
//
// Compiled at run time by NVRTC (cuda_moe_tail.py) with -D for HD (hidden), ID (expert width),
// TOPK (routed slots), NE (experts; id NE is the shared expert), SLOT (bytes), WARPS (consumer
// warps), SPW (slots per consumer warp), EXTRA (bytes after the ring) and PHASES (3; 1 or 2
// stop after gate/up or down, for timing probes only).
// bf16 is handled as its bits (cuda_device.cuh).

#include "cuda_device.cuh"

constexpr int THREADS = 32 * WARPS;
constexpr int STAGES = WARPS * SPW;
constexpr int S = TOPK + 1;                          // slots per row: the routed, then the shared
constexpr int MAX_PAIRS = 16 * S;                    // R <= 16 (the exact path's row slots)
constexpr int GU_ROWS = SLOT / (4 * HD);             // gate rows (and as many up rows) per A unit
constexpr int UA = ID / GU_ROWS;                     // A units per pair
constexpr int DN_ROWS = SLOT / (2 * ID);             // down rows per B unit
constexpr int UB = HD / DN_ROWS;                     // B units per pair
constexpr int A_VEC = HD / 256;                      // 8-element loads per lane per weight row
constexpr int B_VEC = ID / 256;
constexpr int NCH = (HD + 8 * THREADS - 1) / (8 * THREADS);   // combine: 8-element chunks a thread
static_assert(GU_ROWS >= 1 && ID % GU_ROWS == 0 && HD % 256 == 0, "A units");
static_assert(DN_ROWS >= 1 && DN_ROWS <= 32 && HD % DN_ROWS == 0 && ID % 256 == 0, "B units");
static_assert(HD % 8 == 0, "the combine reads 8 contiguous elements at a time");
static_assert(STAGES * 8 + 4 * WARPS + 4 * MAX_PAIRS <= EXTRA, "the shared memory after the ring");

__device__ __forceinline__ float lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
    acc = fmaf(lo(w.x), lo(x.x), acc); acc = fmaf(hi(w.x), hi(x.x), acc);
    acc = fmaf(lo(w.y), lo(x.y), acc); acc = fmaf(hi(w.y), hi(x.y), acc);
    acc = fmaf(lo(w.z), lo(x.z), acc); acc = fmaf(hi(w.z), hi(x.z), acc);
    acc = fmaf(lo(w.w), lo(x.w), acc); acc = fmaf(hi(w.w), hi(x.w), acc);
    return acc;
}

// acc[r] = row r of the slot w [ROWS, LEN] . the operand v (lane's 8-element pieces q * 256 + lane * 8),
// each lane's pieces in order (the warp's butterfly comes after)
template <int ROWS, int VEC, int LEN>
__device__ __forceinline__ void dot_rows(const bf16* w, const uint4* v, int lane, float* acc) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        acc[r] = 0.f;
#pragma unroll
        for (int q = 0; q < VEC; ++q)
            acc[r] = dot8(*reinterpret_cast<const uint4*>(w + r * LEN + q * 256 + lane * 8), v[q], acc[r]);
    }
}

// unit i: warp i % WARPS, in that warp's slots in turn; use = how many units the slot had before
__device__ __forceinline__ int slot_of(int i) { return (i % WARPS) * SPW + (i / WARPS) % SPW; }
__device__ __forceinline__ int use_of(int i) { return i / WARPS / SPW; }

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
    u64* full = reinterpret_cast<u64*>(smem + STAGES * SLOT);      // a slot's bytes have landed
    float* part = reinterpret_cast<float*>(full + STAGES);         // [WARPS]
    int* ids = reinterpret_cast<int*>(part + WARPS);               // [MAX_PAIRS]
    const int G = gridDim.x, c = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int P = R * S, NA = P * UA, NB = P * UB;
    const int nA = c < NA ? (NA - 1 - c) / G + 1 : 0;
    const int nB = c < NB ? (NB - 1 - c) / G + 1 : 0;
    const int T = nA + (PHASES >= 2 ? nB : 0);

    // unit j (this warp's, j % WARPS == warp) into its slot; lane 0 only
    auto issue = [&](int j) {
        const int slot = slot_of(j);
        unsigned char* dst = ring + slot * SLOT;
        if (j < nA) {
            const Unit u = a_unit(c + j * G, R);
            const int e = ids[u.pair];
            const bf16* base = e == NE ? shared_gu : gu_all + (size_t)e * (2 * ID) * HD;
            mbar_expect(&full[slot], SLOT);
            bulk_copy(dst, base + (size_t)(u.block * GU_ROWS) * HD, SLOT / 2, &full[slot]);
            bulk_copy(dst + SLOT / 2, base + (size_t)(ID + u.block * GU_ROWS) * HD, SLOT / 2, &full[slot]);
        } else {
            const Unit u = b_unit(c + (j - nA) * G);
            const int e = ids[u.pair];
            const bf16* base = e == NE ? shared_down : down_all + (size_t)e * HD * ID;
            mbar_expect(&full[slot], SLOT);
            bulk_copy(dst, base + (size_t)(u.block * DN_ROWS) * ID, SLOT, &full[slot]);
        }
    };

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    for (int q = tid; q < P; q += THREADS)      // the shared slots' id is fixed: known before the wait
        ids[q] = q % S == TOPK ? NE : -1;
    __syncthreads();
    int next = warp;              // lane 0: this warp's next unit to request
    if (lane == 0) {              // before the wait: only the shared expert's units
        while (next < nA && next < STAGES && c + next * G < R * UA) {
            issue(next);
            next += WARPS;
        }
    }
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int q = tid; q < P; q += THREADS)
        if (q % S != TOPK) ids[q] = __ldcg(top_i + q);
    __syncthreads();
    if (lane == 0) {              // the rest of this warp's first SPW units
        while (next < T && next < STAGES) {
            issue(next);
            next += WARPS;
        }
    }
    {
        // gate/up + SwiGLU: act[pair, j] = silu(g_j . x_row) * (u_j . x_row), a unit a warp
        for (int i = warp; i < nA; i += WARPS) {
            const int slot = slot_of(i);
            const Unit u = a_unit(c + i * G, R);
            uint4 xv[A_VEC];
#pragma unroll
            for (int v = 0; v < A_VEC; ++v)
                xv[v] = __ldg(reinterpret_cast<const uint4*>(x + (size_t)u.row * HD + v * 256 + lane * 8));
            mbar_wait(&full[slot], use_of(i) & 1);
            const bf16* w = reinterpret_cast<const bf16*>(ring + slot * SLOT);
            float acc[2 * GU_ROWS];
            dot_rows<2 * GU_ROWS, A_VEC, HD>(w, xv, lane, acc);
            __syncwarp();        // the slot read: its next unit (this warp's) may overwrite it
            if (lane == 0 && i + STAGES < T) issue(i + STAGES);
#pragma unroll
            for (int rr = 0; rr < 2 * GU_ROWS; ++rr) acc[rr] = warp_sum(acc[rr]);
            if (lane < GU_ROWS) {
                float g = acc[0], up = acc[GU_ROWS];
#pragma unroll
                for (int rr = 1; rr < GU_ROWS; ++rr)
                    if (lane == rr) { g = acc[rr]; up = acc[GU_ROWS + rr]; }
                act[(size_t)u.pair * ID + u.block * GU_ROWS + lane] = f2bf(g / (1.f + expf(-g)) * up);
            }
        }
        grid_sync(ctr, G);        // every pair's act written

        if (PHASES >= 2) {      // (a probe's PHASES 1: gate/up and the first barrier only)
            // down: y[pair, n] = d_n . act[pair] (fp32), a unit a warp
            for (int i = nA + (warp - nA % WARPS + WARPS) % WARPS; i < T; i += WARPS) {   // this warp's: i % WARPS == warp
                const int slot = slot_of(i);
                const Unit u = b_unit(c + (i - nA) * G);
                uint4 av[B_VEC];
#pragma unroll
                for (int v = 0; v < B_VEC; ++v)
                    av[v] = __ldcg(reinterpret_cast<const uint4*>(act + (size_t)u.pair * ID + v * 256 + lane * 8));
                mbar_wait(&full[slot], use_of(i) & 1);
                const bf16* w = reinterpret_cast<const bf16*>(ring + slot * SLOT);
                float acc[DN_ROWS];
                dot_rows<DN_ROWS, B_VEC, ID>(w, av, lane, acc);
                __syncwarp();        // the slot read: its next unit (this warp's) may overwrite it
                if (lane == 0 && i + STAGES < T) issue(i + STAGES);
                float mine = 0.f;
#pragma unroll
                for (int rr = 0; rr < DN_ROWS; ++rr) {
                    const float t = warp_sum(acc[rr]);
                    if (lane == rr) mine = t;
                }
                if (lane < DN_ROWS) __stcg(y + (size_t)u.pair * HD + u.block * DN_ROWS + lane, mine);
            }
            grid_sync(ctr, 2 * G);    // every pair's y written
            if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");   // see the top
        }

        // combine (CTA r for row r): the routed slots in slot order, the shared expert, the
        // residual add and the norm, each rounding as cuda_moe._combine rounds
        if (PHASES >= 3 && c < R) {
            const int r = c;
            const float sg = __ldcg(top_w + r * S + TOPK);
            float sm[NCH][8];
            float ss = 0.f;
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch) {
                const int n0 = (ch * THREADS + tid) * 8;
                if (n0 >= HD) break;
                float tot[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) tot[e] = 0.f;
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
                const float* ysh = y + (size_t)(r * S + TOPK) * HD + n0;
                const float4 a = __ldcg(reinterpret_cast<const float4*>(ysh));
                const float4 b = __ldcg(reinterpret_cast<const float4*>(ysh + 4));
                const float shv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                const uint4 rv = __ldg(reinterpret_cast<const uint4*>(resid + (size_t)r * HD + n0));
                const float res[8] = {lo(rv.x), hi(rv.x), lo(rv.y), hi(rv.y), lo(rv.z), hi(rv.z), lo(rv.w), hi(rv.w)};
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const float ex = round_bf(sg * round_bf(shv[e]));
                    const float o = round_bf(round_bf(tot[e]) + ex);
                    sm[ch][e] = round_bf(res[e] + o);
                    ss = fmaf(sm[ch][e], sm[ch][e], ss);
                }
            }
            ss = warp_sum(ss);
            if (lane == 0) part[warp] = ss;
            __syncthreads();
            float total = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) total += part[w];
            const float rs = rsqrtf(total / HD + eps);
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch) {
                const int n0 = (ch * THREADS + tid) * 8;
                if (n0 >= HD) break;
                const uint4 nv = __ldg(reinterpret_cast<const uint4*>(norm_w + n0));
                const float nw[8] = {lo(nv.x), hi(nv.x), lo(nv.y), hi(nv.y), lo(nv.z), hi(nv.z), lo(nv.w), hi(nv.w)};
                unsigned sp[4], op[4];
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    sp[e / 2] = (unsigned)f2bf(sm[ch][e]) | ((unsigned)f2bf(sm[ch][e + 1]) << 16);
                    op[e / 2] = (unsigned)f2bf(sm[ch][e] * rs * (1.f + nw[e]))
                                | ((unsigned)f2bf(sm[ch][e + 1] * rs * (1.f + nw[e + 1])) << 16);
                }
                *reinterpret_cast<uint4*>(s_out + (size_t)r * HD + n0) = make_uint4(sp[0], sp[1], sp[2], sp[3]);
                *reinterpret_cast<uint4*>(out + (size_t)r * HD + n0) = make_uint4(op[0], op[1], op[2], op[3]);
            }
        }

        // the last CTA out puts the counters back for the next launch (every CTA is past both syncs)
        if (tid == 0) {
            if (atomicAdd(ctr + 1, 1u) == (unsigned)G - 1) {
                ctr[0] = 0;
                ctr[1] = 0;
                __threadfence();
            }
        }
    }
}
