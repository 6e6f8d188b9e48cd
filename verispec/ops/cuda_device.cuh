// Device helpers shared by our CUDA C++ kernels (cuda_moe_tail.cu, cuda_stream_gemv.cu,
// cuda_stream_moe.cu, cuda_recurrence.cu, cuda_norm_route.cu, and bench/cuda_step_probe.cu): bf16 as its bits, the mbarrier, bulk-copy and
// 2D TMA instructions of the copy engine, the tensor-core product and a grid barrier.
// NVRTC gets it as a header (cuda_nvrtc.compile_kernel); no system headers.
#pragma once

typedef unsigned short bf16;
typedef unsigned long long u64;

__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2bf(float f) {       // round to nearest even, as torch rounds
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

// a bf16 pair word's halves (the lower element first), four elements from a uint2
__device__ __forceinline__ void unpack4(uint2 u, float* f) {
    f[0] = __uint_as_float(u.x << 16);
    f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16);
    f[3] = __uint_as_float(u.y & 0xffff0000u);
}

// a fixed butterfly over the warp: every lane gets the same sum, in the same order for any launch
__device__ __forceinline__ float warp_sum(float v) {
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

// the box at (k0, col0) of the weight's tensor map (a TC x KC tile, rows of KC elements) into dst
__device__ __forceinline__ void tile_copy(void* dst, const void* tmap, int k0, int col0, u64* b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(saddr(dst)), "l"(tmap), "r"(k0), "r"(col0), "r"(saddr(b)) : "memory");
}

// the same with an L2 eviction policy (a createpolicy value, e.g. evict_first for weights streamed once)
__device__ __forceinline__ void tile_copy_hint(void* dst, const void* tmap, int k0, int col0, u64* b, u64 policy) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%2, %3}], [%4], %5;"
                 :: "r"(saddr(dst)), "l"(tmap), "r"(k0), "r"(col0), "r"(saddr(b)), "l"(policy) : "memory");
}
__device__ __forceinline__ u64 evict_first_policy() {
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

__device__ __forceinline__ u64 evict_last_policy() {
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// the copy engine brings [src, src + bytes) into L2 (no shared memory, no completion to wait for);
// bytes a multiple of 16
__device__ __forceinline__ void l2_prefetch(const void* src, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void l2_prefetch_hint(const void* src, unsigned bytes, u64 policy) {
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" :: "l"(src), "r"(bytes), "l"(policy)
                 : "memory");
}

// c += a . b: a the 16 x 16 row-slot tile, b a 16 x 8 weight tile, fp32 accumulation
__device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                    unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldcg16(const bf16* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

// A grid barrier for a persistent kernel (cuda_moe_tail.cu, bench/cuda_step_probe.cu): every CTA
// past it has finished what it did before (all CTAs resident: one per SM, grid = SM count). ctr
// counts arrivals over the launch (zeroed before it); the k-th barrier's target is k * G.
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

struct __align__(64) TensorMap { u64 opaque[16]; };   // a CUtensorMap, passed by value

// The A tiles of a warp's K slice (XS 32-element steps from element k0) of x's R rows (row stride
// xs): xa row n = lane / 4, xb row n + 8, elements 8q.. of each step (q = lane % 4), the mma's A
// registers; rows past R are zeros
template <int XS>
__device__ __forceinline__ void load_a_rows(const bf16* x, int xs, int R, int k0, int lane, uint4* xa, uint4* xb) {
    const int n = lane >> 2, q = lane & 3;
    const bf16* xr = x + (size_t)n * xs + k0 + q * 8;
#pragma unroll
    for (int s = 0; s < XS; ++s) {
        xa[s] = n < R ? ldcg16(xr + s * 32) : make_uint4(0, 0, 0, 0);
        xb[s] = n + 8 < R ? ldcg16(xr + (size_t)8 * xs + s * 32) : make_uint4(0, 0, 0, 0);
    }
}

// Diagnostic stamps (bench/cuda_stamps.py), compiled in only with -DSTAMPS=1 and a buffer given:
// per CTA one record of 8 values (a tag, the block, the SM, the global timer at the kernel's start,
// after its griddepcontrol.wait, at a kernel-chosen point and at its end), appended at buf[8 + 8 i]
// (buf[0] counts them).
#ifndef STAMPS
#define STAMPS 0
#endif
__device__ __forceinline__ u64 gtimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// the timer once v is available (the predicate reads v, so the stamp waits for the load behind it)
__device__ __forceinline__ u64 gtimer_after(float v) {
    u64 t;
    asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.f32 p, %1, 0f7F800001;\n\tmov.u64 %0, %%globaltimer;\n}"
                 : "=l"(t) : "f"(v));
    return t;
}
// after the CTA's last store: thread 0 appends the record (call from every thread)
__device__ __forceinline__ void stamp_end(u64* buf, u64 tag, u64 t0, u64 t1, u64 t2) {
    __syncthreads();
    if (threadIdx.x != 0 || buf == nullptr) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const u64 t3 = gtimer();
    const u64 i = atomicAdd(reinterpret_cast<unsigned long long*>(buf), 1ull);
    u64* r = buf + 8 + 8 * i;
    r[0] = tag; r[1] = blockIdx.x; r[2] = smid; r[3] = t0; r[4] = t1; r[5] = t2; r[6] = t3; r[7] = 0;
}
