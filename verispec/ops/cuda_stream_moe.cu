// The MoE's expert products (after the router) with their weights streamed by the copy engine:
// moe_gate_up (gate/up + SwiGLU) and moe_down, the arithmetic of cuda_moe's _gate_up_act and
// _down_pair in the stream design of cuda_stream_gemv.cu.
//
// Why: the Triton expert kernels read their weights at ~3.1-3.2 TB/s (gate/up 37.7 MB in ~11.8 us
// a layer at one row, down 18.9 MB in ~6.1 us), where the stream products' 2D TMA tiles reach 3.5
// (docs/cuda-history.md, thirteenth session). And the copies can start before griddepcontrol.wait where
// what they read is known: the shared expert's gate/up units (its weights are fixed), and every
// down unit (the ids were written by the router, two launches back, which has completed once
// moe_gate_up has passed its wait and let moe_down launch). Measured: exact, but slower than the
// Triton kernels (docs/cuda-history.md, fifteenth session), so off by default.
//
// Work: a pair p = r * S + s is row r's slot s (slots 0..S-2 routed, S-1 the shared expert, whose
// weights are a tensor of their own). Each warp requests its units into its own SPW shared-memory
// slots (the next one as soon as a slot is read) and accumulates with mma.m16n8k16 (the A tile's
// 16 row slots, fp32 accumulation).
//   gate/up: a task is GR act columns of one pair over all of H: GR gate rows then GR up rows of
//     the pair's expert (two TMA tiles into one slot); tasks are dealt to CTAs in turn (task t to
//     CTA t % G); within a CTA warp w owns the K slice [w GKW, (w+1) GKW), one unit a task, and the
//     warps' partial sums are added in warp order. The A tile is x's R rows (held in registers,
//     as the dense stream product holds them), of which row r is kept; act = silu(g) * u, rounded
//     once to bf16. The shared expert's tasks come first (t < R * NG), so a CTA's leading shared
//     units are requested before the wait.
//   down: each warp alone; a warp-task is 8 output columns of one pair over all of I (the
//     expert's 8 contiguous weight rows, one 8 KiB bulk copy at I = 512: the first version's
//     16-column tasks split over 4 warps read 256-byte pieces by TMA and were slower, device call
//     94); the A tile's row slot 0 is act[p] (the other 15 zero), loaded one task ahead; y[p] is
//     stored in fp32 (the combine sums and rounds).
//
// Exactness: every task runs the same instructions in the same order (its warp's units in
// 32-element steps, two mma a step per 8-column group, then for gate/up warps 0..GW-1), whichever
// CTA or warp takes it and however many rows came; an mma output element depends only on its own
// row of A and column of B, and the rows of A other than the pair's row never reach the stored
// value. So a pair's bits depend on its own row and expert alone.
//
// Memory: before the wait only weights (and, in moe_down, the router's ids) are read. After it,
// x and act are read at L2 (written by the kernels before); act and y are written. TRIG 1 lets
// the next kernel launch right after the wait.
//
// Compiled at run time by NVRTC (cuda_stream_moe.py) with -D for H (hidden), I (expert width),
// S (slots a row: the routed, then the shared), GW, GR, GSPW (gate/up: warps, act columns a
// task, slots a warp), DW, DSPW (down: warps a CTA, slots a warp) and TRIG.

#include "cuda_device.cuh"

constexpr int GKW = H / GW;                 // gate/up: a warp's K slice, one unit a task
constexpr int GSTEPS = GKW / 32;
constexpr int GROWS = 2 * GR;               // weight rows a task: GR gate, then GR up
constexpr int GCG = GROWS / 8;              // 8-column groups of the mma
constexpr int GSLOT = GROWS * GKW * 2;
constexpr int NG = I / GR;                  // gate/up tasks a pair
constexpr int DST = I / 32;                 // down: 32-element steps over all of I
constexpr int DSLOT = 8 * I * 2;            // a warp-task's weights: 8 rows of I
constexpr int NDC = H / 8;                  // down warp-tasks a pair
static_assert(H % GW == 0 && GKW % 32 == 0 && GKW <= 256, "gate/up: a warp's slice is one TMA box");
static_assert((GR == 4 || GR == 8) && I % GR == 0, "gate/up: 8 or 16 weight rows a task");
static_assert(I % 32 == 0 && DST <= 16 && H % 8 == 0, "down: the act row in registers, twice");

// c += the A tile's step (a: rows 0..7, b: rows 8..15, this lane's elements) times the slot's 8
// weight rows at sb (this lane's column n, elements 8q.. of the step), as cuda_stream_gemv.cu
__device__ __forceinline__ void step2(float* c, uint4 a, uint4 b, const unsigned char* sb) {
    const uint4 wv = *reinterpret_cast<const uint4*>(sb);
    mma(c, a.x, b.x, a.y, b.y, wv.x, wv.y);
    mma(c, a.z, b.z, a.w, b.w, wv.z, wv.w);
}

extern "C" __global__ void __launch_bounds__(32 * GW, 1)
moe_gate_up(const __grid_constant__ TensorMap tm_e, const __grid_constant__ TensorMap tm_s, const bf16* __restrict__ x,
            int xs, const int* ids, bf16* act, int R, int pdl)
{
    constexpr int STAGES = GW * GSPW;
    extern __shared__ __align__(128) unsigned char smem[];
    u64* full = reinterpret_cast<u64*>(smem + STAGES * GSLOT);
    float* part = reinterpret_cast<float*>(full + STAGES);          // [2][GW][GROWS]: the pair row's sums
    int* sid = reinterpret_cast<int*>(part + 2 * GW * GROWS);        // [R * S] the experts
    const int G = gridDim.x, c = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int TS = R * NG, T = R * S * NG;                           // the first TS tasks: the shared expert's
    const int nt = c < T ? (T - 1 - c) / G + 1 : 0;
    unsigned char* mine = smem + warp * GSPW * GSLOT;
    u64* mfull = full + warp * GSPW;

    auto pair_of = [&](int t, int& gq) {                             // task t -> pair, and its column block
        if (t < TS) { gq = t % NG; return (t / NG) * S + S - 1; }
        const int u = t - TS, ri = u / NG;
        gq = u % NG;
        return (ri / (S - 1)) * S + ri % (S - 1);
    };
    auto issue = [&](int j) {                                        // this warp's unit of task j
        int gq;
        const int p = pair_of(c + j * G, gq), sl = j % GSPW;
        if (lane == 0) {
            unsigned char* d = mine + sl * GSLOT;
            const bool sh = p % S == S - 1;
            const void* tm = sh ? (const void*)&tm_s : (const void*)&tm_e;
            const int base = sh ? 0 : sid[p] * 2 * I;
            mbar_expect(&mfull[sl], GSLOT);
            tile_copy(d, tm, warp * GKW, base + gq * GR, &mfull[sl]);
            tile_copy(d + GSLOT / 2, tm, warp * GKW, base + I + gq * GR, &mfull[sl]);
        }
        __syncwarp();
    };

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    int pre = 0;                                                     // the leading shared units: weights only
    while (pre < GSPW && pre < nt && c + pre * G < TS) issue(pre++);
    if (pdl) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        if (TRIG) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    for (int i = tid; i < R * S; i += 32 * GW) sid[i] = __ldcg(ids + i);
    __syncthreads();
    for (int j = pre; j < GSPW && j < nt; ++j) issue(j);

    // the A tile of this warp's slice: x's row n = lane / 4 and n + 8, elements 8q.. of each step
    const int n = lane >> 2, q = lane & 3;
    uint4 xa[GSTEPS], xb[GSTEPS];
    load_a_rows<GSTEPS>(x, xs, R, warp * GKW, lane, xa, xb);

    for (int j = 0; j < nt; ++j) {
        int gq;
        const int p = pair_of(c + j * G, gq), r = p / S, sl = j % GSPW;
        float acc[GCG][4];
#pragma unroll
        for (int g = 0; g < GCG; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.f;
        mbar_wait(&mfull[sl], (j / GSPW) & 1);
        const unsigned char* sb = mine + sl * GSLOT + n * (2 * GKW) + q * 16;
#pragma unroll
        for (int st = 0; st < GSTEPS; ++st)
#pragma unroll
            for (int g = 0; g < GCG; ++g) step2(acc[g], xa[st], xb[st], sb + g * 8 * (2 * GKW) + st * 64);
        __syncwarp();                                                // the slot read
        if (j + GSPW < nt) issue(j + GSPW);
        // row r's columns (slot rows 8g + 2q, +1) are held by the lanes with n == r % 8
        float* pb = part + ((j & 1) * GW + warp) * GROWS;
        if (n == (r & 7)) {
#pragma unroll
            for (int g = 0; g < GCG; ++g) {
                pb[8 * g + 2 * q] = r < 8 ? acc[g][0] : acc[g][2];
                pb[8 * g + 2 * q + 1] = r < 8 ? acc[g][1] : acc[g][3];
            }
        }
        __syncthreads();                                             // (two buffers: the next task's go to the other)
        if (tid < GR) {
            const float* pj = part + (j & 1) * GW * GROWS;
            float gs = 0.f, us = 0.f;
#pragma unroll
            for (int v = 0; v < GW; ++v) {
                gs += pj[v * GROWS + tid];
                us += pj[v * GROWS + GR + tid];
            }
            act[(size_t)p * I + gq * GR + tid] = f2bf(gs / (1.f + expf(-gs)) * us);
        }
    }
}

// Precondition (cuda_stream_moe.pairs): ids were written by the launch before the one before this
// kernel, so they are read before the wait. Each warp works alone: a warp-task is 8 output columns
// of one pair over all of I (one contiguous 8 x I block of the expert's down weights, one bulk
// copy), so no CTA-wide barrier runs a task.
extern "C" __global__ void __launch_bounds__(32 * DW, 1)
moe_down(const bf16* dn_e, const bf16* dn_s, const bf16* act, const int* ids, float* y, int R, int pdl)
{
    constexpr int STAGES = DW * DSPW;
    extern __shared__ __align__(128) unsigned char smem[];
    u64* full = reinterpret_cast<u64*>(smem + STAGES * DSLOT);
    int* sid = reinterpret_cast<int*>(full + STAGES);                // [R * S]
    const int G = gridDim.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int NW = G * DW, gw = warp * G + blockIdx.x;               // warp-task t goes to warp t % NW
    const int T = R * S * NDC;
    const int nt = gw < T ? (T - 1 - gw) / NW + 1 : 0;
    unsigned char* mine = smem + warp * DSPW * DSLOT;
    u64* mfull = full + warp * DSPW;

    auto issue = [&](int j) {
        const int t = gw + j * NW, p = t / NDC, sl = j % DSPW;
        if (lane == 0) {
            const bf16* src = (p % S == S - 1 ? dn_s : dn_e + (size_t)sid[p] * H * I) + (size_t)(t % NDC) * 8 * I;
            mbar_expect(&mfull[sl], DSLOT);
            bulk_copy(mine + sl * DSLOT, src, DSLOT, &mfull[sl]);
        }
        __syncwarp();
    };

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    for (int i = tid; i < R * S; i += 32 * DW) sid[i] = __ldcg(ids + i);
    __syncthreads();
    for (int j = 0; j < DSPW && j < nt; ++j) issue(j);
    if (pdl) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        if (TRIG) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }

    // the A tile: row slot 0 is act[p] (lanes 0..3 hold its elements 8q.. of each step), the rest
    // zero; the next task's row is loaded while this one's is used
    const int n = lane >> 2, q = lane & 3;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 cur[DST], nxt[DST];
    auto load_a = [&](int j, uint4* a) {
        const bf16* ar = act + (size_t)((gw + j * NW) / NDC) * I + q * 8;
#pragma unroll
        for (int s = 0; s < DST; ++s) a[s] = (n == 0 && j < nt) ? ldcg16(ar + s * 32) : zero;
    };
    load_a(0, cur);
    for (int j = 0; j < nt; ++j) {
        const int t = gw + j * NW, p = t / NDC, sl = j % DSPW;
        load_a(j + 1, nxt);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        mbar_wait(&mfull[sl], (j / DSPW) & 1);
        const unsigned char* sb = mine + sl * DSLOT + n * (2 * I) + q * 16;
#pragma unroll
        for (int st = 0; st < DST; ++st) step2(acc, cur[st], zero, sb + st * 64);
        __syncwarp();                                                // the slot read
        if (j + DSPW < nt) issue(j + DSPW);
        if (n == 0) {                                                // row 0: columns 2q, 2q + 1
            float2* dst = reinterpret_cast<float2*>(y + (size_t)p * H + (t % NDC) * 8 + 2 * q);
            *dst = make_float2(acc[0], acc[1]);
        }
#pragma unroll
        for (int s = 0; s < DST; ++s) cur[s] = nxt[s];
    }
}
