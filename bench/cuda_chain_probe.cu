// The ceiling of a decode step as a chain of kernels (bench/cuda_chain_probe.py): the step's phases
// (bench/cuda_step_probe.py's) as one launch each, chained by programmatic dependent launch in a CUDA
// graph, each streaming its phase's weight bytes and computing nothing but a read of each unit. A
// kernel boundary is the hardware's (0.40-0.53 us in a graphed PDL chain: bench/cuda_boundary_probe.py),
// not a grid barrier in memory (1.2-1.5 us: bench/cuda_step_probe.py); what a chain lacks is requests
// across boundaries, which it gets only from the kernels already resident: each kernel may request
// its first units before griddepcontrol.wait (pre), and may let the next kernel launch before its own
// wait (early), so the chain runs as many kernels ahead as fit beside each other on the SMs.
// Compiled by NVRTC with -D WARPS and SPW.

#include "cuda_device.cuh"
// (bench/cuda_probe.cuh comes in front: cuda_step_probe.probe_source)

constexpr int THREADS = 32 * WARPS;
constexpr int UNIT = 8192;

// a phase of n units from unit u0: unit u0 + j goes to worker j % NW (worker = warp * G + CTA), each
// warp with SPW slots filled by one bulk copy each, requested in order as slots free; CTA 0 spins ns
// at the end
extern "C" __global__ void __launch_bounds__(THREADS)
chain_phase(const unsigned char* w, long long u0, long long n, long long ns, int pre, int early, unsigned* sink)
{
    extern __shared__ __align__(128) unsigned char smem[];
    u64* full = reinterpret_cast<u64*>(smem + WARPS * SPW * UNIT);
    const int G = gridDim.x, c = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long NW = (long long)G * WARPS, wid = (long long)warp * G + c;
    unsigned char* mine = smem + warp * SPW * UNIT;
    u64* mfull = full + warp * SPW;
    if (lane == 0)
        for (int s = 0; s < SPW; ++s) mbar_init(&mfull[s]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    long long iu = wid, cu = wid;               // the next unit (of the phase) to request, to consume
    int issued = 0, consumed = 0;
    auto request = [&]() {
        while (iu < n && issued - consumed < SPW) {
            const int sl = issued % SPW;
            if (lane == 0) {
                mbar_expect(&mfull[sl], UNIT);
                bulk_copy(mine + sl * UNIT, w + (size_t)(u0 + iu) * UNIT, UNIT, &mfull[sl]);
            }
            __syncwarp();
            ++issued;
            iu += NW;
        }
    };
    if (pre) request();                         // weights: nothing the previous kernel writes
    if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned acc = 0;
    for (;;) {
        request();
        if (cu >= n) break;
        const int sl = consumed % SPW;
        mbar_wait(&mfull[sl], (consumed / SPW) & 1);
        acc ^= xor_unit<UNIT>(mine + sl * UNIT, lane);
        __syncwarp();                           // the slot read: it may be refilled
        ++consumed;
        cu += NW;
    }
    if (ns > 0 && c == 0 && tid == 0) spin_ns(ns);   // a fold's added latency (cuda_step_probe's costed phases)
    if (lane == 0 && acc == 0x9e3779b9u) sink[c * WARPS + warp] = acc;   // keeps the reads; almost never stores
}

// a phase that moves no bytes: one CTA spins ns (a latency-bound kernel's chain of loads and reductions)
extern "C" __global__ void chain_small(long long ns, int early)
{
    if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0 && ns > 0) spin_ns(ns);
}
