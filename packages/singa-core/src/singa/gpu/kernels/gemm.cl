/* Batched matrix products that CLBlast does not do: integer dtypes (and every dtype when CLBlast is missing).
 * out[b] = alpha * op(a[b]) @ op(b[b]) + beta * out[b], a batch count of 1 broadcasting that operand. Work-groups
 * of TILE x TILE outputs stage TILE x TILE blocks of both operands in local memory. Integers accumulate in long
 * (wrapping like numpy); alpha/beta other than (1, 0) are applied in sg_acc, like the CPU backend's double.
 * Defined by table.py: T, LD, ST, ACC (long or float). */
#define TILE 16

__kernel SG_REQD_WG(TILE, TILE, 1)
void sg_gemm(const long M, const long N, const long K, const long batch_a, const long batch_b,
             __global const T *a, const long ao, __global const T *b, const long bo, __global T *c, const long co,
             const int ta, const int tb, const sg_acc alpha, const sg_acc beta) {
    SG_SHARED ACC As[TILE][TILE + 1];
    SG_SHARED ACC Bs[TILE][TILE + 1];
    const long bi = get_global_id(2);
    const int tx = get_local_id(0), ty = get_local_id(1);
    const long col = get_group_id(0) * TILE + tx, row = get_group_id(1) * TILE + ty;
    const long abase = ao + (batch_a == 1 ? 0 : bi * M * K), bbase = bo + (batch_b == 1 ? 0 : bi * K * N);
    ACC acc = 0;
    for (long k0 = 0; k0 < K; k0 += TILE) {
        const long ka = k0 + tx, kb = k0 + ty;
        /* As[ty][tx] = op(a)[row][ka], Bs[ty][tx] = op(b)[kb][col] */
        As[ty][tx] = (row < M && ka < K) ? (ACC)LD(a, abase + (ta ? ka * M + row : row * K + ka)) : (ACC)0;
        Bs[ty][tx] = (kb < K && col < N) ? (ACC)LD(b, bbase + (tb ? col * K + kb : kb * N + col)) : (ACC)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TILE; k++) acc += As[ty][k] * Bs[k][tx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < M && col < N) {
        const long o = co + bi * M * N + row * N + col;
        if (alpha == 1 && beta == 0) ST(c, o, acc);
        else ST(c, o, alpha * (sg_acc)acc + (beta != 0 ? beta * (sg_acc)LD(c, o) : 0));
    }
}
