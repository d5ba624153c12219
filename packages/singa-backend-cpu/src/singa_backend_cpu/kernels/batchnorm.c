/* Batch normalisation over axes (0, 2, 3) of NCHW input (or axis 0 of (N, C)), seen as x (N, C, S); layer
 * normalisation of the rows of a (rows, cols) matrix.
 * Statistics accumulate in double, two passes (mean, then squared deviations) so that a large mean costs no
 * precision. Threads own disjoint ranges of channels. The kernels are in batchnorm_real.h (float32 and float64);
 * float16 data goes through float32 copies. Every per-channel vector (scale, bias, running and saved statistics) is
 * read and written in its own dtype. */
#include "common.h"

/* a per-channel vector in its own dtype */
typedef struct {
    int dt;
    char *p;
} chan;

static chan chan_of(int dt, const char *p, int64_t off) {
    chan v = {dt, (char *)p + off * sg_itemsize(dt)};
    return v;
}
static inline double chan_ld(chan v, int64_t c) { return sg_ldf(v.p, v.dt, c); }
static inline void chan_st(chan v, int64_t c, double x) { sg_stf(v.p, v.dt, c, x); }

#define CHANNEL_THREADS(N, C, S) sg_threads_for((N) * (C) * (S), 1 << 15)
#define CHANNEL_RANGE()                                                                                            \
    const int t_ = omp_get_thread_num(), nt_ = omp_get_num_threads();                                               \
    const int64_t c0 = C * t_ / nt_, c1 = C * (t_ + 1) / nt_

#define SG_REAL_TEMPLATE "batchnorm_real.h"
#include "real.h"

/* float views of float32 or float16 x (converted when float16) and of y (a scratch buffer when float16) */
typedef struct {
    float *x, *y;
    int own_x, own_y;
} fbufs;

static int open_bufs(int xdt, const char *x, char *y, int64_t n, fbufs *b) {
    b->x = sg_as_f32(x, xdt, n, &b->own_x);
    b->own_y = xdt != SG_F32;
    b->y = b->own_y ? (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float)) : (float *)y;
    return b->x && b->y ? SG_OK : SG_ENOMEM;
}
static void close_bufs(char *y, int64_t n, fbufs *b, int ok) {
    if (b->own_y && b->y) {
        if (ok) sg_f2h(b->y, (sg_half *)y, n);
        free(b->y);
    }
    if (b->own_x) free(b->x);
}

int sg_batchnorm_train(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int rmdt, char *rmean, int64_t rmo, int rvdt, char *rvar, int64_t rvo,
                       int smdt, char *smean, int64_t smo, int sidt, char *sinvstd, int64_t sio,
                       double momentum, double eps) {
    if (!sg_is_float(xdt)) return SG_EDTYPE;
    const chan sc = chan_of(sdt, scale, so), bi = chan_of(bdt, bias, bo), rm = chan_of(rmdt, rmean, rmo),
               rv = chan_of(rvdt, rvar, rvo), sm = chan_of(smdt, smean, smo), si = chan_of(sidt, sinvstd, sio);
    if (xdt == SG_F64)
        return bn_train_f64((const double *)x + xo, (double *)y + yo, N, C, S, sc, bi, rm, rv, sm, si, momentum, eps);
    const int64_t n = N * C * S, isz = sg_itemsize(xdt);
    fbufs b;
    int err = open_bufs(xdt, x + xo * isz, y + yo * isz, n, &b);
    if (!err) err = bn_train_f32(b.x, b.y, N, C, S, sc, bi, rm, rv, sm, si, momentum, eps);
    close_bufs(y + yo * isz, n, &b, !err);
    return err;
}

int sg_batchnorm_infer(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int mdt, const char *mean, int64_t mo, int vdt, const char *var, int64_t vo, double eps) {
    if (!sg_is_float(xdt)) return SG_EDTYPE;
    const chan sc = chan_of(sdt, scale, so), bi = chan_of(bdt, bias, bo), m = chan_of(mdt, mean, mo),
               v = chan_of(vdt, var, vo);
    if (xdt == SG_F64) return bn_infer_f64((const double *)x + xo, (double *)y + yo, N, C, S, sc, bi, m, v, eps);
    const int64_t n = N * C * S, isz = sg_itemsize(xdt);
    fbufs b;
    int err = open_bufs(xdt, x + xo * isz, y + yo * isz, n, &b);
    if (!err) err = bn_infer_f32(b.x, b.y, N, C, S, sc, bi, m, v, eps);
    close_bufs(y + yo * isz, n, &b, !err);
    return err;
}

int sg_batchnorm_apply(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int mdt, const char *smean, int64_t mo, int idt, const char *sinvstd, int64_t io, int relu) {
    if (!sg_is_float(xdt)) return SG_EDTYPE;
    (void)mdt, (void)smean, (void)mo; /* the mean is recomputed in double (see bn_apply) */
    const chan sc = chan_of(sdt, scale, so), bi = chan_of(bdt, bias, bo), inv = chan_of(idt, sinvstd, io);
    if (xdt == SG_F64) return bn_apply_f64((const double *)x + xo, (double *)y + yo, N, C, S, sc, bi, inv, relu);
    const int64_t n = N * C * S, isz = sg_itemsize(xdt);
    fbufs b;
    int err = open_bufs(xdt, x + xo * isz, y + yo * isz, n, &b);
    if (!err) err = bn_apply_f32(b.x, b.y, N, C, S, sc, bi, inv, relu);
    close_bufs(y + yo * isz, n, &b, !err);
    return err;
}

int sg_batchnorm_backward(int xdt, const char *dy, int64_t dyo, const char *x, int64_t xo, char *dx, int64_t dxo,
                          int64_t N, int64_t C, int64_t S, int sdt, const char *scale, int64_t so,
                          int smdt, const char *smean, int64_t smo, int sidt, const char *sinvstd, int64_t sio,
                          int dsdt, char *dscale, int64_t dso, int dbdt, char *dbias, int64_t dbo) {
    if (!sg_is_float(xdt)) return SG_EDTYPE;
    const chan sc = chan_of(sdt, scale, so), sm = chan_of(smdt, smean, smo), si = chan_of(sidt, sinvstd, sio),
               ds = chan_of(dsdt, dscale, dso), db = chan_of(dbdt, dbias, dbo);
    if (xdt == SG_F64)
        return bn_backward_f64((const double *)dy + dyo, (const double *)x + xo, (double *)dx + dxo, N, C, S, sc, sm,
                               si, ds, db);
    const int64_t n = N * C * S, isz = sg_itemsize(xdt);
    fbufs b;
    int err = open_bufs(xdt, x + xo * isz, dx + dxo * isz, n, &b);
    int own_dy = 0;
    float *fdy = err ? NULL : sg_as_f32(dy + dyo * isz, xdt, n, &own_dy);
    if (!err && !fdy) err = SG_ENOMEM;
    if (!err) err = bn_backward_f32(fdy, b.x, b.y, N, C, S, sc, sm, si, ds, db);
    close_bufs(dx + dxo * isz, n, &b, !err);
    if (own_dy) free(fdy);
    return err;
}

int sg_layer_norm(int dt, const char *x, int64_t xo, char *y, int64_t yo, char *mean, int64_t mo, char *invstd,
                  int64_t io, const char *scale, int64_t so, const char *bias, int64_t bo, int64_t rows, int64_t cols,
                  double eps) {
    if (!sg_is_float(dt)) return SG_EDTYPE;
    if (rows <= 0 || cols <= 0) return SG_OK;
    const int64_t isz = sg_itemsize(dt);
    const char *s = scale ? scale + so * isz : NULL, *b = bias ? bias + bo * isz : NULL;
    if (dt == SG_F64) {
        layer_norm_f64((const double *)x + xo, (double *)y + yo, (double *)mean + mo, (double *)invstd + io, rows,
                       cols, (const double *)s, (const double *)b, eps);
        return SG_OK;
    }
    if (dt == SG_F32) {
        layer_norm_f32((const float *)x + xo, (float *)y + yo, (float *)mean + mo, (float *)invstd + io, rows, cols,
                       (const float *)s, (const float *)b, eps);
        return SG_OK;
    }
    /* float16: computed in float32 copies */
    const int64_t n = rows * cols;
    int own_x = 0, own_s = 0, own_b = 0, err = SG_OK;
    float *fx = sg_as_f32(x + xo * isz, dt, n, &own_x);
    float *fs = s ? sg_as_f32(s, dt, cols, &own_s) : NULL, *fb = b ? sg_as_f32(b, dt, cols, &own_b) : NULL;
    float *fy = (float *)malloc((size_t)(n + 2 * rows) * sizeof(float));
    if (!fx || !fy || (s && !fs) || (b && !fb)) {
        err = SG_ENOMEM;
    } else {
        layer_norm_f32(fx, fy, fy + n, fy + n + rows, rows, cols, fs, fb, eps);
        sg_f2h(fy, (sg_half *)y + yo, n);
        sg_f2h(fy + n, (sg_half *)mean + mo, rows);
        sg_f2h(fy + n + rows, (sg_half *)invstd + io, rows);
    }
    free(fy);
    if (own_x) free(fx);
    if (own_s) free(fs);
    if (own_b) free(fb);
    return err;
}
