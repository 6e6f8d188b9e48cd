// The DeltaNet recurrence for R rows in one launch, written for latency (cuda_recurrence.py).
// A decode step's timeline (bench/cuda_timeline.py) has the Triton kernel ending 6.4-7.0 us after
// its input is complete, on the step's critical path; here each warp owns CB value columns of one
// value head over all DK key rows (a lane holds 4 key rows of them, 4 x CB fp32 in registers, from
// row to row), so every sum over the key rows is one warp's butterfly: no shared memory, no block
// barrier, and the state is read before griddepcontrol.wait (it is written only by this kernel in
// an earlier step, or by an undo between steps; nothing in flight touches it).
//
// Per row r and value head h (key head h / REP), as cuda_deltanet._delta_steps:
//   q^ = q rsqrt(|q|^2 + eps) scale,  k^ = k rsqrt(|k|^2 + eps),  beta = bf16(sigmoid(b)),
//   decay = exp(-A * softplus(a + dt_bias)),  S <- decay S,  delta = beta (v - S^T k^),
//   S <- S + k^ delta^T,  o = S^T q^  (bf16)
// computed as kv = decay rk (S^T k), o = decay rq (S^T q) + rk rq (k.q) delta from the state before
// the row, so the two sums over the key rows are one reduce-scatter. Every row runs the same
// instructions in the same order whatever R (a runtime loop bound), and a row's values come only
// from its inputs and the state before it, so rows are invariant (tests/test_cuda_recurrence.py).
// TRIG 1 lets the next kernel launch after the wait, 2 before it (cuda_launch.LINKS: the gated norm
// then launches, and lets the output product launch, while the input product still runs).
// Compiled by NVRTC with -D HV, REP, DV, WARPS, TRIG, CB (value columns a warp: 16 or 8), PRE (the state
// read before the wait) and FAST (the exponentials and the logarithm by the fast intrinsics).

#include "cuda_device.cuh"

constexpr int DK = 128;                 // key rows: 4 a lane
constexpr int HK = HV / REP;
constexpr int NB = DV / (CB * WARPS);   // CTAs a value head
constexpr unsigned FULL = 0xffffffffu;

#if FAST
__device__ __forceinline__ float ex(float x) { return __expf(x); }
__device__ __forceinline__ float lg(float x) { return __logf(x); }
#else
__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ float lg(float x) { return logf(x); }
#endif

// one step of a warp's reduce-scatter of 2 S values: a lane keeps the half its bit S picks, adding
// its partner's copy of that half (the partner keeps the other)
template <int S>
__device__ __forceinline__ void halve(float* part, int lane) {
    const bool up = lane & S;
#pragma unroll
    for (int j = 0; j < S; ++j) {
        const float send = up ? part[j] : part[j + S];
        const float keep = up ? part[j + S] : part[j];
        part[j] = keep + __shfl_xor_sync(FULL, send, S);
    }
}

extern "C" __global__ void __launch_bounds__(32 * WARPS)
delta_rec(const bf16* mix, int mix_stride, const bf16* ba, int ba_stride, const float* alog, const bf16* dtb,
          float* state, bf16* out, const long long* tab, int R, int save, int pdl, float scale, float eps,
          u64* stamps)
{
    const u64 st0 = STAMPS ? gtimer() : 0;
    const int h = blockIdx.x / NB, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = ((blockIdx.x % NB) * WARPS + warp) * CB;       // this warp's first value column
    const int kh = h / REP, i0 = lane * 4;                          // this lane's key rows i0..i0+3
    const size_t cell = (size_t)h * DK * DV + (size_t)i0 * DV + c0;
    float S[4][CB];
    auto load_state = [&]() {
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int q = 0; q < CB / 4; ++q) {
                const float4 v = *reinterpret_cast<const float4*>(state + cell + (size_t)a * DV + 4 * q);
                S[a][4 * q] = v.x; S[a][4 * q + 1] = v.y; S[a][4 * q + 2] = v.z; S[a][4 * q + 3] = v.w;
            }
    };
    if (PRE) load_state();
    const float a_log = alog[h], dt_bias = bf2f(dtb[h]);
    if (pdl) {
        if (TRIG == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
        if (TRIG == 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    const u64 st1 = STAMPS ? gtimer() : 0;
    u64 st2 = 0;                              // STAMPS: when the first row's inputs had landed
    if (!PRE) load_state();
    const int idx = lane & (2 * CB - 1);      // the sum this lane ends with: S^T k of column idx, or S^T q
    for (int r = 0; r < R; ++r) {
        const bf16* row = mix + (size_t)r * mix_stride;
        float q[4], k[4];
        unpack4(*reinterpret_cast<const uint2*>(row + kh * DK + i0), q);
        unpack4(*reinterpret_cast<const uint2*>(row + HK * DK + kh * DK + i0), k);
        const float v = bf2f(row[2 * HK * DK + h * DV + c0 + (lane & (CB - 1))]);   // column idx mod CB
        const bf16* brow = ba + (size_t)r * ba_stride;
        const float b = bf2f(brow[h]), a = bf2f(brow[HV + h]) + dt_bias;

        float qq = q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3];
        if (STAMPS && r == 0) st2 = gtimer_after(qq + k[0] + v + b + a + S[0][0]);
        float kk = k[0] * k[0] + k[1] * k[1] + k[2] * k[2] + k[3] * k[3];
        float kq = k[0] * q[0] + k[1] * q[1] + k[2] * q[2] + k[3] * q[3];
        float part[2 * CB];                     // this lane's share of S^T k (columns) and S^T q
#pragma unroll
        for (int c = 0; c < CB; ++c) {
            part[c] = S[0][c] * k[0] + S[1][c] * k[1] + S[2][c] * k[2] + S[3][c] * k[3];
            part[CB + c] = S[0][c] * q[0] + S[1][c] * q[1] + S[2][c] * q[2] + S[3][c] * q[3];
        }
#pragma unroll
        for (int s = 16; s >= 1; s >>= 1) {     // every lane ends with the same sums (addition commutes)
            qq += __shfl_xor_sync(FULL, qq, s);
            kk += __shfl_xor_sync(FULL, kk, s);
            kq += __shfl_xor_sync(FULL, kq, s);
        }
        // reduce-scatter: lane l ends with the whole sum of part[idx] (with 2 CB = 16, lanes l and l + 16 alike)
        if constexpr (2 * CB == 32) {
            halve<16>(part, lane);
        } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) part[j] += __shfl_xor_sync(FULL, part[j], 16);
        }
        halve<8>(part, lane);
        halve<4>(part, lane);
        halve<2>(part, lane);
        halve<1>(part, lane);
        const float rq = rsqrtf(qq + eps) * scale, rk = rsqrtf(kk + eps);
        const float beta = round_bf(1.0f / (1.0f + ex(-b)));
        const float decay = ex(-a_log * (a > 20.0f ? a : lg(1.0f + ex(a))));
        // idx < CB: delta of column idx; idx = CB + j: o of column j (from delta_j)
        const float delta = beta * (v - decay * (rk * part[0]));
        const float dj = __shfl_sync(FULL, delta, lane & (CB - 1));
        if (idx >= CB && lane < 2 * CB)
            out[((size_t)r * HV + h) * DV + c0 + idx - CB] = f2bf(decay * (rq * part[0]) + (rk * rq * kq) * dj);
        float d[CB];
#pragma unroll
        for (int c = 0; c < CB; ++c) d[c] = __shfl_sync(FULL, delta, c);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float ki = k[i] * rk;
#pragma unroll
            for (int c = 0; c < CB; ++c) S[i][c] = decay * S[i][c] + ki * d[c];
        }
        if (save && r < R - 1) {                // the state after row r to its copy slot
            float* slot = reinterpret_cast<float*>(tab[r]) + cell;
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int q4 = 0; q4 < CB / 4; ++q4)
                    *reinterpret_cast<float4*>(slot + (size_t)i * DV + 4 * q4) =
                        make_float4(S[i][4 * q4], S[i][4 * q4 + 1], S[i][4 * q4 + 2], S[i][4 * q4 + 3]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int q4 = 0; q4 < CB / 4; ++q4)
            *reinterpret_cast<float4*>(state + cell + (size_t)i * DV + 4 * q4) =
                make_float4(S[i][4 * q4], S[i][4 * q4 + 1], S[i][4 * q4 + 2], S[i][4 * q4 + 3]);
    if (STAMPS) stamp_end(stamps, 1, st0, st1, st2);
}
