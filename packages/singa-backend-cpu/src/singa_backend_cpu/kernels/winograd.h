/* Winograd F(4x4, 3x3) float32 convolutions (winograd.c), called by conv.c's float32 paths where they fit. */
#ifndef SINGA_CPU_WINOGRAD_H
#define SINGA_CPU_WINOGRAD_H

#include "common.h"

/* x (N, C, H, W) -> y (N, K, OH, OW): 3x3 taps, stride 1, no dilation, one group; the input pixel under output
 * (0, 0)'s first tap is (-pt, -pl) (any padding: taps outside the input read zeros) */
typedef struct {
    int64_t N, C, H, W, K, OH, OW, pt, pl;
} sg_wino;

/* Whether the path is on and worth taking for g: C and K multiples of 16, output planes >= 4x4 and mostly whole
 * tiles (sg_winograd_shape); for sg_winograd_conv, which transforms the weights at each call, also transformed weights
 * at most 4x the activations (sg_winograd_fits). */
int sg_winograd_shape(const sg_wino *g);
int sg_winograd_fits(const sg_wino *g);

/* u (36, Ci, Ko) = the transformed 3x3 kernels of w: (Ko, Ci, 3, 3), or with `flip` (Ci, Ko, 3, 3) turned by 180
 * degrees. Ko a multiple of 16. */
void sg_winograd_weights(const float *w, float *u, int64_t ci_n, int64_t ko_n, int flip);

/* y = conv(x, w) by its transformed weights u (sg_winograd_weights of w (K, C, 3, 3)), as sg_winograd_conv. */
int sg_winograd_run(const sg_wino *g, const float *x, const float *u, const float *b, const float *r, int relu,
                    float *y, int blocked);

/* y = conv(x, w) + b (b may be NULL), plus r (may be NULL, y's layout, may be y) and then ReLU where `relu`; w is
 * (K, C, 3, 3), or with `flip` (C, K, 3, 3) used turned by 180 degrees (the data gradient dx = conv(dy, w^T)). x, r
 * and y NCHW (blocked 0), or in channel blocks of `blocked` = 16 or 8 (N, C/16, H, W, 16 or N, C/8, H, W, 8).
 * Returns SG_OK or SG_ENOMEM. */
int sg_winograd_conv(const sg_wino *g, const float *x, const float *w, int flip, const float *b, const float *r,
                     int relu, float *y, int blocked);

#endif
