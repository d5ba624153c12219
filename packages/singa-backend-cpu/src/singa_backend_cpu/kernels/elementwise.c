/* The strided driver shared by every generated element-wise kernel (see common.h, sg_strided_run). */
#include "common.h"

#define SG_MAX_OPS 4
#define SG_MAX_DIMS 64

/* Rows [lo, hi) of the outer index space, each handed to `row` with its operands' pointers. */
static void run_rows(int nops, int ndim, const int64_t *shape, const int64_t (*bstride)[SG_MAX_DIMS],
                     char *const *base, const int64_t *row_st, sg_row_fn row, const void *ctx, int64_t lo, int64_t hi) {
    const int outer_nd = ndim - 1;
    const int64_t inner = shape[ndim - 1];
    int64_t idx[SG_MAX_DIMS];
    char *ptr[SG_MAX_OPS];
    int64_t rem = lo;
    for (int k = 0; k < nops; k++) ptr[k] = base[k];
    for (int d = outer_nd - 1; d >= 0; d--) {
        idx[d] = rem % shape[d];
        rem /= shape[d];
        for (int k = 0; k < nops; k++) ptr[k] += idx[d] * bstride[k][d];
    }
    for (int64_t r = lo; r < hi; r++) {
        row(inner, ptr, row_st, ctx);
        for (int d = outer_nd - 1; d >= 0; d--) {
            if (++idx[d] < shape[d]) {
                for (int k = 0; k < nops; k++) ptr[k] += bstride[k][d];
                break;
            }
            idx[d] = 0;
            for (int k = 0; k < nops; k++) ptr[k] -= (shape[d] - 1) * bstride[k][d];
        }
    }
}

void sg_strided_run(int nops, const int *itemsizes, int ndim, const int64_t *dims, char *const *base, sg_row_fn row,
                    const void *ctx, int64_t thresh) {
    if (ndim <= 0) { /* a single element */
        static const int64_t unit[SG_MAX_OPS] = {1, 1, 1, 1};
        row(1, base, unit, ctx);
        return;
    }
    const int64_t *shape = dims;
    int64_t bstride[SG_MAX_OPS][SG_MAX_DIMS];
    int64_t row_st[SG_MAX_OPS];
    int64_t outer = 1, total;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    total = outer * shape[ndim - 1];
    if (total == 0) return;
    for (int k = 0; k < nops; k++) {
        for (int d = 0; d < ndim; d++) bstride[k][d] = dims[ndim * (1 + k) + d] * itemsizes[k];
        row_st[k] = dims[ndim * (1 + k) + ndim - 1];
    }
    const int T = total < thresh ? 1 : sg_max_threads();
    if (T < 2) {
        run_rows(nops, ndim, shape, bstride, base, row_st, row, ctx, 0, outer);
    } else if (outer >= T) {
#pragma omp parallel num_threads(T)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            run_rows(nops, ndim, shape, bstride, base, row_st, row, ctx, outer * t / nt, outer * (t + 1) / nt);
        }
    } else { /* few long rows: split each row between the threads instead */
        const int64_t inner = shape[ndim - 1];
        for (int64_t r = 0; r < outer; r++) {
            char *rb[SG_MAX_OPS];
            int64_t rem = r;
            for (int k = 0; k < nops; k++) rb[k] = base[k];
            for (int d = ndim - 2; d >= 0; d--) {
                const int64_t i = rem % shape[d];
                rem /= shape[d];
                for (int k = 0; k < nops; k++) rb[k] += i * bstride[k][d];
            }
#pragma omp parallel num_threads(T)
            {
                const int t = omp_get_thread_num(), nt = omp_get_num_threads();
                const int64_t lo = sg_chunk(inner, t, nt), hi = sg_chunk(inner, t + 1, nt);
                char *p[SG_MAX_OPS];
                for (int k = 0; k < nops; k++) p[k] = rb[k] + lo * bstride[k][ndim - 1];
                if (hi > lo) row(hi - lo, p, row_st, ctx);
            }
        }
    }
}
