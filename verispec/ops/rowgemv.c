/* Row-invariant fp32 matrix product: y[M, N] = x[M, K] @ w[N, K]^T.
 *
 * Every output element y[m, n] is computed by one fixed sequence of fp32
 * operations that depends only on K: the same code runs whatever M, the tile
 * an element lands in, or the thread that owns its column.  That is what makes
 * row m of an M-row product bit-equal to the 1-row product (the verify path of
 * speculative decoding needs it; MKL's SGEMM picks a different order per M).
 *
 * Per element (AVX2 build):
 *   acc = 0 (8 lanes); for each 8-float chunk c of K, in order:
 *       acc = fma(x[c], w[c], acc)          -- the last partial chunk is loaded
 *                                              zero-padded (masked load)
 *   y = hsum(acc), one fixed reduction tree: (l0+l4, l1+l5, l2+l6, l3+l7),
 *       then (a0+a2, a1+a3), then b0+b1.
 * Portable build: the same scheme in plain C (8 scalar lanes, a scalar tail),
 * compiled with -ffp-contract=off so the compiler may vectorise but not fuse
 * or reorder.  The two builds need not agree with each other bit for bit.
 *
 * Speed: one row is bound by reading w.  Columns are walked outside and rows
 * inside, in tiles of MB rows x NB columns held in registers, so each block of
 * NB weight rows is read from memory once and reused (from cache) by all M
 * rows.  Threads split only the columns.  No -ffast-math: it would let the
 * compiler reorder the sums.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define NB 4 /* output columns per tile */

#if defined(VS_AVX2)
#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    __m128 c = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(c);
}

/* One tile: rows x[0..mb), columns w[0..nb) (each K long), y with row stride ldy.
 * mb and nb are compile-time constants at every call site (always_inline), so
 * the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(
    const float *x, int64_t ldx, const float *w, int64_t K, float *y, int64_t ldy,
    const int mb, const int nb, __m256i tailmask) {
    __m256 acc[4][NB];
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = _mm256_setzero_ps();
    const int64_t K8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < K8; k += 8) {
        __m256 wv[NB];
        for (int j = 0; j < nb; j++) wv[j] = _mm256_loadu_ps(w + j * K + k);
        for (int i = 0; i < mb; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (K8 < K) { /* the partial chunk, zero-padded: same ops as a full one */
        __m256 wv[NB];
        for (int j = 0; j < nb; j++) wv[j] = _mm256_maskload_ps(w + j * K + K8, tailmask);
        for (int i = 0; i < mb; i++) {
            __m256 xv = _mm256_maskload_ps(x + i * ldx + K8, tailmask);
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) y[i * ldy + j] = hsum8(acc[i][j]);
}

/* All M rows against nb (<= NB, constant) columns starting at w. */
static inline __attribute__((always_inline)) void column_block(
    const float *x, int64_t M, const float *w, int64_t K, float *y, int64_t N,
    const int nb, __m256i tailmask) {
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) tile(x + m * K, K, w, K, y + m * N, N, 3, nb, tailmask);
    switch (M - m) {
    case 2: tile(x + m * K, K, w, K, y + m * N, N, 2, nb, tailmask); break;
    case 1: tile(x + m * K, K, w, K, y + m * N, N, 1, nb, tailmask); break;
    }
}

static void columns(const float *x, int64_t M, const float *w, int64_t K, float *y,
                    int64_t N, int64_t n0, int64_t n1) {
    int32_t lanes[8];
    for (int l = 0; l < 8; l++) lanes[l] = (l < (K & 7)) ? -1 : 0;
    const __m256i tailmask = _mm256_loadu_si256((const __m256i *)lanes);
    int64_t n = n0;
    for (; n + NB <= n1; n += NB) column_block(x, M, w + n * K, K, y + n, N, NB, tailmask);
    switch (n1 - n) {
    case 3: column_block(x, M, w + n * K, K, y + n, N, 3, tailmask); break;
    case 2: column_block(x, M, w + n * K, K, y + n, N, 2, tailmask); break;
    case 1: column_block(x, M, w + n * K, K, y + n, N, 1, tailmask); break;
    }
}

#else /* portable: plain C, 8 scalar lanes, fixed order, no contraction */

static float dot(const float *x, const float *w, int64_t K) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t K8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < K8; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[k + l] * w[k + l];
    float a[4], b[2];
    for (int l = 0; l < 4; l++) a[l] = acc[l] + acc[l + 4];
    b[0] = a[0] + a[2];
    b[1] = a[1] + a[3];
    float s = b[0] + b[1];
    for (int64_t k = K8; k < K; k++) s += x[k] * w[k];
    return s;
}

static void columns(const float *x, int64_t M, const float *w, int64_t K, float *y,
                    int64_t N, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n += NB) {
        int64_t ne = n + NB < n1 ? n + NB : n1;
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = n; j < ne; j++) y[m * N + j] = dot(x + m * K, w + j * K, K);
    }
}
#endif

/* Entry point.  x: [M, K] contiguous, w: [N, K] contiguous, y: [M, N] contiguous.
 * threads: how many OpenMP threads may split the N columns (results do not
 * depend on it). */
void rowgemv(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K,
             int threads) {
    if (M <= 0 || N <= 0) return;
    /* Small products are not worth waking a second thread. */
    if (threads < 1 || N * K * (M < 4 ? M : 4) < (1 << 16)) threads = 1;
    int64_t nblocks = (N + NB - 1) / NB;
    if (threads > nblocks) threads = (int)nblocks;
    if (threads == 1) {
        columns(x, M, w, K, y, N, 0, N);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        int t = 0, nt = 1;
#endif
        /* Contiguous, NB-aligned column ranges, one per thread. */
        int64_t per = (nblocks + nt - 1) / nt;
        int64_t n0 = t * per * NB, n1 = (t + 1) * per * NB;
        if (n1 > N) n1 = N;
        if (n0 < n1) columns(x, M, w, K, y, N, n0, n1);
    }
}
