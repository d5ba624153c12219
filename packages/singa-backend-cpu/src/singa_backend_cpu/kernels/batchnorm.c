/* Batch normalisation over axes (0, 2, 3) of NCHW input (or axis 0 of (N, C)), seen as x (N, C, S).
 * Statistics accumulate in double, two passes (mean, then squared deviations) so that a large mean costs no
 * precision. Threads own disjoint ranges of channels. float16 data goes through float32 copies; every per-channel
 * vector (scale, bias, running and saved statistics) is read and written in its own dtype. */
#include "common.h"

/* sum over (n, s) of f(x) for channels [c0, c1), into acc[c] */
static void channel_sum(const float *x, int64_t N, int64_t C, int64_t S, int64_t c0, int64_t c1, double *acc) {
    for (int64_t c = c0; c < c1; c++) acc[c] = 0.0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = c0; c < c1; c++) {
            const float *p = x + (n * C + c) * S;
            double s = 0.0;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < S; i++) s += p[i];
            acc[c] += s;
        }
}
static void channel_sqdev(const float *x, int64_t N, int64_t C, int64_t S, int64_t c0, int64_t c1,
                          const double *mean, double *acc) {
    for (int64_t c = c0; c < c1; c++) acc[c] = 0.0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = c0; c < c1; c++) {
            const float *p = x + (n * C + c) * S;
            const double m = mean[c];
            double s = 0.0;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < S; i++) {
                const double d = p[i] - m;
                s += d * d;
            }
            acc[c] += s;
        }
}
/* y = (x - m[c]) * a[c] + b[c]; the difference in double, so that a mean far from zero costs no digits */
static void channel_affine(const float *x, float *y, int64_t N, int64_t C, int64_t S, int64_t c0, int64_t c1,
                           const double *m, const double *a, const double *b) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = c0; c < c1; c++) {
            const float *p = x + (n * C + c) * S;
            float *q = y + (n * C + c) * S;
            const double mc = m[c], ac = a[c], bc = b[c];
#pragma omp simd
            for (int64_t i = 0; i < S; i++) q[i] = (float)(((double)p[i] - mc) * ac + bc);
        }
}

#define CHANNEL_THREADS(N, C, S) sg_threads_for((N) * (C) * (S), 1 << 15)
#define CHANNEL_RANGE()                                                                                            \
    const int t_ = omp_get_thread_num(), nt_ = omp_get_num_threads();                                               \
    const int64_t c0 = C * t_ / nt_, c1 = C * (t_ + 1) / nt_

/* float views of x (converted when float16) and of y (a scratch buffer when float16) */
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
static void close_bufs(int xdt, char *y, int64_t n, fbufs *b, int ok) {
    if (b->own_y && b->y) {
        if (ok) sg_f2h(b->y, (sg_half *)y, n);
        free(b->y);
    }
    if (b->own_x) free(b->x);
}

static int isz(int dt) { return dt == SG_F16 ? 2 : 4; }

int sg_batchnorm_train(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int rmdt, char *rmean, int64_t rmo, int rvdt, char *rvar, int64_t rvo,
                       int smdt, char *smean, int64_t smo, int sidt, char *sinvstd, int64_t sio,
                       double momentum, double eps) {
    if ((xdt != SG_F32 && xdt != SG_F16)) return SG_EDTYPE;
    const int64_t n = N * C * S, M = N * S;
    scale += so * isz(sdt); bias += bo * isz(bdt); rmean += rmo * isz(rmdt); rvar += rvo * isz(rvdt);
    smean += smo * isz(smdt); sinvstd += sio * isz(sidt);
    fbufs b;
    int err = open_bufs(xdt, x + xo * isz(xdt), y + yo * isz(xdt), n, &b);
    double *mean = (double *)malloc((size_t)(4 * C + 1) * sizeof(double)), *var = mean + C, *a = var + C,
           *off = a + C;
    if (!mean) err = SG_ENOMEM;
    if (!err) {
        const int T = CHANNEL_THREADS(N, C, S);
#pragma omp parallel num_threads(T) if (T > 1)
        {
            CHANNEL_RANGE();
            channel_sum(b.x, N, C, S, c0, c1, mean);
            for (int64_t c = c0; c < c1; c++) mean[c] = M ? mean[c] / (double)M : NAN;
            channel_sqdev(b.x, N, C, S, c0, c1, mean, var);
            for (int64_t c = c0; c < c1; c++) {
                const double v = M ? var[c] / (double)M : NAN;
                const double inv = 1.0 / sqrt(v + eps);
                const double unbiased = v * (double)M / (double)(M > 1 ? M - 1 : 1);
                a[c] = inv * sg_ldf(scale, sdt, c);
                off[c] = sg_ldf(bias, bdt, c);
                sg_stf(smean, smdt, c, (float)mean[c]);
                sg_stf(sinvstd, sidt, c, (float)inv);
                sg_stf(rmean, rmdt, c, (float)(momentum * sg_ldf(rmean, rmdt, c) + (1.0 - momentum) * mean[c]));
                sg_stf(rvar, rvdt, c, (float)(momentum * sg_ldf(rvar, rvdt, c) + (1.0 - momentum) * unbiased));
            }
            channel_affine(b.x, b.y, N, C, S, c0, c1, mean, a, off);
        }
    }
    close_bufs(xdt, y + yo * isz(xdt), n, &b, !err);
    free(mean);
    return err;
}

int sg_batchnorm_infer(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int mdt, const char *mean, int64_t mo, int vdt, const char *var, int64_t vo, double eps) {
    if ((xdt != SG_F32 && xdt != SG_F16)) return SG_EDTYPE;
    const int64_t n = N * C * S;
    scale += so * isz(sdt); bias += bo * isz(bdt); mean += mo * isz(mdt); var += vo * isz(vdt);
    fbufs b;
    int err = open_bufs(xdt, x + xo * isz(xdt), y + yo * isz(xdt), n, &b);
    double *m = (double *)malloc((size_t)(3 * C + 1) * sizeof(double)), *a = m + C, *off = a + C;
    if (!m) err = SG_ENOMEM;
    if (!err) {
        for (int64_t c = 0; c < C; c++) {
            m[c] = sg_ldf(mean, mdt, c);
            a[c] = sg_ldf(scale, sdt, c) / sqrt((double)sg_ldf(var, vdt, c) + eps);
            off[c] = sg_ldf(bias, bdt, c);
        }
        const int T = CHANNEL_THREADS(N, C, S);
        if (C >= T) {
#pragma omp parallel num_threads(T) if (T > 1)
            {
                CHANNEL_RANGE();
                channel_affine(b.x, b.y, N, C, S, c0, c1, m, a, off);
            }
        } else { /* few channels: split the batch instead */
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
            for (int64_t i = 0; i < N; i++)
                channel_affine(b.x + i * C * S, b.y + i * C * S, 1, C, S, 0, C, m, a, off);
        }
    }
    close_bufs(xdt, y + yo * isz(xdt), n, &b, !err);
    free(m);
    return err;
}

int sg_batchnorm_backward(int xdt, const char *dy, int64_t dyo, const char *x, int64_t xo, char *dx, int64_t dxo,
                          int64_t N, int64_t C, int64_t S, int sdt, const char *scale, int64_t so,
                          int smdt, const char *smean, int64_t smo, int sidt, const char *sinvstd, int64_t sio,
                          int dsdt, char *dscale, int64_t dso, int dbdt, char *dbias, int64_t dbo) {
    if ((xdt != SG_F32 && xdt != SG_F16)) return SG_EDTYPE;
    const int64_t n = N * C * S, M = N * S;
    scale += so * isz(sdt); smean += smo * isz(smdt); sinvstd += sio * isz(sidt);
    dscale += dso * isz(dsdt); dbias += dbo * isz(dbdt);
    fbufs b;
    int err = open_bufs(xdt, x + xo * isz(xdt), dx + dxo * isz(xdt), n, &b);
    int own_dy = 0;
    float *fdy = err ? NULL : sg_as_f32(dy + dyo * isz(xdt), xdt, n, &own_dy);
    double *db = (double *)malloc((size_t)(2 * C + 1) * sizeof(double)), *ds = db + C;
    if (!fdy || !db) err = SG_ENOMEM;
    if (!err) {
        const int T = CHANNEL_THREADS(N, C, S);
#pragma omp parallel num_threads(T) if (T > 1)
        {
            CHANNEL_RANGE();
            for (int64_t c = c0; c < c1; c++) ds[c] = db[c] = 0.0;
            for (int64_t i = 0; i < N; i++)
                for (int64_t c = c0; c < c1; c++) {
                    const float *g = fdy + (i * C + c) * S, *p = b.x + (i * C + c) * S;
                    const double m = sg_ldf(smean, smdt, c);
                    double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
                    for (int64_t k = 0; k < S; k++) {
                        sg += g[k];
                        sgx += g[k] * (p[k] - m);
                    }
                    db[c] += sg;
                    ds[c] += sgx;
                }
            for (int64_t c = c0; c < c1; c++) {
                const double inv = sg_ldf(sinvstd, sidt, c);
                ds[c] *= inv; /* sum dy * xhat */
                sg_stf(dscale, dsdt, c, (float)ds[c]);
                sg_stf(dbias, dbdt, c, (float)db[c]);
            }
            for (int64_t i = 0; i < N; i++)
                for (int64_t c = c0; c < c1; c++) {
                    const float *g = fdy + (i * C + c) * S, *p = b.x + (i * C + c) * S;
                    float *q = b.y + (i * C + c) * S;
                    const double inv = sg_ldf(sinvstd, sidt, c), m = sg_ldf(smean, smdt, c);
                    /* dx = scale * inv / M * (M dy - db - xhat ds) = k1 dy + k2 (x - mean) + k3 */
                    const double k = sg_ldf(scale, sdt, c) * inv / (double)(M ? M : 1);
                    const double k1 = k * (double)M, k2 = -k * inv * ds[c], k3 = -k * db[c];
#pragma omp simd
                    for (int64_t j = 0; j < S; j++) q[j] = (float)(k1 * g[j] + k2 * ((double)p[j] - m) + k3);
                }
        }
    }
    close_bufs(xdt, dx + dxo * isz(xdt), n, &b, !err);
    if (own_dy) free(fdy);
    free(db);
    return err;
}
