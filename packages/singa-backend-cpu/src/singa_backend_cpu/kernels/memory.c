/* Host memory and threads: aligned blocks for the device's pool, bulk copies, the OpenMP + OpenBLAS thread count. */
#include <sys/mman.h>

#include "common.h"

/* provided by scipy-openblas32's libscipy_openblas (symbols carry the scipy_ prefix) */
void scipy_openblas_set_num_threads(int num_threads);

#define HUGE_PAGE ((size_t)1 << 21)

char *sg_alloc(size_t nbytes) {
    if (nbytes >= 2 * HUGE_PAGE) {
        /* Large blocks on transparent huge pages, as numpy does for its arrays: streaming through 4 KiB pages costs a
         * TLB miss every 4 KiB, about a sixth of an element-wise kernel's time at 16M elements. */
        const size_t n = (nbytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        char *p = (char *)aligned_alloc(HUGE_PAGE, n);
#ifdef MADV_HUGEPAGE
        if (p) madvise(p, n, MADV_HUGEPAGE);
#endif
        return p;
    }
    /* 64-byte alignment: whole cache lines and aligned AVX-512 loads; aligned_alloc wants a multiple of it */
    size_t n = (nbytes + 63) & ~(size_t)63;
    return (char *)aligned_alloc(64, n ? n : 64);
}

void sg_free(char *p) { free(p); }

void sg_memcopy(char *dst, int64_t dst_byte_off, const char *src, int64_t src_byte_off, int64_t nbytes) {
    char *d = dst + dst_byte_off;
    const char *s = src + src_byte_off;
    if (nbytes <= 0 || d == s) return;
    const int overlap = d < s + nbytes && s < d + nbytes;
    const int T = overlap ? 1 : sg_threads_for(nbytes, 1 << 21);
    if (T < 2) {
        memmove(d, s, (size_t)nbytes);
        return;
    }
#pragma omp parallel num_threads(T)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = sg_chunk(nbytes, t, nt), hi = sg_chunk(nbytes, t + 1, nt);
        memcpy(d + lo, s + lo, (size_t)(hi - lo));
    }
}

int sg_nthreads = 0;

void sg_set_num_threads(int n) {
    if (n < 1) n = 1;
    sg_nthreads = n;
    omp_set_num_threads(n);
    /* OpenBLAS runs on the calling thread only: products are split over the OpenMP threads (see sg_sgemm) */
    scipy_openblas_set_num_threads(1);
}

int sg_get_num_threads(void) { return sg_max_threads(); }
