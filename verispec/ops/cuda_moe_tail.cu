// The MoE after its router product in one persistent launch: the router (softmax, top-k, the
// shared expert as one more slot), gate/up + SwiGLU, down, and the combine with the residual add
// and the next norm (what Model.moe_add_norm otherwise runs as four Triton launches: the router,
// cuda_moe's gate/up, down and combine).
//
// Why one launch: each of those kernels pays a ramp to the copy rate and a drain at its end, the
// routed experts' weights can only be requested once the router is done, and the down weights
// once gate/up is. Here one CTA per SM streams its share of all of the MoE's weights through a
// ring of STAGES = WARPS * SPW shared-memory slots filled by bulk async copies (cp.async.bulk, the
// copy engine). The shared expert's gate/up units are requested before griddepcontrol.wait
// (weights never change, its id is fixed: slot TOPK of every row, id NE); every CTA then routes
// every row itself (no router launch), and requests the routed units. Each warp takes whole units
// (unit i by warp i % WARPS; no block-wide barrier per unit) through its own SPW slots: once it
// has read a slot it requests its next unit into it, so the down weights are requested while
// gate/up work is still going on. A down unit waits (a counter per pair) only for its own pair's
// act; a row's combine waits (a counter per row) only for its own pairs' down units.
// (With slots shared by warps a fast warp could pass a barrier phase of the wrong parity and read
// a slot before its bytes: an illegal-instruction fault, device call 73; a producer warp issuing
// every warp's units in order stalled on the slowest warp, calls 74-75; letting the next kernel
// launch right after the wait, so its programs sat resident beside these, cost 3-4x in the model
// what the kernel lost alone, call 77: it is let launch once a CTA's down units are done.)
//
// Exactness: a row's routing is computed from its own logits by one warp, in the same code for
// every row and every R; a unit (one pair's GU_ROWS gate and up rows, or DN_ROWS down rows) is
// computed by one warp in one fixed order (each lane's elements in order, then a fixed butterfly
// across the warp), whichever CTA and warp take it and however many rows came; the combine of
// row r is one CTA's, in slot order. So a row's bits depend on its own inputs alone. Which CTA
// takes a unit changes with R; nothing in the arithmetic does.
//
// Memory: x, resid and the weights were written before the router product's launch (read through
// the read-only cache); the logits are the launch's just before (this kernel may start while it
// runs: read at L2 after griddepcontrol.wait); act and y are written by other CTAs of this launch
// (stored and read at L2, ordered by the counters: each storing thread's release add, the
// reader's acquire poll). Nothing is written before the wait (the outputs may reuse memory the kernels
// before still read).
//
// Compiled at run time by NVRTC (cuda_moe_tail.py) with -D for HD (hidden), ID (expert width),
// TOPK (routed slots), NE (experts; id NE is the shared expert), NORM_TOPK, SLOT (bytes), WARPS,
// SPW (slots per warp), EXTRA (bytes after the ring) and PHASES (3; 1 or 2 stop after gate/up or
// down, for timing probes only). No headers: bf16 is handled as its bits.

typedef unsigned short bf16;
typedef unsigned long long u64;

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
constexpr int EPL = NE / 32;                         // router: experts per lane
static_assert(NE % 32 == 0 && EPL <= 32 && TOPK <= 32, "the router's warp");
static_assert(STAGES * 8 + 4 * WARPS + 8 * MAX_PAIRS <= EXTRA, "the shared memory after the ring");
// the counters (ctr): [0] CTAs done; [1 + p] act values out of pair p; [1 + MAX_PAIRS + r] y values
// out of row r's pairs; every launch puts them back to zero
constexpr int CTR_A = 1, CTR_B = 1 + MAX_PAIRS, CTR_N = 1 + MAX_PAIRS + 16;

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

// poll a counter (at L2, acquire) until it reaches target
__device__ __forceinline__ void wait_count(const unsigned* ctr, unsigned target) {
    unsigned v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
    } while (v < target);
}

// one row's router, a warp (lane l: experts l, l + 32, ...): softmax over the NE logits (fp32;
// from bf16 logits, or SPLIT fp32 partials summed in chunk order and rounded to bf16 as the
// product would be), the TOPK largest by repeated argmax (ties to the lower id; one max per pick
// over keys packing the probability's bits above NE - 1 - id), renormalised with NORM_TOPK;
// slot TOPK the shared expert (id NE) with weight bf16(sigmoid(logit NE)).
__device__ __forceinline__ float logit(const void* lg, int split, int rs, int ss, int r, int e) {
    if (split == 0) return bf2f(__ldcg(reinterpret_cast<const bf16*>(lg) + (size_t)r * rs + e));
    const float* p = reinterpret_cast<const float*>(lg) + (size_t)r * rs + e;
    float a = 0.f;
    for (int sp = 0; sp < split; ++sp) a += __ldcg(p + (size_t)sp * ss);
    return round_bf(a);
}

__device__ __forceinline__ u64 pick_key(float p, int e) {   // larger key: larger p, then lower id
    return ((u64)__float_as_uint(p) << 32) | (unsigned)(NE - 1 - e);
}

__device__ void route_row(const void* lg, int split, int rs, int ss, int r, int lane, int* ids, float* wts) {
    const float g = lane == 0 ? logit(lg, split, rs, ss, r, NE) : 0.f;
    float p[EPL];
    float mx = __int_as_float(0xff800000);   // -inf
#pragma unroll
    for (int k = 0; k < EPL; ++k) {
        p[k] = logit(lg, split, rs, ss, r, lane + 32 * k);
        mx = fmaxf(mx, p[k]);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < EPL; ++k) {
        p[k] = expf(p[k] - mx);
        sum += p[k];
    }
    sum = warp_sum(sum);
    u64 mine = 0;                            // this lane's best key not yet taken
#pragma unroll
    for (int k = 0; k < EPL; ++k) {
        p[k] = p[k] / sum;
        const u64 key = pick_key(p[k], lane + 32 * k);
        mine = key > mine ? key : mine;
    }
    float picked = 0.f, wsum = 0.f;
    int pid = 0;
    for (int j = 0; j < TOPK; ++j) {
        u64 best = mine;
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) {
            const u64 other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other > best ? other : best;
        }
        const int e = NE - 1 - (int)(best & 0xffffffffu);
        const float w = __uint_as_float((unsigned)(best >> 32));
        if (best == mine) {                  // this lane's expert was picked: its next best
            mine = 0;
#pragma unroll
            for (int k = 0; k < EPL; ++k) {
                const u64 key = pick_key(p[k], lane + 32 * k);
                if (key < best && key > mine) mine = key;
            }
        }
        if (lane == j) { picked = w; pid = e; }
        wsum += w;                               // in pick order, the same in every lane
    }
    if (lane < TOPK) {
        ids[r * S + lane] = pid;
        wts[r * S + lane] = NORM_TOPK ? picked / wsum : picked;
    }
    if (lane == 0) {
        ids[r * S + TOPK] = NE;
        wts[r * S + TOPK] = round_bf(1.f / (1.f + expf(-g)));
    }
}

// count one more unit done (release: the caller's stores before it are seen by whoever acquires)
__device__ __forceinline__ void count_done(unsigned* p) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(p) : "memory");
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
moe_tail(const void* logits, int split, int lrs, int lss, const bf16* __restrict__ x,
         const bf16* gu_all, const bf16* shared_gu, const bf16* down_all, const bf16* shared_down,
         const bf16* __restrict__ resid, const bf16* __restrict__ norm_w, int* top_i, float* top_w,
         bf16* act, float* y, bf16* s_out, bf16* out, unsigned* ctr, int R, float eps, int pdl)
{
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    u64* full = reinterpret_cast<u64*>(smem + STAGES * SLOT);      // a slot's bytes have landed
    float* part = reinterpret_cast<float*>(full + STAGES);         // [WARPS]
    int* ids = reinterpret_cast<int*>(part + WARPS);               // [MAX_PAIRS] each pair's expert
    float* wts = reinterpret_cast<float*>(ids + MAX_PAIRS);        // [MAX_PAIRS] its weight
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
    for (int r = warp; r < R; r += WARPS)       // every CTA routes every row (the same code for each)
        route_row(logits, split, lrs, lss, r, lane, ids, wts);
    __syncthreads();
    if (c == 0) {
        for (int q = tid; q < P; q += THREADS) {
            top_i[q] = ids[q];
            top_w[q] = wts[q];
        }
    }
    if (lane == 0) {              // the rest of this warp's first SPW units
        while (next < T && next < STAGES) {
            issue(next);
            next += WARPS;
        }
    }

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
#pragma unroll
        for (int rr = 0; rr < 2 * GU_ROWS; ++rr) {
            acc[rr] = 0.f;
#pragma unroll
            for (int v = 0; v < A_VEC; ++v)
                acc[rr] = dot8(*reinterpret_cast<const uint4*>(w + rr * HD + v * 256 + lane * 8), xv[v], acc[rr]);
        }
        __syncwarp();             // the slot read: its next unit (this warp's) may overwrite it
        if (lane == 0 && i + STAGES < T) issue(i + STAGES);
#pragma unroll
        for (int rr = 0; rr < 2 * GU_ROWS; ++rr) acc[rr] = warp_sum(acc[rr]);
        if (lane < GU_ROWS) {
            float g = acc[0], up = acc[GU_ROWS];
#pragma unroll
            for (int rr = 1; rr < GU_ROWS; ++rr)
                if (lane == rr) { g = acc[rr]; up = acc[GU_ROWS + rr]; }
            act[(size_t)u.pair * ID + u.block * GU_ROWS + lane] = f2bf(g / (1.f + expf(-g)) * up);
            count_done(ctr + CTR_A + u.pair);    // each act value out, counted for the pair's down units
        }
    }

    if (PHASES >= 2) {            // (a probe's PHASES 1: gate/up only)
        // down: y[pair, n] = d_n . act[pair] (fp32), a unit a warp, once the pair's act is all out
        for (int i = nA + (warp - nA % WARPS + WARPS) % WARPS; i < T; i += WARPS) {   // i % WARPS == warp
            const int slot = slot_of(i);
            const Unit u = b_unit(c + (i - nA) * G);
            if (lane == 0) wait_count(ctr + CTR_A + u.pair, ID);
            __syncwarp();
            uint4 av[B_VEC];
#pragma unroll
            for (int v = 0; v < B_VEC; ++v)
                av[v] = __ldcg(reinterpret_cast<const uint4*>(act + (size_t)u.pair * ID + v * 256 + lane * 8));
            mbar_wait(&full[slot], use_of(i) & 1);
            const bf16* w = reinterpret_cast<const bf16*>(ring + slot * SLOT);
            float acc[DN_ROWS];
#pragma unroll
            for (int rr = 0; rr < DN_ROWS; ++rr) {
                acc[rr] = 0.f;
#pragma unroll
                for (int v = 0; v < B_VEC; ++v)
                    acc[rr] = dot8(*reinterpret_cast<const uint4*>(w + rr * ID + v * 256 + lane * 8), av[v], acc[rr]);
            }
            __syncwarp();
            if (lane == 0 && i + STAGES < T) issue(i + STAGES);
            float mine = 0.f;
#pragma unroll
            for (int rr = 0; rr < DN_ROWS; ++rr) {
                const float t = warp_sum(acc[rr]);
                if (lane == rr) mine = t;
            }
            if (lane < DN_ROWS) {
                __stcg(y + (size_t)u.pair * HD + u.block * DN_ROWS + lane, mine);
                count_done(ctr + CTR_B + u.row);  // each y value out, counted for the row's combine
            }
        }
    }
    __syncthreads();
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");   // late: see LATE in the .py

    // combine (CTA r for row r, once its pairs' down units are all out): the routed slots in slot
    // order, the shared expert, the residual add and the norm, each rounding as cuda_moe._combine
    if (PHASES >= 3 && c < R) {
        const int r = c;
        if (tid == 0) wait_count(ctr + CTR_B + r, S * HD);
        __syncthreads();
        const float sg = wts[r * S + TOPK];
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
                const float wt = wts[r * S + s];
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

    // the last CTA out puts the counters back for the next launch (every CTA is past its last poll)
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(ctr, 1u) == (unsigned)G - 1) {
            for (int i = 0; i < CTR_N; ++i) ctr[i] = 0;
            __threadfence();
        }
    }
}
