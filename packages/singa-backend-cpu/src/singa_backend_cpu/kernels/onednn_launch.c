/* A replayed graph's launch of a oneDNN plan (onednn.py, bound launches): what _Plan.run does per call, in one call
 * from Python instead of one per memory object and primitive (~4 us of Python per convolution at batch 1). oneDNN
 * is loaded at run time, so its three entry points arrive as function pointers. */
#include "common.h"

typedef int (*sg_dnnl_set_handle_fn)(void *memory, void *handle);
typedef int (*sg_dnnl_execute_fn)(const void *primitive, void *stream, int nargs, const void *args);
typedef int (*sg_dnnl_wait_fn)(void *stream);

int sg_onednn_launch(const sg_onednn_launch_t *L, intptr_t arena, int *failed) {
    const sg_dnnl_set_handle_fn set_handle = (sg_dnnl_set_handle_fn)L->set_handle;
    const sg_dnnl_execute_fn execute = (sg_dnnl_execute_fn)L->execute;
    int st;
    for (int i = 0; i < L->nmem; i++) {
        void *h = (void *)(L->in_arena[i] ? arena + L->handles[i] : L->handles[i]);
        if ((st = set_handle(L->mems[i], h)) != 0) {
            *failed = -1;
            return st;
        }
    }
    if (L->residual_bytes > 0) sg_memcopy(L->residual_dst, 0, L->residual_src, 0, L->residual_bytes);
    for (int s = 0; s < L->nsteps; s++) {
        if ((st = execute(L->primitives[s], L->stream, L->nargs[s], L->args[s])) != 0) {
            *failed = s;
            return st;
        }
    }
    return ((sg_dnnl_wait_fn)L->wait)(L->stream);
}
