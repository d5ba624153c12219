/* Winograd F(4x4, 3x3) float32 convolutions (winograd.c), called by conv.c's float32 paths where they fit. */
#ifndef SINGA_CPU_WINOGRAD_H
#define SINGA_CPU_WINOGRAD_H

#include "common.h"

/* x (N, C, H, W) -> y (N, K, OH, OW): 3x3 taps, stride 1, no dilation, one group; the input pixel under output
 * (0, 0)'s first tap is (-pt, -pl) (any padding: taps outside the input read zeros) */
typedef struct {
    int64_t N, C, H, W, K, OH, OW, pt, pl;
} sg_wino;

/* Whether the path is on and worth taking for g (C and K multiples of 16, enough tiles, output planes >= 4x4). */
int sg_winograd_fits(const sg_wino *g);

/* y = conv(x, w) + b (b may be NULL), plus r (may be NULL, y's layout, may be y) and then ReLU where `relu`; w is
 * (K, C, 3, 3), or with `flip` (C, K, 3, 3) used turned by 180 degrees (the data gradient dx = conv(dy, w^T)). x, r
 * and y NCHW, or with `blocked` in 16-channel blocks (N, C/16, H, W, 16). Returns SG_OK or SG_ENOMEM. */
int sg_winograd_conv(const sg_wino *g, const float *x, const float *w, int flip, const float *b, const float *r,
                     int relu, float *y, int blocked);

#endif
