// A decode/verify matrix product y [R, N] = x [R, K] . W[N, K]^T (R <= 16) whose weights are
// requested before the previous kernel is done.
//
// Why: between a layer's products run latency-bound kernels (the recurrence and the gated
// norm, the attention's three, the MoE's combine) during which the DRAM is nearly idle. The
// weights never change, so a product can ask for them while those run; the Triton product can
// only ask after its griddepcontrol.wait (a register preload streams at ~2.3 TB/s and a TMA
// version in Triton needed K split 8-16 ways: docs/cuda-history.md, eleventh session). Here the copy
// engine (TMA) fills shared memory: each warp owns SPW slots, and the first SPW units of every
// warp (up to ~200 KB a SM, ~26 MB over the GPU) are requested before the wait.
//
// Work: a task is TC consecutive output columns (TC = 8 * CG) over all of K, tasks dealt to
// CTAs in turn (task c, c + G, ...). Within a CTA warp w owns the K slice [w*KW, (w+1)*KW);
// a unit is the task's TC columns over KC elements of that slice (one TMA tile, see Copies),
// UPW units a task. A warp accumulates its slice with tensor-core products
// (mma m16n8k16: the 16 row slots as A, 8 weight columns as B), the warps' partial sums are
// added in warp order through shared memory, and the sum is rounded once to bf16.
//
// Exactness: the 16 row slots always run (rows past R are zeros), every sum has one fixed
// order (a warp's units in K order, in each unit its 32-element steps in order, each step two
// mma in order, then the warps 0..WARPS-1), and which CTA takes a task depends on N alone. So
// the instructions a row's output goes through, and their order, do not depend on R; an output
// element of an mma depends only on its own row of A and column of B.
//
// CONV: the task's columns below C are the DeltaNet's conv channels (C a multiple of TC; they
// are a CTA's first tasks): their rounded sums are held in shared memory, and after the CTA's
// last conv task a thread a column runs the causal conv (kernel 4) over rows 0..R-1 in order
// (all the CTA's conv columns at once while the next tasks' weights arrive: a thread a column
// per task stalled the CTA R times a task), its weights read before the wait, as
// cuda_gemv._conv_epilogue does (out = silu(r0 w0 + r1 w1 + r2 w2 + x w3), the ring shifting x
// in, the ring after row r < R-1 to the slot at tab[r] when save), and updates the ring.
//
// Memory: before the wait only weights are read (bulk copies). After it, x, the ring and the
// slot table are read at L2 (written by earlier kernels); out, the ring and the slots are
// written. TRIG 1 lets the next kernel launch right after the wait, 0 at the end.
//
// Copies: TMA2D 1 requests a unit as one tile of the weight's tensor map (a 2D TMA copy, 3.5
// TB/s alone, device call 90); 0 as TC bulk copies of one column's 2*KC bytes (512-byte
// requests: 2.7-2.8 TB/s, call 86).
//
// Before the wait: PRE units a warp (at most SPW; the rest right after the wait), all at once or,
// with PACE, each after the one before it has landed, so that a warp has one request in the
// memory system at a time while the kernels before this one run (their loads queue behind ours).
// EVF: the copies ask L2 to evict the weights first (they are read once a step).
//
// L2PF (an experiment, built only where cuda_stream_gemv.L2_NEXT names this weight): l2n bytes from l2p,
// another product's weights (the next layer's input product, read after the MoE between them),
// split among the CTAs in order, are asked into L2 by the copy engine, before the wait (L2AT 0)
// or right after it (1), with an evict-last policy (L2EL) or none: the DRAM is nearly idle while
// the recurrence, the norms and the router run, and that product's weights past the slots it can
// request before its own wait come from L2 then. Only weights are touched; no value changes.
//
// REGT (an experiment, 0 off): the units past a warp's SPW slots (the ones requested after the wait) are
// read by the warp's lanes straight into registers (16-byte loads: ld.global.cs with REGT 1, ld.global.nc
// with 2), the next such unit's loads in flight while the one before is multiplied, instead of TMA tiles into
// the freed slots. A burst of 52 MB streamed 3.46 TB/s by register loads against 3.0 by bulk copies on the
// H200 (bench/cuda_flood_probe.py, calls 135-136). A lane loads exactly the 16 bytes it would read from the
// slot, so every mma sees the same operands and the bits do not move. Measured 1.09-1.10x slower at one
// row on two H100s (docs/cuda.md, calls 306-307).
//
// DYN (an experiment, 0 off; with ns0 > AH, else every task in turn): a CTA takes tasks c + j*G for j < ns0 as above, and the
// rest (ns0*G .. N/TC-1) by tickets from a 64-bit counter of this call site (dyn_ctr[site], in the
// module: zero at load, never put back), so the CTAs that get their bytes sooner take the tail. Every
// launch of a site takes exactly D + G tickets (D tasks, then one that fails for each CTA), so ticket t
// stands for task ns0*G + t mod (D + G) where that is below D: no CTA has to count the others out (a
// last-CTA reset put an atomic round trip and a fence at the end of every launch). The first ticket is
// asked after the wait (a launch of the same site just before this one may still be dealing), each next
// one a task ahead, by thread 0, and handed to the warps through a ring of 8 in shared memory (tq), AH
// tasks before the warps request their units. Which CTA computes a task moves no bit (the sums above
// depend on the task alone); the conv tasks are all static. Measured 1.04-1.05x slower at one row on
// two H100s (docs/cuda.md, calls 306-307).
//
// MAXREG (0: the compiler's choice): registers a thread at most, so that a CTA fits beside another
// kernel's on an SM (bench/cuda_bench.py --sections coresident).
//
// Compiled at run time by NVRTC (cuda_stream_gemv.py) with -D for K, CG, WARPS, KC, SPW, CONV,
// TRIG, TMA2D, PRE, PACE, EVF, REGT, DYN, MAXREG, L2PF, L2AT and L2EL. bf16 is handled as its bits (cuda_device.cuh).

#include "cuda_device.cuh"

#ifndef PRE
#define PRE SPW
#endif
#ifndef PACE
#define PACE 0
#endif
#ifndef EVF
#define EVF 0
#endif
#ifndef MAXREG
#define MAXREG 0
#endif
#ifndef REGT
#define REGT 0
#endif
#ifndef DYN
#define DYN 0
#endif
#ifndef L2PF
#define L2PF 0
#endif
#ifndef L2AT
#define L2AT 1
#endif
#ifndef L2EL
#define L2EL 0
#endif
#if MAXREG
#define STREAM_BOUNDS __maxnreg__(MAXREG)
#else
#define STREAM_BOUNDS __launch_bounds__(THREADS, 1)
#endif

constexpr int THREADS = 32 * WARPS;
constexpr int TC = 8 * CG;                  // output columns a task
constexpr int KW = K / WARPS;               // a warp's K slice
constexpr int UPW = KW / KC;                // units a warp a task
constexpr int STEPS = KC / 32;              // 32-element steps a unit
constexpr int XS = KW / 32;                 // steps in a warp's slice (x held in registers)
constexpr int SLOTB = TC * KC * 2;          // bytes a slot
constexpr int STAGES = WARPS * SPW;
static_assert(K % WARPS == 0 && KW % KC == 0 && KC % 32 == 0, "units tile a warp's slice");
static_assert(CG == 1 || CG == 2, "8 or 16 columns a task");
static_assert(THREADS >= 16 * TC / 2, "the reduction: two elements a thread at most");
constexpr int AH = (UPW - 1 + SPW) / UPW;   // tasks past the one in hand whose units a warp may request

// unit u's products into acc, B for (step st, group g) from b_at(st, g): column n of group g, elements 8q..
// of step st (the same element positions as the A tile's: logical k 2q+e <-> 8q+e, 2q+8+e <-> 8q+2+e, and
// 8q+4.., 8q+6.. for the second product). A template, not a generic lambda: NVRTC 13.0 takes a generic
// lambda's operator for a host function in JIT mode and fails the build (device call 339; 13.3 and 13.5 take it).
template <class BAt>
__device__ __forceinline__ void unit_products(float (&acc)[CG][4], const uint4 (&xa)[XS], const uint4 (&xb)[XS],
                                              int u, BAt b_at) {
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
        const uint4 a = xa[u * STEPS + st], b = xb[u * STEPS + st];
#pragma unroll
        for (int g = 0; g < CG; ++g) {
            const uint4 wv = b_at(st, g);
            mma(acc[g], a.x, b.x, a.y, b.y, wv.x, wv.y);
            mma(acc[g], a.z, b.z, a.w, b.w, wv.z, wv.w);
        }
    }
}

#if DYN
__device__ unsigned long long dyn_ctr[512];  // DYN: the tickets a site's launches have taken
#endif

extern "C" __global__ void STREAM_BOUNDS
stream_gemv(const __grid_constant__ TensorMap tmap, const bf16* __restrict__ x, int xs, const bf16* w, bf16* out,
            int R, int N,
            bf16* ring, const bf16* __restrict__ cw, const u64* tab, int C, int save, int pdl, u64* stamps,
            const unsigned char* l2p, u64 l2n
#if DYN
            , int ns0, int site
#endif
            )
{
    const u64 st0 = STAMPS ? gtimer() : 0;
    extern __shared__ __align__(128) unsigned char smem[];
    u64* full = reinterpret_cast<u64*>(smem + STAGES * SLOTB);     // a slot's bytes have landed
    float* part = reinterpret_cast<float*>(full + STAGES);         // [2][WARPS][16 rows][TC]
    float* held = part + 2 * WARPS * 16 * TC;                      // CONV: [tasks][16 rows][TC], the rounded sums
    const int G = gridDim.x, c = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int NT = N / TC;
    const int nt = c < NT ? (NT - 1 - c) / G + 1 : 0;
    const int TW = nt * UPW;                                        // this warp's units (static)
#if DYN
    const bool dyn = ns0 > AH;               // (dyn_static's ns0: the first ticket is needed a task after the wait)
    unsigned long long* ctr = dyn_ctr + site;
    __shared__ int tq[8];                    // the task of CTA-local task j >= ns0 at tq[(j - ns0) & 7] (-1: none)
    const int D = NT - ns0 * G;              // tasks dealt by tickets
    unsigned long long pend = 0;             // thread 0: the ticket in flight
    bool spent = false;                      // thread 0: a ticket has failed
    int filled = ns0;                        // thread 0: the next local task to put in the ring
    // thread 0: the ring up to local task upto, each ticket used as the next one is asked for
    auto fill = [&](int upto) {
        for (; filled <= upto; ++filled) {
            int id = -1;
            if (!spent) {
                const int t = (int)(pend % (unsigned long long)(D + G));
                if (t < D) { id = ns0 * G + t; pend = atomicAdd(ctr, 1ull); }
                else spent = true;
            }
            tq[(filled - ns0) & 7] = id;
        }
    };
    // global task of local task j (-1: this CTA has no task j)
    auto task_of = [&](int j) { return !dyn ? (j < nt ? c + j * G : -1) : j < ns0 ? c + j * G : tq[(j - ns0) & 7]; };
#define TASK(j) task_of(j)
#define HAS_TASK(j) (task_of(j) >= 0)
#define HAS_UNIT(i) (task_of((i) / UPW) >= 0)
#else
#define TASK(j) (c + (j) * G)
#define HAS_TASK(j) ((j) < nt)
#define HAS_UNIT(i) ((i) < TW)
#endif
    unsigned char* mine = smem + warp * SPW * SLOTB;
    u64* mfull = full + warp * SPW;

    // this warp's unit i into its slot i % SPW: TMA2D, lane 0 arms the barrier and copies the tile
    // (one request); else lanes 0..TC-1 copy a column each (TC requests of 2*KC bytes)
    auto issue = [&](int i) {
        const int j = i / UPW, u = i % UPW, sl = i % SPW, tk = TASK(j);
        if (TMA2D) {
            if (lane == 0) {
                mbar_expect(&mfull[sl], SLOTB);
                if (EVF)
                    tile_copy_hint(mine + sl * SLOTB, &tmap, warp * KW + u * KC, tk * TC, &mfull[sl],
                                   evict_first_policy());
                else
                    tile_copy(mine + sl * SLOTB, &tmap, warp * KW + u * KC, tk * TC, &mfull[sl]);
            }
            __syncwarp();
            return;
        }
        if (lane == 0) mbar_expect(&mfull[sl], SLOTB);
        __syncwarp();
        if (lane < TC) {
            const size_t col = (size_t)tk * TC + lane;
            bulk_copy(mine + sl * SLOTB + lane * (2 * KC), w + col * K + warp * KW + u * KC, 2 * KC, &mfull[sl]);
        }
    };

    // REGT: this warp's unit i (past its slots) into registers, each lane the 16 bytes of every step and
    // column group that it reads from a slot in the loop below (column n, elements 8q.. of step st)
    auto load_regs = [&](int i, uint4* rb) {
        const int j = i / UPW, u = i % UPW;
        const bf16* src = w + (size_t)(TASK(j) * TC + (lane >> 2)) * K + warp * KW + u * KC + (lane & 3) * 8;
#pragma unroll
        for (int st = 0; st < STEPS; ++st)
#pragma unroll
            for (int g = 0; g < CG; ++g) {
                const uint4* p4 = reinterpret_cast<const uint4*>(src + (size_t)g * 8 * K + st * 32);
                rb[st * CG + g] = REGT == 1 ? __ldcs(p4) : __ldg(p4);
            }
    };

    // L2: this CTA's share of the l2n bytes (16-byte multiples), in requests of at most 64 KiB
    auto l2_ask = [&]() {
        if (tid != 0 || l2n == 0) return;
        const u64 share = ((l2n / G) + 15) & ~15ull, lo = share * c, hi = lo + share < l2n ? lo + share : l2n;
        for (u64 a = lo; a < hi; a += 65536) {
            const unsigned b = (unsigned)(hi - a < 65536 ? hi - a : 65536);
            if (L2EL) l2_prefetch_hint(l2p + a, b, evict_last_policy());
            else l2_prefetch(l2p + a, b);
        }
    };

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    constexpr int NPRE = PRE < SPW ? PRE : SPW;
    for (int i = 0; i < NPRE && i < TW; ++i) {                    // weights only: before the wait
        issue(i);
        if (PACE && i + 1 < NPRE && i + 1 < TW) mbar_wait(&mfull[i], 0);
    }
    if (L2PF && L2AT == 0) l2_ask();
    // CONV: this CTA's first ncv tasks are conv columns; thread t < ncv * TC keeps column t's conv
    // weights (read before the wait: weights) and ring (after it) in registers
    const int ncv = CONV && c * TC < C ? min(nt, (C / TC - 1 - c) / G + 1) : 0;
    const bool conv_t = tid < ncv * TC;
    const int cv_col = (c + (tid / TC) * G) * TC + tid % TC;
    float w0 = 0.f, w1 = 0.f, w2 = 0.f, w3 = 0.f, r0 = 0.f, r1 = 0.f, r2 = 0.f;
    if (conv_t) {
        w0 = bf2f(__ldg(cw + cv_col * 4)); w1 = bf2f(__ldg(cw + cv_col * 4 + 1));
        w2 = bf2f(__ldg(cw + cv_col * 4 + 2)); w3 = bf2f(__ldg(cw + cv_col * 4 + 3));
    }
    if (pdl) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        if (TRIG) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    if (L2PF && L2AT == 1) l2_ask();
    const u64 st1 = STAMPS ? gtimer() : 0;
    u64 st2 = 0;                              // STAMPS: when this warp's first unit had landed
#if DYN
    // the first ticket only after the wait: a launch of this site just before this one (a product called
    // twice in a row, launched early by PDL) deals from the same counter until it completes
    if (dyn && tid == 0) pend = atomicAdd(ctr, 1ull);
#endif
    for (int i = NPRE; i < SPW && i < TW; ++i) issue(i);
    uint4 rb[REGT ? STEPS * CG : 1];          // REGT: the next register unit, in flight
    if (REGT && HAS_UNIT(SPW)) load_regs(SPW, rb);

    if (conv_t) {
        r0 = bf2f(__ldcg(ring + cv_col * 3)); r1 = bf2f(__ldcg(ring + cv_col * 3 + 1));
        r2 = bf2f(__ldcg(ring + cv_col * 3 + 2));
    }

    // the A tiles of this warp's slice: row n = lane / 4 and n + 8, elements 8q..8q+7 of each step
    const int n = lane >> 2, q = lane & 3;
    uint4 xa[XS], xb[XS];
    load_a_rows<XS>(x, xs, R, warp * KW, lane, xa, xb);

    for (int j = 0; HAS_TASK(j); ++j) {
        float acc[CG][4];
#pragma unroll
        for (int g = 0; g < CG; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.f;
#pragma unroll
        for (int u = 0; u < UPW; ++u) {
            const int i = j * UPW + u, sl = i % SPW;
            if (REGT && i >= SPW) {           // a register unit: the next one's loads go out before this one's products
                uint4 cur[REGT ? STEPS * CG : 1];
#pragma unroll
                for (int e = 0; e < (REGT ? STEPS * CG : 1); ++e) cur[e] = rb[e];
                if (HAS_UNIT(i + 1)) load_regs(i + 1, rb);
                unit_products(acc, xa, xb, u, [&](int st, int g) { return cur[REGT ? st * CG + g : 0]; });
                continue;
            }
            mbar_wait(&mfull[sl], (i / SPW) & 1);
            if (STAMPS && i == 0) st2 = gtimer();
            const unsigned char* sb = mine + sl * SLOTB + n * (2 * KC) + q * 16;
            unit_products(acc, xa, xb, u, [&](int st, int g) {
                return *reinterpret_cast<const uint4*>(sb + g * 8 * (2 * KC) + st * 64);
            });
            __syncwarp();                     // the slot read: this warp's next unit may overwrite it
            if (!REGT && HAS_UNIT(i + SPW)) issue(i + SPW);
        }
        // acc[g]: (row n, columns 8g + 2q, +1) and (row n + 8, the same columns)
        float* pb = part + ((j & 1) * WARPS + warp) * (16 * TC);
#pragma unroll
        for (int g = 0; g < CG; ++g) {
            pb[n * TC + 8 * g + 2 * q] = acc[g][0];
            pb[n * TC + 8 * g + 2 * q + 1] = acc[g][1];
            pb[(n + 8) * TC + 8 * g + 2 * q] = acc[g][2];
            pb[(n + 8) * TC + 8 * g + 2 * q + 1] = acc[g][3];
        }
#if DYN
        const int col0 = TASK(j) * TC;        // read before the barrier: its ring slot may be refilled after it
        if (dyn && tid == 0) fill(j + 1 + AH);   // the tasks the next consumption may request
#endif
        __syncthreads();                      // (two buffers: the next task's partials go to the other)
        const float* pj = part + (j & 1) * WARPS * (16 * TC);
#if !DYN
        const int col0 = (c + j * G) * TC;
#endif
        if (CONV && j < ncv) {                // kept for the conv after the CTA's last conv task
            for (int e = tid; e < 16 * TC; e += THREADS) {
                float sum = 0.f;
#pragma unroll
                for (int v = 0; v < WARPS; ++v) sum += pj[v * (16 * TC) + e];
                held[j * 16 * TC + e] = round_bf(sum);
            }
            if (j == ncv - 1) {
                // the conv of all of them at once, a thread a column, row after row (the ring
                // carries from one row to the next); the next tasks' weights are on their way
                __syncthreads();
                if (conv_t) {
                    const int jj = tid / TC, cc = tid % TC;
                    for (int r = 0; r < R; ++r) {
                        const float xv = held[jj * 16 * TC + r * TC + cc];
                        float a = r0 * w0;
                        a = fmaf(r1, w1, a);
                        a = fmaf(r2, w2, a);
                        a = fmaf(xv, w3, a);
                        out[(size_t)r * N + cv_col] = f2bf(a / (1.f + expf(-a)));
                        r0 = r1; r1 = r2; r2 = xv;
                        if (save && r < R - 1) {
                            bf16* slot = reinterpret_cast<bf16*>(__ldcg(tab + r));
                            slot[cv_col * 3] = f2bf(r0); slot[cv_col * 3 + 1] = f2bf(r1); slot[cv_col * 3 + 2] = f2bf(r2);
                        }
                    }
                    ring[cv_col * 3] = f2bf(r0); ring[cv_col * 3 + 1] = f2bf(r1); ring[cv_col * 3 + 2] = f2bf(r2);
                }
            }
        } else {
            for (int e = tid; e < 16 * TC; e += THREADS) {
                const int r = e / TC, cc = e % TC;
                if (r < R) {
                    float s = 0.f;
#pragma unroll
                    for (int v = 0; v < WARPS; ++v) s += pj[v * (16 * TC) + e];
                    out[(size_t)r * N + col0 + cc] = f2bf(s);
                }
            }
        }
    }
    if (STAMPS) stamp_end(stamps, (u64)N, st0, st1, st2);
}
