// Device helpers the two step probes share (bench/cuda_step_probe.cu, bench/cuda_chain_probe.cu).
// cuda_step_probe.probe_source puts this file in front of a probe's source: NVRTC is given only the
// package's headers (verispec/ops/cuda_nvrtc.py).
#pragma once

// ns nanoseconds by the global timer: the latency of a step that moves no bytes, or of a fold
__device__ __forceinline__ void spin_ns(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

// a lane's share of a BYTES-byte unit in shared memory, read once by the warp and folded by XOR (a
// read the compiler cannot drop)
template <int BYTES>
__device__ __forceinline__ unsigned xor_unit(const unsigned char* unit, int lane) {
    const uint4* s4 = reinterpret_cast<const uint4*>(unit);
    unsigned acc = 0;
#pragma unroll
    for (int j = 0; j < BYTES / 16 / 32; ++j) {
        const uint4 v = s4[j * 32 + lane];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    return acc;
}
