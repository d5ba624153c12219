/* Host memory and threads: aligned blocks for the device's pool, bulk copies, the OpenMP + OpenBLAS thread count and
 * where the OpenMP threads run. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
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

/* Where the threads run. When a process's threads are as many as its CPUs, the scheduler still sometimes puts two of
 * them on one CPU and leaves another idle, for tens of milliseconds (after another runtime's threads, e.g.
 * onnxruntime's, held a CPU): every fork-join kernel then runs at half speed. So each OpenMP worker gets a CPU of its
 * own, and the calling thread, which user code owns and whose threads inherit its mask, stays free: before each kernel
 * (sg_max_threads) it only checks that it is not on a worker's CPU, and if it is, it moves off and is freed again. */
__thread int sg_pin_owner = 0;
static cpu_set_t sg_workers_cpus; /* the workers' CPUs */
static cpu_set_t sg_away_cpus;    /* the process's other CPUs: where the caller belongs */
static cpu_set_t sg_all_cpus;     /* every CPU the process may use */

void sg_keep_apart(void) {
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &sg_workers_cpus)) return;
    /* leaving a CPU takes a mask without it; the full mask again right after lets the scheduler place the thread
     * freely from then on (a running thread is not moved back) */
    if (sched_setaffinity(0, sizeof sg_away_cpus, &sg_away_cpus) == 0)
        sched_setaffinity(0, sizeof sg_all_cpus, &sg_all_cpus);
}

/* A forked child has none of the workers (only the forking thread is copied): it keeps off no CPU. */
static void sg_forget_workers(void) {
    sg_pin_owner = 0;
    CPU_ZERO(&sg_workers_cpus);
}

int sg_pin_workers(const int *cpus, int n, const int *all, int nall) {
    static int at_fork = 0;
    if (!at_fork) at_fork = pthread_atfork(NULL, NULL, sg_forget_workers) == 0;
    CPU_ZERO(&sg_all_cpus);
    for (int i = 0; i < nall; i++)
        if (all[i] >= 0 && all[i] < CPU_SETSIZE) CPU_SET(all[i], &sg_all_cpus);
    CPU_ZERO(&sg_workers_cpus);
    sg_away_cpus = sg_all_cpus;
    if (cpus)
        for (int t = 1; t < n; t++)
            if (cpus[t] >= 0 && cpus[t] < CPU_SETSIZE) {
                CPU_SET(cpus[t], &sg_workers_cpus);
                CPU_CLR(cpus[t], &sg_away_cpus);
            }
    sg_pin_owner = 0; /* no moving off while the workers change (and for good when unpinned) */
    int failed = 0;
#pragma omp parallel num_threads(n) reduction(+ : failed)
    {
        const int t = omp_get_thread_num();
        if (t > 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            if (cpus) CPU_SET(cpus[t], &one);
            failed += sched_setaffinity(0, sizeof one, cpus ? &one : &sg_all_cpus) != 0;
        }
    }
    sg_pin_owner = cpus != NULL && failed == 0 && CPU_COUNT(&sg_away_cpus) > 0;
    return failed;
}
