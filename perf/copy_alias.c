/* How fast a copy runs by where its destination lies against its source modulo a page
 * (docs/same-host.md, *A copy's alignment*; perf/RESULTS.md, session 17). One process, buffers
 * in cache, the best of 50 copies per case:
 *   rep movsb       the instruction alone
 *   memcpy          glibc's memcpy (rep movsb from 2112 bytes up to 512 KiB on ERMS CPUs,
 *                   vector moves outside that range)
 *   memcpy@2.2.5    glibc's SSE2 copy (the symbol x86-64 glibc keeps for programs linked
 *                   before 2.14), which never uses rep movsb: what the Python client calls
 *   preadv          the kernel's copy (a memfd read into the destination): copy_to_user
 *   sse2 loop       16-byte loads and stores, 64 bytes a step: the server's own copy
 * for destinations 0 to 64 bytes past the source modulo 4096 (and 16 before), 64 KiB and
 * 256 KiB. On AMD Zen 3 rep movsb, and so glibc's memcpy and the kernel's copy, run some 20x
 * slower when the destination is 1 to 31 bytes past the source.
 *
 *     gcc -O2 -o /tmp/copy_alias perf/copy_alias.c -ldl && /tmp/copy_alias
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <emmintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

typedef void *(*copy_fn)(void *, const void *, size_t);

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *rep_movsb(void *d, const void *s, size_t n) {
    void *r = d;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    return r;
}

static void *sse2_loop(void *dst, const void *src, size_t n) {
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((size_t)d & 15)) & 15;
    if (head > n) head = n;
    for (size_t i = 0; i < head; i++) d[i] = s[i];
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_store_si128((__m128i *)d, a), _mm_store_si128((__m128i *)(d + 16), b);
        _mm_store_si128((__m128i *)(d + 32), c), _mm_store_si128((__m128i *)(d + 48), e);
    }
    for (size_t i = 0; i < n; i++) d[i] = s[i];
    return dst;
}

static int memfd;
static char *memfd_base;

static void *kernel_copy(void *d, const void *s, size_t n) {
    struct iovec v = {d, n};
    if (preadv(memfd, &v, 1, (const char *)s - memfd_base) != (ssize_t)n) abort();
    return d;
}

int main(void) {
    copy_fn old = (copy_fn)dlvsym(RTLD_DEFAULT, "memcpy", "GLIBC_2.2.5");
    size_t area = 4 << 20;
    memfd = memfd_create("copy-alias", 0);
    if (memfd < 0 || ftruncate(memfd, area) != 0) return 1;
    memfd_base = mmap(0, area, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    char *dst = mmap(0, area, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memfd_base == MAP_FAILED || dst == MAP_FAILED) return 1;
    memset(memfd_base, 1, area);
    memset(dst, 2, area);
    struct { const char *name; copy_fn f; } fns[] = {
        {"rep movsb", rep_movsb}, {"memcpy", memcpy}, {"memcpy@2.2.5", old},
        {"preadv", kernel_copy}, {"sse2 loop", sse2_loop},
    };
    int rels[] = {-16, 0, 1, 8, 16, 24, 31, 32, 48, 64};
    size_t sizes[] = {64 << 10, 256 << 10};
    printf("GB/s, buffers in cache; columns: destination minus source modulo 4096\n");
    for (int z = 0; z < 2; z++) {
        printf("\n%zu KiB        ", sizes[z] >> 10);
        for (int r = 0; r < 10; r++) printf("%7d", rels[r]);
        printf("\n");
        for (int f = 0; f < 5; f++) {
            if (!fns[f].f) continue;
            printf("%-14s", fns[f].name);
            for (int r = 0; r < 10; r++) {
                char *s = memfd_base + 8192, *d = dst + 8192 + 4096 + rels[r];
                double best = 1e18;
                for (int i = 0; i < 50; i++) {
                    double t0 = now_ns();
                    fns[f].f(d, s, sizes[z]);
                    double t = now_ns() - t0;
                    if (t < best) best = t;
                }
                printf("%7.1f", sizes[z] / best);
            }
            printf("\n");
        }
    }
    return 0;
}
