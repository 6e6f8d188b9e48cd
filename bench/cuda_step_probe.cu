// The ceiling of a persistent "megakernel" decode step (bench/cuda_step_probe.py): one grid, a CTA
// per SM, streams a whole step's weight bytes phase by phase, with a grid barrier wherever the real
// step has a data dependency (a kernel boundary of the current design), and computes nothing but a
// read of each unit. What it measures is how near the copy rate a step's byte stream can get with
// the step's dependencies when weights are requested ahead across the barriers (as a megakernel's
// loads could be), against the same stream without barriers and without requests across them.
//
// Work: phase p owns units [off[p], off[p+1]) of UNIT bytes; unit u of a phase goes to worker
// (u - off[p]) % NW (worker = warp * G + CTA, so consecutive units go to different SMs). Each warp
// owns SPW slots filled by one bulk copy each (mbarrier completion, as cuda_stream_gemv.cu), and
// requests its units in order as slots free: a unit of phase q may be requested once the CTA is in
// phase from[q] or later (from[q] = 0: a weight known before the step; the routed experts' phases:
// the phase after the router). barriers 1: a grid barrier after every phase, CTA 0 first spinning
// spin[p] ns (a latency-bound step's chain of loads and reductions, or a fold's added work);
// barrier_mode: which grid barrier (grid_sync_mode).
// Compiled by NVRTC with -D WARPS and SPW.

#include "cuda_device.cuh"
// (bench/cuda_probe.cuh comes in front: cuda_step_probe.probe_source)

constexpr int THREADS = 32 * WARPS;
constexpr int UNIT = 8192;
constexpr int LINE = 32;       // unsigned counters a 128-byte line

// Two other grid barriers than cuda_device.cuh's grid_sync (a fence, then an atomic add), to see what
// a megakernel's barrier could cost. mode 1: the arrival one release reduction (no full fence, no
// returned value), as CUTLASS's GenericBarrier arrives; the CTA's writes are ordered before it by the
// __syncthreads and the release's cumulativity. mode 2: the same with the arrivals spread over 8
// counters on their own lines (fewer reductions queued at one L2 slice); a CTA passes once the 8 sum
// to the target. ctr: 8 lines of counters, zeroed before the launch.
__device__ __forceinline__ void grid_sync_mode(unsigned* ctr, unsigned target, int mode) {
    if (mode == 0) {
        grid_sync(ctr, target);
        return;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* mine = ctr + (mode == 2 ? (blockIdx.x & 7) * LINE : 0);
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(mine) : "memory");
        unsigned sum;
        do {
            sum = 0;
            for (int i = 0; i < (mode == 2 ? 8 : 1); ++i) {
                unsigned v;
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr + i * LINE) : "memory");
                sum += v;
            }
        } while (sum < target);
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
step_probe(const unsigned char* w, const long long* off, const int* from, int P, unsigned* ctr, unsigned* sink,
           int barriers, const long long* spin, int barrier_mode)
{
    extern __shared__ __align__(128) unsigned char smem[];
    u64* full = reinterpret_cast<u64*>(smem + WARPS * SPW * UNIT);
    const int G = gridDim.x, c = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long NW = (long long)G * WARPS, wid = (long long)warp * G + c;
    unsigned char* mine = smem + warp * SPW * UNIT;
    u64* mfull = full + warp * SPW;
    if (tid == 0) {
        for (int s = 0; s < WARPS * SPW; ++s) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // a (phase, unit) cursor over this warp's units: moved past phases that hold none of them
    auto settle = [&](int& p, long long& u) {
        while (p < P && u >= off[p + 1]) {
            ++p;
            if (p < P) u = off[p] + wid;
        }
    };
    int ip = 0, cp = 0;                       // the phases of the next unit to request, to consume
    long long iu = off[0] + wid, cu = off[0] + wid;
    settle(ip, iu);
    settle(cp, cu);
    int issued = 0, consumed = 0;
    unsigned acc = 0;
    for (int p = 0; p < P; ++p) {
        for (;;) {
            while (ip < P && issued - consumed < SPW && p >= from[ip]) {
                const int sl = issued % SPW;
                if (lane == 0) {
                    mbar_expect(&mfull[sl], UNIT);
                    bulk_copy(mine + sl * UNIT, w + (size_t)iu * UNIT, UNIT, &mfull[sl]);
                }
                __syncwarp();
                ++issued;
                iu += NW;
                settle(ip, iu);
            }
            if (cp != p) break;               // this warp has no more units in phase p
            const int sl = consumed % SPW;
            mbar_wait(&mfull[sl], (consumed / SPW) & 1);
            acc ^= xor_unit<UNIT>(mine + sl * UNIT, lane);
            __syncwarp();                     // the slot read: it may be refilled
            ++consumed;
            cu += NW;
            settle(cp, cu);
        }
        if (barriers && p + 1 < P) {
            const long long ns = spin[p];
            if (ns > 0 && c == 0 && tid == 0) spin_ns(ns);
            grid_sync_mode(ctr, (unsigned)(p + 1) * G, barrier_mode);
        }
    }
    if (lane == 0) sink[c * WARPS + warp] = acc;
}
