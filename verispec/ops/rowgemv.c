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
 * inside: each block of CB weight rows is read from memory once and reused
 * (from cache) by all M rows, in register tiles of up to 4 rows x 4 columns.  Threads split only the columns.  No -ffast-math: it would let the
 * compiler reorder the sums.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define CB 12 /* output columns per block: each block of weight rows is read once for all M */
#define NBMAX 4
/* Software prefetch of the next weight block into L2: measured 1.2x faster at M=1
 * and ~1.8x at M=4 than relying on the hardware prefetcher (8-layer stack, 1 thread). */
#define PF_HINT _MM_HINT_T1

#if defined(VS_AVX2)
#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    __m128 c = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(c);
}

/* One register tile: rows x[0..mb) (row stride ldx) against weight rows w[0..nb)
 * (each K long) into y (row stride ldy).  mb, nb and xfirst are constants at every
 * call site (always_inline), so the mb*nb accumulators stay in the 16 ymm registers.
 * Tile shapes and load order change only the schedule, never an element's ops. */
static inline __attribute__((always_inline)) void tile(
    const float *x, int64_t ldx, const float *w, int64_t K, float *y, int64_t ldy,
    const int mb, const int nb, const int xfirst, __m256i tailmask, const char **pf,
    const char *pf_end) {
    __m256 acc[4][NBMAX];
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) acc[i][j] = _mm256_setzero_ps();
    const int64_t K8 = K & ~(int64_t)7;
    for (int64_t k = 0; k <= K8; k += 8) {
        __m256 xv[4], wv[NBMAX];
        if (*pf < pf_end) { /* pull the next column block toward cache meanwhile */
            _mm_prefetch(*pf, PF_HINT);
            _mm_prefetch(*pf + 64, PF_HINT);
            *pf += 128;
        }
        if (k == K8) { /* the partial chunk, zero-padded: the same ops as a full one */
            if (k == K) break;
            for (int i = 0; i < mb; i++) xv[i] = _mm256_maskload_ps(x + i * ldx + k, tailmask);
            for (int j = 0; j < nb; j++) wv[j] = _mm256_maskload_ps(w + j * K + k, tailmask);
        } else if (xfirst) { /* keep mb x-chunks in registers, stream w */
            for (int i = 0; i < mb; i++) xv[i] = _mm256_loadu_ps(x + i * ldx + k);
            for (int j = 0; j < nb; j++) {
                __m256 wj = _mm256_loadu_ps(w + j * K + k);
                for (int i = 0; i < mb; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wj, acc[i][j]);
            }
            continue;
        } else {
            for (int j = 0; j < nb; j++) wv[j] = _mm256_loadu_ps(w + j * K + k);
            for (int i = 0; i < mb; i++) xv[i] = _mm256_loadu_ps(x + i * ldx + k);
        }
        for (int i = 0; i < mb; i++)
            for (int j = 0; j < nb; j++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv[j], acc[i][j]);
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) y[i * ldy + j] = hsum8(acc[i][j]);
}

/* mb rows (constant) against columns [0, nc) of a block, in sub-tiles of nb columns. */
static inline __attribute__((always_inline)) void rows_block(
    const float *x, const float *w, int64_t K, float *y, int64_t N, int64_t nc,
    const int mb, const int nb, const int xfirst, __m256i tailmask, const char **pf,
    const char *pf_end) {
    int64_t j = 0;
    for (; j + nb <= nc; j += nb)
        tile(x, K, w + j * K, K, y + j, N, mb, nb, xfirst, tailmask, pf, pf_end);
    for (; j < nc; j++) tile(x, K, w + j * K, K, y + j, N, mb, 1, 0, tailmask, pf, pf_end);
}

static void columns(const float *x, int64_t M, const float *w, int64_t K, float *y,
                    int64_t N, int64_t n0, int64_t n1) {
    int32_t lanes[8];
    for (int l = 0; l < 8; l++) lanes[l] = (l < (K & 7)) ? -1 : 0;
    const __m256i tailmask = _mm256_loadu_si256((const __m256i *)lanes);
    for (int64_t n = n0; n < n1; n += CB) {
        const int64_t nc = n1 - n < CB ? n1 - n : CB;
        const float *wb = w + n * K;
        /* The next block's weight rows are contiguous: prefetch them during this one. */
        const int64_t nn = n1 - (n + nc) < CB ? n1 - (n + nc) : CB;
        const char *pf = (const char *)(wb + nc * K), *pf_end = pf + nn * K * 4;
        /* Rows in tiles of 4 (5 -> 3+2, 6 -> 3+3), the shapes measured fastest here. */
        for (int64_t m = 0; m < M;) {
            const int64_t r = M - m;
            const float *xm = x + m * K;
            float *ym = y + m * N + n;
            if (r == 4 || r >= 7) { rows_block(xm, wb, K, ym, N, nc, 4, 3, 1, tailmask, &pf, pf_end); m += 4; }
            else if (r >= 3) { rows_block(xm, wb, K, ym, N, nc, 3, 4, 0, tailmask, &pf, pf_end); m += 3; }
            else if (r == 2) { rows_block(xm, wb, K, ym, N, nc, 2, 4, 0, tailmask, &pf, pf_end); m += 2; }
            else { rows_block(xm, wb, K, ym, N, nc, 1, 4, 0, tailmask, &pf, pf_end); m += 1; }
        }
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
    for (int64_t n = n0; n < n1; n += CB) {
        int64_t ne = n + CB < n1 ? n + CB : n1;
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
    int64_t nblocks = (N + CB - 1) / CB;
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
        /* Contiguous, CB-aligned column ranges, one per thread. */
        int64_t per = (nblocks + nt - 1) / nt;
        int64_t n0 = t * per * CB, n1 = (t + 1) * per * CB;
        if (n1 > N) n1 = N;
        if (n0 < n1) columns(x, M, w, K, y, N, n0, n1);
    }
}
