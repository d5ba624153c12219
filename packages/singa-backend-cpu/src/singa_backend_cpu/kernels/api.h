/* Entry points of the hand-written kernels. This file is read both by the C compiler and by cffi's cdef, so it holds
 * plain prototypes only: no preprocessor lines, no macros. Element offsets are in elements of the buffer's dtype;
 * dtype codes are singa.dtypes'; functions returning int return an SG_* status (common.h). */

/* memory.c */
char *sg_alloc(size_t nbytes);
void sg_free(char *p);
void sg_memcopy(char *dst, int64_t dst_byte_off, const char *src, int64_t src_byte_off, int64_t nbytes);
void sg_set_num_threads(int n);
int sg_get_num_threads(void);
/* thread t (1..n-1) of the caller's OpenMP team on CPU cpus[t] alone, the caller kept off those CPUs; cpus NULL: every
 * worker free to run on the process's CPUs `all` again. Returns how many workers could not be moved. */
int sg_pin_workers(const int *cpus, int n, const int *all, int nall);

/* onednn_launch.c: one launch of a oneDNN plan: point each memory object at its handle (an address, or an offset into
 * `arena` where in_arena[i]), copy the residual into the output, execute the primitives, wait. Returns oneDNN's status;
 * *failed: the step that failed (-1: a handle). */
typedef struct {
    void *set_handle;
    void *execute;
    void *wait;
    void *stream;
    int nmem;
    void **mems;
    const intptr_t *handles;
    const char *in_arena;
    char *residual_dst;
    const char *residual_src;
    int64_t residual_bytes;
    int nsteps;
    void **primitives;
    const int *nargs;
    void **args;
} sg_onednn_launch_t;
int sg_onednn_launch(const sg_onednn_launch_t *L, intptr_t arena, int *failed);

/* reduce.c: op 0 sum, 1 mean, 2 max, 3 min, 4 prod; dims = shape[ndim] then a 0/1 "reduced" flag per axis */
int sg_reduce(int op, int in_dtype, const char *x, int64_t xo, int out_dtype, char *out, int64_t oo, int ndim,
              const int64_t *dims);
int sg_argreduce(int want_max, int dtype, const char *x, int64_t xo, char *out, int64_t oo, int64_t outer,
                 int64_t len, int64_t inner);

/* gemm.c: out[B, m, n] = alpha * op(a) @ op(b) + beta * out; a has batch_a (1 or B) matrices, b batch_b; float32
 * on the outside GEMM where one is set, unless `openblas`. The matrices of a lie `stride_a` elements apart, each
 * row `ld_a` (>= its row length) after the one before; likewise b (float32 and float64: any such strides; other
 * dtypes: contiguous only, SG_EVALUE otherwise). out is contiguous. */
int sg_matmul(int dtype, const char *a, int64_t ao, int64_t stride_a, int64_t ld_a, const char *b, int64_t bo,
              int64_t stride_b, int64_t ld_b, char *out, int64_t oo, int64_t batch, int64_t batch_a, int64_t batch_b,
              int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, double alpha, double beta, int openblas);
void sg_set_sgemm(void *fn); /* an outside float32 GEMM (oneDNN's dnnl_sgemm signature), or NULL for OpenBLAS */

/* conv.c: geom = N, C, H, W, K, kh, kw, OH, OW, stride h, w, pad top, left, bottom, right, dilation h, w, groups */
int sg_conv2d(int dtype, const char *x, int64_t xo, const char *w, int64_t wo, const char *b, int64_t bo, char *y,
              int64_t yo, const int64_t *geom);
/* conv2d_fused's post-ops in one pass over n elements: y = t + r, then max(., 0) with relu (NaN kept); r may be NULL,
 * y may be t or r. float32 and float64 (else SG_EDTYPE: the caller takes the add and relu kernels). */
int sg_conv2d_post(int dtype, char *y, int64_t yo, const char *t, int64_t to, const char *r, int64_t ro, int64_t n,
                   int relu);
int sg_conv2d_backward_data(int dtype, const char *dy, int64_t dyo, const char *w, int64_t wo, char *dx, int64_t dxo,
                            const int64_t *geom);
int sg_conv2d_backward_weight(int dtype, const char *dy, int64_t dyo, const char *x, int64_t xo, char *dw,
                              int64_t dwo, const int64_t *geom);
/* winograd.c: float32 3x3 stride-1 convolutions and data gradients by Winograd F(4x4, 3x3) where they fit (on unless
 * turned off); sg_conv2d_winograd tells whether sg_conv2d (data gradient: sg_conv2d_backward_data) takes that path */
void sg_set_winograd(int on);
int sg_get_winograd(void);
int sg_conv2d_winograd(const int64_t *geom, int data_gradient);
/* ... and in pieces, for callers that keep the transformed weights u (36 * C * K floats) of constant ones: whether
 * the forward geometry can take the path then; u from w (K, C, 3, 3); y = conv(x, w) + b, plus r (may be NULL, may be
 * y) and ReLU where `relu`, with x, r and y NCHW (blocked 0) or in channel blocks of `blocked` = 16 or 8
 * (N, C/16, H, W, 16 or N, C/8, H, W, 8; SG_EVALUE for another) */
int sg_winograd_usable(const int64_t *geom);
int sg_winograd_transform(const char *w, int64_t wo, char *u, const int64_t *geom);
int sg_winograd_forward(const char *x, int64_t xo, const char *u, const char *b, int64_t bo, const char *r, int64_t ro,
                        char *y, int64_t yo, const int64_t *geom, int relu, int blocked);
/* conv.c: a float32 forward convolution of one group on operands in channel blocks of `block` (x, y and r as
 * (N, C/block, H, W, block); w (K, C, kh, kw) plain): y = conv(x, w) + b, plus r (may be NULL, may be y) and ReLU
 * where `relu`, as an unfolding of x and one GEMM over the threads (oneDNN's sgemm where set) per chunk of images;
 * SG_EVALUE where the channels do not divide into blocks or groups > 1, SG_ENOMEM without scratch */
int sg_conv2d_gemm_blocked(const char *x, int64_t xo, const char *w, int64_t wo, const char *b, int64_t bo,
                           const char *r, int64_t ro, char *y, int64_t yo, const int64_t *geom, int relu, int block);

/* pool.c: mode 0 max, 1 avg; geom = N, C, H, W, OH, OW, kh, kw, stride h, w, pad top, left, bottom, right,
 * dilation h, w; idx (int64) may be NULL */
int sg_pool2d(int dtype, int mode, int count_include_pad, const char *x, int64_t xo, char *y, int64_t yo, char *idx,
              int64_t io, const int64_t *geom);
int sg_pool2d_backward(int dtype, int mode, int count_include_pad, const char *dy, int64_t dyo, const char *x,
                       int64_t xo, const char *idx, int64_t io, char *dx, int64_t dxo, const int64_t *geom);

/* batchnorm.c: x is (N, C, S) with S = H*W (1 for 2-D input); every per-channel view has its own dtype */
int sg_batchnorm_train(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int rmdt, char *rmean, int64_t rmo, int rvdt, char *rvar, int64_t rvo,
                       int smdt, char *smean, int64_t smo, int sidt, char *sinvstd, int64_t sio,
                       double momentum, double eps);
int sg_batchnorm_infer(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int mdt, const char *mean, int64_t mo, int vdt, const char *var, int64_t vo, double eps);
/* y = act(batchnorm_train's affine map) (relu != 0: ReLU), bit for bit its y where the statistics have the data's
 * dtype (float32, float64): the mean recomputed from x in double as batchnorm_train computes it, the saved invstd */
int sg_batchnorm_apply(int xdt, const char *x, int64_t xo, char *y, int64_t yo, int64_t N, int64_t C, int64_t S,
                       int sdt, const char *scale, int64_t so, int bdt, const char *bias, int64_t bo,
                       int mdt, const char *smean, int64_t mo, int idt, const char *sinvstd, int64_t io, int relu);
int sg_batchnorm_backward(int xdt, const char *dy, int64_t dyo, const char *x, int64_t xo, char *dx, int64_t dxo,
                          int64_t N, int64_t C, int64_t S, int sdt, const char *scale, int64_t so,
                          int smdt, const char *smean, int64_t smo, int sidt, const char *sinvstd, int64_t sio,
                          int dsdt, char *dscale, int64_t dso, int dbdt, char *dbias, int64_t dbo);
/* batchnorm.c: layer normalisation of the rows of x (rows, cols); scale and bias (cols,) may be NULL */
int sg_layer_norm(int dt, const char *x, int64_t xo, char *y, int64_t yo, char *mean, int64_t mo, char *invstd,
                  int64_t io, const char *scale, int64_t so, const char *bias, int64_t bo, int64_t rows, int64_t cols,
                  double eps);

/* softmax.c: the axis splits x into (outer, len, inner) */
int sg_softmax(int dtype, int log, const char *x, int64_t xo, char *y, int64_t yo, int64_t outer, int64_t len,
               int64_t inner);
int sg_softmax_backward(int dtype, int log, const char *dy, int64_t dyo, const char *y, int64_t yo, char *dx,
                        int64_t dxo, int64_t outer, int64_t len, int64_t inner);
int sg_softmax_cross_entropy(int dtype, const char *x, int64_t xo, int tdtype, const char *t, int64_t to,
                             char *loss, int64_t lo, int64_t N, int64_t C, int64_t *bad);
/* the position of the first of n int32/int64 labels outside [0, classes), or -1 */
int64_t sg_find_label_outside(int tdtype, const char *t, int64_t to, int64_t n, int64_t classes);
int sg_softmax_cross_entropy_backward(int dtype, const char *dloss, int64_t dlo, const char *x, int64_t xo,
                                      int tdtype, const char *t, int64_t to, char *dx, int64_t dxo, int64_t N,
                                      int64_t C, int64_t *bad);

/* indexing.c: x is (outer, axis_len, inner), indices are count int32/int64 values */
int sg_gather(int itemsize, const char *x, int64_t xo, int idt, const char *idx, int64_t io, char *out, int64_t oo,
              int64_t outer, int64_t axis_len, int64_t inner, int64_t count, int64_t *bad);
int sg_scatter_add(int dtype, char *out, int64_t oo, int idt, const char *idx, int64_t io, const char *upd,
                   int64_t uo, int64_t outer, int64_t axis_len, int64_t inner, int64_t count, int64_t *bad);
/* mode 0 constant, 1 reflect, 2 edge; dims = x shape[ndim], out shape[ndim], pads before[ndim]; value_bits is the
 * fill element's bit pattern */
int sg_pad(int itemsize, int mode, const char *x, int64_t xo, char *out, int64_t oo, int ndim, const int64_t *dims,
           uint64_t value_bits);

/* random.c: Philox4x32-10 draws (singa.primitives.PHILOX_DOC) */
void sg_philox_u32(uint64_t seed, uint64_t offset, int64_t n, uint32_t *out);
int sg_random_uniform(int dtype, char *out, int64_t oo, int64_t n, double low, double high, uint64_t seed,
                      uint64_t offset);
int sg_random_normal(int dtype, char *out, int64_t oo, int64_t n, double mean, double std, uint64_t seed,
                     uint64_t offset);
int sg_random_bernoulli(int dtype, char *out, int64_t oo, int64_t n, double p, uint64_t seed, uint64_t offset);

/* optim.c: in place, block by block: buf = momentum * buf + g (0 below the smallest normal number); w = w - lr * buf
 * (float32 or float64, contiguous) */
int sg_sgd_momentum(int dtype, char *w, int64_t wo, char *buf, int64_t bo, const char *g, int64_t go, int64_t n,
                    double lr, double momentum);
