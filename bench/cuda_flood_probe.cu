// What a latency-bound kernel's loads pay while a stream product's weight requests are queued
// (bench/cuda_flood_probe.py says why). One launch, a CTA an SM: warps 0-7 of a flooding CTA each
// request `units` bulk copies of UNIT bytes from DRAM into their slots (all at once, or with pace
// each after the one before it landed), as a stream product does before its wait; meanwhile lane 0
// of warp 8 of CTA 0 walks `steps` dependent loads (idx = chase[idx], at L2) and stamps the global
// timer around the walk. mode 0: nobody floods; 1: every CTA, the prober's too; 2: all but CTA 0.

#include "cuda_device.cuh"

#define UNIT 8192

extern "C" __global__ void __launch_bounds__(288, 1)
flood_probe(const unsigned char* big, const unsigned* chase, unsigned start, int steps, int units, int pace, int mode,
            long long* out)
{
    extern __shared__ __align__(128) unsigned char smem[];
    u64* bar = reinterpret_cast<u64*>(smem + 24 * UNIT);
    const int c = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool floods = mode == 1 || (mode == 2 && c != 0);
    if (threadIdx.x == 0) {
        for (int s = 0; s < 24; ++s) mbar_init(&bar[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    if (warp < 8 && floods && lane == 0) {
        for (int u = 0; u < units; ++u) {
            const int s = warp * 3 + u;
            mbar_expect(&bar[s], UNIT);
            bulk_copy(smem + s * UNIT, big + ((size_t)c * 24 + s) * UNIT, UNIT, &bar[s]);
            if (pace && u + 1 < units) mbar_wait(&bar[s], 0);
        }
    }
    if (warp == 8 && c == 0 && lane == 0) {
        long long ts, te;
        unsigned idx = start;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ts));
        for (int i = 0; i < steps; ++i) idx = __ldcg(chase + idx);
        // the stamp after the last load: the predicate reads idx, so it waits for it
        asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %1, 4294967295;\n\tmov.u64 %0, %%globaltimer;\n}"
                     : "=l"(te) : "r"(idx));
        out[0] = ts - t0;
        out[1] = te - ts;
        out[2] = idx;
    }
    if (warp < 8 && floods)
        for (int u = 0; u < units; ++u) mbar_wait(&bar[warp * 3 + u], 0);
    __syncthreads();
    if (threadIdx.x == 0) {
        long long t1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        out[8 + c] = t1 - t0;
    }
}
