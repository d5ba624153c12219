/* Which x86-64 microarchitecture level this CPU and operating system run: 0 baseline (x86-64), 3 x86-64-v3 (AVX2,
 * FMA, BMI1/2, F16C, LZCNT, MOVBE), 4 x86-64-v4 (v3 plus AVX-512 F, BW, CD, DQ, VL). Compiled for the baseline, apart
 * from the kernels, so that it runs anywhere; the kernel module of the highest level it reports is loaded (isa.py).
 * The OS must save the wider registers on a context switch (XCR0), or their instructions fault even where CPUID
 * lists them. Other architectures report 0: their one kernel build uses the architecture's baseline. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <stdint.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

int sg_cpu_level(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned c1 = c;
    const int fma = (c1 >> 12) & 1, movbe = (c1 >> 22) & 1, osxsave = (c1 >> 27) & 1, avx = (c1 >> 28) & 1,
              f16c = (c1 >> 29) & 1;
    if (!osxsave || !avx) return 0;
    const uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return 0; /* XMM and YMM state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const unsigned b7 = b;
    const int bmi1 = (b7 >> 3) & 1, avx2 = (b7 >> 5) & 1, bmi2 = (b7 >> 8) & 1;
    if (!__get_cpuid(0x80000001, &a, &b, &c, &d)) return 0;
    const int lzcnt = (c >> 5) & 1;
    if (!(fma && movbe && f16c && bmi1 && avx2 && bmi2 && lzcnt)) return 0;
    const int avx512 = ((b7 >> 16) & 1) && ((b7 >> 17) & 1) && ((b7 >> 28) & 1) && ((b7 >> 30) & 1) && ((b7 >> 31) & 1);
    if (avx512 && (xcr0 & 0xe6) == 0xe6) return 4; /* opmask, upper ZMM0-15 and ZMM16-31 state */
    return 3;
}
#else
int sg_cpu_level(void) { return 0; }
#endif
