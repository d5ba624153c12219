/* Pooling kernels on sg_real planes (instantiated by pool.c, see real.h). */

static void SG_R(pool_forward)(const pgeom *q, int mode, int cip, const sg_real *x, sg_real *y, int64_t *idx,
                               const taps *tr, const taps *tc) {
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW, W = q->W;
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t p = 0; p < planes; p++) {
        const sg_real *xp = x + p * q->H * W;
        sg_real *yp = y + p * ohw;
        int64_t *ip = idx ? idx + p * ohw : NULL;
        for (int64_t oh = 0; oh < q->OH; oh++) {
            const int64_t i0 = tr->lo[oh], i1 = tr->hi[oh], hbase = oh * q->sh - q->pt;
            for (int64_t ow = 0; ow < q->OW; ow++) {
                const int64_t j0 = tc->lo[ow], j1 = tc->hi[ow], wbase = ow * q->sw - q->pl, o = oh * q->OW + ow;
                if (mode == POOL_MAX) {
                    sg_real best = 0;
                    int64_t bi = -1;
                    for (int64_t i = i0; i < i1; i++) {
                        const int64_t row = (hbase + i * q->dh) * W;
                        for (int64_t j = j0; j < j1; j++) {
                            const int64_t at = row + wbase + j * q->dw;
                            const sg_real v = xp[at];
                            /* first maximum wins; a NaN beats everything and the first NaN stays. Written as
                             * selects: on real data the comparison is a coin toss, and a branch mispredicts */
                            const int take = (bi < 0) | (v > best) | ((v != v) & (best == best));
                            best = take ? v : best;
                            bi = take ? at : bi;
                        }
                    }
                    yp[o] = bi < 0 ? 0 : best;
                    if (ip) ip[o] = bi;
                } else {
                    double sum = 0.0;
                    for (int64_t i = i0; i < i1; i++) {
                        const sg_real *row = xp + (hbase + i * q->dh) * W + wbase;
                        for (int64_t j = j0; j < j1; j++) sum += row[j * q->dw];
                    }
                    const int64_t inside = (i1 - i0) * (j1 - j0);
                    const int64_t div = cip ? tr->padded[oh] * tc->padded[ow] : inside;
                    yp[o] = inside == 0 ? 0 : (sg_real)(sum / (double)div);
                    if (ip) ip[o] = -1; /* average windows have no winner */
                }
            }
        }
    }
}

static void SG_R(pool_backward)(const pgeom *q, int mode, int cip, const sg_real *dy, const sg_real *x,
                                const int64_t *idx, sg_real *dx, const taps *tr, const taps *tc) {
    const int64_t planes = q->N * q->C, ohw = q->OH * q->OW, hw = q->H * q->W, W = q->W;
    const int T = sg_threads_for(planes * ohw * q->kh * q->kw, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
    for (int64_t p = 0; p < planes; p++) {
        sg_real *dxp = dx + p * hw;
        const sg_real *dyp = dy + p * ohw;
        memset(dxp, 0, (size_t)hw * sizeof(sg_real));
        if (mode == POOL_MAX && idx) { /* scatter to the forward's winners */
            const int64_t *ip = idx + p * ohw;
            for (int64_t o = 0; o < ohw; o++) {
                const int64_t at = ip[o];
                if (at >= 0 && at < hw) dxp[at] += dyp[o];
            }
            continue;
        }
        const sg_real *xp = x ? x + p * hw : NULL;
        for (int64_t oh = 0; oh < q->OH; oh++) {
            const int64_t i0 = tr->lo[oh], i1 = tr->hi[oh], hbase = oh * q->sh - q->pt;
            for (int64_t ow = 0; ow < q->OW; ow++) {
                const int64_t j0 = tc->lo[ow], j1 = tc->hi[ow], wbase = ow * q->sw - q->pl;
                const sg_real g = dyp[oh * q->OW + ow];
                if (mode == POOL_MAX) { /* no indices: find the winner again */
                    sg_real best = 0;
                    int64_t bi = -1;
                    for (int64_t i = i0; i < i1; i++)
                        for (int64_t j = j0; j < j1; j++) {
                            const int64_t at = (hbase + i * q->dh) * W + wbase + j * q->dw;
                            const sg_real v = xp[at];
                            const int take = (bi < 0) | (v > best) | ((v != v) & (best == best));
                            best = take ? v : best;
                            bi = take ? at : bi;
                        }
                    if (bi >= 0) dxp[bi] += g;
                    continue;
                }
                const int64_t inside = (i1 - i0) * (j1 - j0);
                if (inside == 0) continue;
                const sg_real share = (sg_real)((double)g / (double)(cip ? tr->padded[oh] * tc->padded[ow] : inside));
                for (int64_t i = i0; i < i1; i++) {
                    sg_real *row = dxp + (hbase + i * q->dh) * W + wbase;
                    for (int64_t j = j0; j < j1; j++) row[j * q->dw] += share;
                }
            }
        }
    }
}
