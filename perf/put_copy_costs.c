/* What a same-host put's copy is made of on this machine (docs/same-host.md, *Where a put's
 * time goes*; perf/RESULTS.md, session 16). One process, 1 MiB objects, a source buffer in
 * cache and destinations cycling through a 512 MiB memfd mapping whose pages are committed
 * (out of cache, as a segment is), N copies each, three rounds:
 *   pvr direct      process_vm_readv of the source straight into the destination: what the
 *                   server does for a put of a client's memory (each page pinned, then copied)
 *   pvr to staging  the same into a 128 KiB buffer that stays in cache: the pinning's cost
 *                   plus a copy that hits the cache
 *   staged + nt     process_vm_readv into that buffer, then a non-temporal copy on to the
 *                   destination (two copies, the second without reading the destination)
 *   clzero + pvr    each 64 KiB of the destination zeroed with CLZERO (AMD: a line written
 *                   without being read) before the kernel copies into it
 *   memcpy / nt     user-space copies into the destination, normal and non-temporal
 *   vmsplice + read the source spliced into a pipe (pages referenced, not copied) and read
 *                   from it into the destination: the pinning moves to the client's fast path
 *   first touch     a write to each page of a fresh memfd range, and MADV_POPULATE_WRITE
 *
 *     gcc -O2 -o /tmp/put_copy_costs perf/put_copy_costs.c && /tmp/put_copy_costs
 */
#define _GNU_SOURCE
#include <emmintrin.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define MIB (1UL << 20)
#define WINDOW (512UL << 20)
#define N 400

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void nt_copy(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m128i a = _mm_loadu_si128((const void *)(s + i));
        __m128i b = _mm_loadu_si128((const void *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const void *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const void *)(s + i + 48));
        _mm_stream_si128((void *)(d + i), a);
        _mm_stream_si128((void *)(d + i + 16), b);
        _mm_stream_si128((void *)(d + i + 32), c);
        _mm_stream_si128((void *)(d + i + 48), e);
    }
    _mm_sfence();
}

static int has_clzero(void) {
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000008), "c"(0));
    return (b & 1) != 0;
}

static void clzero(char *p, size_t n) {
    for (size_t i = 0; i < n; i += 64)
        __asm__ volatile("clzero" ::"a"(p + i) : "memory");
}

static void pvr(pid_t pid, char *dst, const char *src, size_t n) {
    struct iovec l = {dst, n}, r = {(void *)src, n};
    if (process_vm_readv(pid, &l, 1, &r, 1, 0) != (ssize_t)n) {
        perror("process_vm_readv");
        exit(1);
    }
}

static char *slot(char *dst, int i) { return dst + (size_t)(i % (WINDOW / MIB)) * MIB; }

int main(void) {
    size_t chunk = 128 << 10;
    int fd = memfd_create("put_copy_costs", 0);
    if (fd < 0 || ftruncate(fd, WINDOW) != 0) return 1;
    char *dst = mmap(0, WINDOW, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memset(dst, 1, WINDOW);
    char *src = aligned_alloc(4096, MIB), *stage = aligned_alloc(4096, chunk);
    memset(src, 7, MIB);
    memset(stage, 0, chunk);
    int p[2];
    if (pipe(p) != 0 || fcntl(p[1], F_SETPIPE_SZ, (int)MIB) < 0) perror("pipe");
    pid_t me = getpid();
    int cz = has_clzero();
    for (int round = 0; round < 3; round++) {
        double t = now();
        for (int i = 0; i < N; i++) pvr(me, slot(dst, i), src, MIB);
        double direct = (now() - t) * 1e6 / N;
        t = now();
        for (int i = 0; i < N; i++)
            for (size_t o = 0; o < MIB; o += chunk) pvr(me, stage, src + o, chunk);
        double staging = (now() - t) * 1e6 / N;
        t = now();
        for (int i = 0; i < N; i++)
            for (size_t o = 0; o < MIB; o += chunk) {
                pvr(me, stage, src + o, chunk);
                nt_copy(slot(dst, i + 100) + o, stage, chunk);
            }
        double staged = (now() - t) * 1e6 / N;
        double clz = 0;
        if (cz) {
            t = now();
            for (int i = 0; i < N; i++)
                for (size_t o = 0; o < MIB; o += 64 << 10) {
                    clzero(slot(dst, i + 200) + o, 64 << 10);
                    pvr(me, slot(dst, i + 200) + o, src + o, 64 << 10);
                }
            clz = (now() - t) * 1e6 / N;
        }
        t = now();
        for (int i = 0; i < N; i++) memcpy(slot(dst, i + 300), src, MIB);
        double mc = (now() - t) * 1e6 / N;
        t = now();
        for (int i = 0; i < N; i++) nt_copy(slot(dst, i + 400), src, MIB);
        double nt = (now() - t) * 1e6 / N;
        double tv = 0, tr = 0;
        for (int i = 0; i < N; i++) {
            struct iovec v = {src, MIB};
            t = now();
            while (v.iov_len) {
                ssize_t n = vmsplice(p[1], &v, 1, 0);
                if (n <= 0) { perror("vmsplice"); return 1; }
                v.iov_base = (char *)v.iov_base + n;
                v.iov_len -= n;
            }
            tv += now() - t;
            char *d = slot(dst, i + 150);
            size_t left = MIB;
            t = now();
            while (left) {
                ssize_t n = read(p[0], d + (MIB - left), left);
                if (n <= 0) return 1;
                left -= n;
            }
            tr += now() - t;
        }
        printf("us per MiB: pvr direct %.0f, pvr to staging %.0f, staged + nt %.0f, "
               "clzero + pvr %s%.0f, memcpy %.0f, nt %.0f, vmsplice %.0f + read %.0f\n",
               direct, staging, staged, cz ? "" : "(no clzero) ", clz, mc, nt, tv * 1e6 / N,
               tr * 1e6 / N);
    }
    size_t fresh = 128 * MIB;
    int fd2 = memfd_create("fresh", 0);
    if (ftruncate(fd2, fresh) != 0) return 1;
    char *f = mmap(0, fresh, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
    double t = now();
    for (size_t i = 0; i < fresh / 2; i += 4096) f[i] = 1;
    double touch = (now() - t) * 1e6 / (fresh / 2 / 4096);
    t = now();
    madvise(f + fresh / 2, fresh / 2, MADV_POPULATE_WRITE);
    double pop = (now() - t) * 1e6 / (fresh / 2 / 4096);
    printf("first touch: %.2f us per page written, %.2f us per page with MADV_POPULATE_WRITE\n",
           touch, pop);
    return memcmp(slot(dst, 150), src, MIB) != 0;
}
