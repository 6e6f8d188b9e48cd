// The residual add, the norm before the MoE, the router product and the router (softmax, top-K,
// the shared expert's gate) in one launch: a thread-block cluster of CL CTAs a row (an experiment,
// cuda_fusions.ROUTE_CLUSTER; verispec/ops/cuda_norm_route.py).
//
// Each CTA of a row's cluster reads its COLS router rows into registers before its wait (weights
// are never written), then does the row's add and norm itself (every CTA of the row repeats it:
// a few KB from L2 instead of another launch) and its COLS logits. The logits, rounded to bf16 as
// the router product's output is, go into the cluster's first CTA's shared memory; after one
// cluster barrier that CTA's warp 0 does the router: softmax over NE, the top TOPK by repeated
// argmax (ties to the lower id), optionally renormalised, and the shared expert as slot TOPK with
// weight bf16(sigmoid(gate)), the gate being logit NE.
//
// Rows stay invariant: a row's whole computation is one cluster's, every sum in a fixed order
// (a thread's elements in turn, then a xor butterfly in the warp, then the warps in turn), and
// every row runs the same compiled kernel; the row count only sets how many clusters run.
//
//   s = bf16(x + h);  y = bf16(s * rsqrt(mean(s^2) + eps) * (1 + nw));
//   lg[n] = bf16(sum_k W[n, k] * y[k]);  p = softmax(lg[:NE]);  ids, wts = top-K of p
//
// Compile-time: HD (hidden), NOUT (router rows: NE logits, the gate, padding), NE, TOPK, NORM,
// CL (CTAs a cluster), WARPS (HD = 128 WARPS KV, KV >= 1: a thread's KV groups of 4 elements).
#include "cuda_device.cuh"

#define THREADS (32 * WARPS)
#define KV (HD / (4 * THREADS))            // 4-element groups a thread
#define COLS ((NOUT + CL - 1) / CL)        // router rows a CTA
#define EPL (NE / 32)                      // experts a lane in the router's warp
static_assert(HD % (4 * THREADS) == 0, "HD must be a multiple of 128 WARPS");
static_assert(NE % 32 == 0 && NOUT > NE && TOPK < 32, "NE a multiple of 32, the gate after the experts");
static_assert(CL >= 1 && CL <= 16, "a cluster holds at most 16 CTAs");

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// a float into CTA `rank`'s shared memory at the address `local` has in this CTA's
__device__ __forceinline__ void st_cluster(const float* local, unsigned rank, float v) {
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(saddr(local)), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(a), "f"(v) : "memory");
}

// a weight's 8 bytes by a plain load: ptxas keeps it ahead of the griddepcontrol.wait that
// follows (it moved __ldg's and ld.global.nc's loads past the wait, sm_90 SASS)
__device__ __forceinline__ uint2 ld_weight(const void* p) {
    uint2 v;
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ long long warp_max64(long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const long long u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

// x, h, s, y [R, HD] bf16; nw [HD]; w [NOUT, HD]; top_w [R, TOPK + 1] fp32, top_i the same int32.
// Grid CL * R CTAs in clusters of CL (the launch's cluster dimension).
extern "C" __global__ void __launch_bounds__(THREADS) norm_route(
        const bf16* __restrict__ x, const bf16* __restrict__ h, const bf16* __restrict__ nw,
        const bf16* __restrict__ w, bf16* __restrict__ s_out, bf16* __restrict__ y_out,
        float* __restrict__ top_w, int* __restrict__ top_i, float eps, int pdl) {
    __shared__ float part[WARPS][COLS];     // each warp's partial sums of the CTA's columns
    __shared__ float ssq[WARPS];
    __shared__ float lg[CL * COLS];         // the row's logits (used in the cluster's first CTA)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned rank = cluster_rank();
    const size_t row = blockIdx.x / CL;
    cluster_arrive_relaxed();               // this CTA has started: its shared memory may be written

    // the CTA's router rows, before the wait; a thread's groups: elements 4 (tid + THREADS j) ..
    // (rows past NOUT read row NOUT - 1 again: unconditional loads stay ahead of the wait; their
    // sums are never stored)
    uint2 wr[COLS][KV];
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
        const int n = min((int)rank * COLS + c, NOUT - 1);
#pragma unroll
        for (int j = 0; j < KV; ++j)
            wr[c][j] = ld_weight(reinterpret_cast<const uint2*>(w + (size_t)n * HD) + tid + THREADS * j);
    }
    if (pdl) {   // verispec/ops/cuda_launch.py: nothing the previous kernel writes is touched before it is done
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }

    // s = bf16(x + h), and its sum of squares
    float sv[KV][4];
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < KV; ++j) {
        float xf[4], hf[4];
        unpack4(__ldcg(reinterpret_cast<const uint2*>(x + row * HD) + tid + THREADS * j), xf);
        unpack4(__ldcg(reinterpret_cast<const uint2*>(h + row * HD) + tid + THREADS * j), hf);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sv[j][e] = round_bf(xf[e] + hf[e]);
            q += sv[j][e] * sv[j][e];
        }
    }
    q = warp_sum(q);
    if (lane == 0) ssq[warp] = q;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) tot += ssq[i];
    const float r = rsqrtf(tot / HD + eps);

    // y, stored by the first CTA with s; then the CTA's columns
    float yv[KV][4];
#pragma unroll
    for (int j = 0; j < KV; ++j) {
        float nf[4];
        unpack4(__ldg(reinterpret_cast<const uint2*>(nw) + tid + THREADS * j), nf);
        unsigned sb[4], yb[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bf16 yh = f2bf(sv[j][e] * r * (1.f + nf[e]));
            yv[j][e] = bf2f(yh);
            yb[e] = yh;
            sb[e] = f2bf(sv[j][e]);
        }
        if (rank == 0) {
            reinterpret_cast<uint2*>(s_out + row * HD)[tid + THREADS * j] = make_uint2(sb[0] | sb[1] << 16, sb[2] | sb[3] << 16);
            reinterpret_cast<uint2*>(y_out + row * HD)[tid + THREADS * j] = make_uint2(yb[0] | yb[1] << 16, yb[2] | yb[3] << 16);
        }
    }
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
        float a = 0.f;
#pragma unroll
        for (int j = 0; j < KV; ++j) {
            float wf[4];
            unpack4(wr[c][j], wf);
#pragma unroll
            for (int e = 0; e < 4; ++e) a += wf[e] * yv[j][e];
        }
        a = warp_sum(a);
        if (lane == 0) part[warp][c] = a;
    }
    __syncthreads();
    cluster_wait();                         // (the start barrier) every CTA of the cluster is running
    if (tid < COLS && rank * COLS + tid < NOUT) {
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) a += part[i][tid];
        st_cluster(&lg[rank * COLS + tid], 0, round_bf(a));
    }
    cluster_arrive();
    cluster_wait();                         // the row's logits are in the first CTA
    if (rank != 0 || warp != 0) return;

    // the router, in one warp: lane l holds experts l, l + 32, ...
    float p[EPL];
    float mx = -__int_as_float(0x7f800000);
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        p[i] = lg[lane + 32 * i];
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        p[i] = __expf(p[i] - mx);
        sum += p[i];
    }
    sum = warp_sum(sum);
    long long key[EPL];
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        p[i] = p[i] / sum;
        key[i] = ((long long)__float_as_uint(p[i]) << 32) | (long long)(NE - 1 - (lane + 32 * i));
    }
    float wv = 0.f;
    int iv = 0;
    float wsum = 0.f;
    for (int k = 0; k < TOPK; ++k) {
        long long b = key[0];
#pragma unroll
        for (int i = 1; i < EPL; ++i) b = key[i] > b ? key[i] : b;
        b = warp_max64(b);
        const int idx = NE - 1 - (int)(b & 0xffffffffll);
        const float v = __uint_as_float((unsigned)(b >> 32));
        wsum += v;
        if (lane == k) { wv = v; iv = idx; }
#pragma unroll
        for (int i = 0; i < EPL; ++i) if (lane + 32 * i == idx) key[i] = -1;
    }
    if (NORM) wv = wv / wsum;
    if (lane == TOPK) {
        const float g = lg[NE];
        wv = round_bf(1.f / (1.f + __expf(-g)));
        iv = NE;
    }
    if (lane <= TOPK) {
        top_w[row * (TOPK + 1) + lane] = wv;
        top_i[row * (TOPK + 1) + lane] = iv;
    }
}
