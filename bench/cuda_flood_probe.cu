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
    const long long t0 = (long long)gtimer();
    if (warp < 8 && floods && lane == 0) {
        for (int u = 0; u < units; ++u) {
            const int s = warp * 3 + u;
            mbar_expect(&bar[s], UNIT);
            bulk_copy(smem + s * UNIT, big + ((size_t)c * 24 + s) * UNIT, UNIT, &bar[s]);
            if (pace && u + 1 < units) mbar_wait(&bar[s], 0);
        }
    }
    if (warp == 8 && c == 0 && lane == 0) {
        unsigned idx = start;
        const long long ts = (long long)gtimer();
        for (int i = 0; i < steps; ++i) idx = __ldcg(chase + idx);
        const long long te = (long long)gtimer_after(__uint_as_float(idx));   // waits for the last load
        out[0] = ts - t0;
        out[1] = te - ts;
        out[2] = idx;
    }
    if (warp < 8 && floods)
        for (int u = 0; u < units; ++u) mbar_wait(&bar[warp * 3 + u], 0);
    __syncthreads();
    if (threadIdx.x == 0) out[8 + c] = (long long)gtimer() - t0;
}

// The streaming rate of three ways to read weights, a CTA an SM, 8 warps, each warp streaming
// `units` units of UNIT bytes (its share of a contiguous region): method 0 a bulk copy a unit (the
// TMA engine, as the stream products) through `depth` slots (1-3), 1 cp.async of 16 bytes a lane
// (LDGSTS, the load/store units) through 3 slots, 2 plain 16-byte loads into registers (`depth` a
// lane in flight: 4, 8 or 16). Every byte is read
// once from shared memory or registers and folded, so nothing is dropped. The CTA's time from start
// to end by the global timer is out[blockIdx].
__device__ __forceinline__ void cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(saddr(dst)), "l"(src) : "memory");
}

// a warp's units by plain 16-byte loads, D a lane in flight
template <int D>
__device__ __forceinline__ unsigned reg_stream(const unsigned char* mine, int units, int lane) {
    const uint4* p = reinterpret_cast<const uint4*>(mine);
    const int n = units * (UNIT / 16);
    unsigned acc = 0;
    for (int i = lane; i < n; i += 32 * D) {
        uint4 v[D];
#pragma unroll
        for (int j = 0; j < D; ++j) v[j] = i + j * 32 < n ? __ldcs(p + i + j * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < D; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    return acc;
}

extern "C" __global__ void __launch_bounds__(256, 1)
stream_rate(const unsigned char* big, int units, int method, int depth, unsigned* sink, long long* out)
{
    extern __shared__ __align__(128) unsigned char smem[];
    u64* bar = reinterpret_cast<u64*>(smem + 24 * UNIT);
    const int c = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned char* mine = big + ((size_t)c * 8 + warp) * (size_t)units * UNIT;
    unsigned char* slots = smem + warp * 3 * UNIT;
    if (threadIdx.x == 0) {
        for (int s = 0; s < 24; ++s) mbar_init(&bar[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const long long t0 = (long long)gtimer();
    unsigned acc = 0;
    if (method == 0) {
        u64* wb = bar + warp * 3;
        for (int u = 0; u < depth && u < units; ++u) {
            if (lane == 0) { mbar_expect(&wb[u], UNIT); bulk_copy(slots + u * UNIT, mine + (size_t)u * UNIT, UNIT, &wb[u]); }
        }
        for (int u = 0; u < units; ++u) {
            const int s = u % depth;
            mbar_wait(&wb[s], (u / depth) & 1);
            acc ^= xor_unit<UNIT>(slots + s * UNIT, lane);
            __syncwarp();
            if (lane == 0 && u + depth < units) {
                mbar_expect(&wb[s], UNIT);
                bulk_copy(slots + s * UNIT, mine + (size_t)(u + depth) * UNIT, UNIT, &wb[s]);
            }
        }
    } else if (method == 1) {
        auto issue = [&](int u) {
#pragma unroll
            for (int j = 0; j < UNIT / 16 / 32; ++j)
                cp16(slots + (u % 3) * UNIT + (j * 32 + lane) * 16, mine + (size_t)u * UNIT + (j * 32 + lane) * 16);
            asm volatile("cp.async.commit_group;" ::: "memory");
        };
        for (int u = 0; u < 3; ++u) {
            if (u < units) issue(u);
            else asm volatile("cp.async.commit_group;" ::: "memory");
        }
        for (int u = 0; u < units; ++u) {
            asm volatile("cp.async.wait_group 2;" ::: "memory");
            __syncwarp();
            acc ^= xor_unit<UNIT>(slots + (u % 3) * UNIT, lane);
            __syncwarp();
            if (u + 3 < units) issue(u + 3);
            else asm volatile("cp.async.commit_group;" ::: "memory");
        }
    } else if (depth == 4) {
        acc = reg_stream<4>(mine, units, lane);
    } else if (depth == 16) {
        acc = reg_stream<16>(mine, units, lane);
    } else {
        acc = reg_stream<8>(mine, units, lane);
    }
    if (acc == 0x12345678u) sink[c] = acc;
    __syncthreads();
    if (threadIdx.x == 0) out[c] = (long long)gtimer() - t0;
}

// Asking L2 for bytes ahead (the expert-prefetch oracle's question, eighteenth session): each thread t
// < per_cta of CTA c asks for chunk c * per_cta + t of `chunk` bytes at base, by one bulk prefetch
// (mode 0) or by a prefetch.global.L2 per 128-byte line (mode 1). The launch's time (events, taken by
// the caller) is how long CTAs that asked take to retire.
extern "C" __global__ void __launch_bounds__(256)
l2_prefetch(const unsigned char* base, int chunk, int per_cta, int mode)
{
    const int t = threadIdx.x;
    if (t >= per_cta) return;
    const unsigned char* p = base + ((size_t)blockIdx.x * per_cta + t) * (size_t)chunk;
    if (mode == 0) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"((unsigned)chunk) : "memory");
    } else {
        for (int o = 0; o < chunk; o += 128) asm volatile("prefetch.global.L2 [%0];" :: "l"(p + o) : "memory");
    }
}
