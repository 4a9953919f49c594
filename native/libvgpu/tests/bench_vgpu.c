/* bench_vgpu: cost of libvgpu per cuMemAlloc/cuMemFree pair and per
 * cuLaunchKernel, measured in one process: every round times a batch through
 * the normal (interposed) entry points and a batch straight into the stub
 * (stubDirect), so machine load affects both sides alike; prints the median
 * per-round difference, the median direct cost, and private memory
 * (Private_Clean+Private_Dirty of all mappings except the region and stub
 * state files). usage: bench_vgpu LIVE ROUNDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "vgpu_api.h"

void *stubDirect(const char *name);

static double ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}
/* private memory (kB) of every mapping except the shared files (region, stub state) */
static long private_kb(void) {
    const char *skip1 = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"), *skip2 = getenv("VGPU_STUB_STATE");
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    long kb = 0, v;
    int skip = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            skip = (skip1 && strstr(line, skip1)) || (skip2 && strstr(line, skip2));
            continue;
        }
        if (!skip && (sscanf(line, "Private_Clean: %ld", &v) == 1 || sscanf(line, "Private_Dirty: %ld", &v) == 1))
            kb += v;
    }
    fclose(f);
    return kb;
}

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
enum { BATCH = 2000 };

static double pairs(alloc_t a, free_t f) {
    CUdeviceptr p;
    double t0 = ns();
    for (int i = 0; i < BATCH; i++) { a(&p, 4096); f(p); }
    return (ns() - t0) / BATCH;
}
static double launches(launch_t l) {
    double t0 = ns();
    for (int i = 0; i < BATCH; i++) l(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    return (ns() - t0) / BATCH;
}

int main(int argc, char **argv) {
    int live = argc > 1 ? atoi(argv[1]) : 0, rounds = argc > 2 ? atoi(argv[2]) : 51;
    CUcontext c;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    CUdeviceptr *hold = calloc((size_t)live + 1, sizeof *hold);
    for (int i = 0; i < live; i++) cuMemAlloc_v2(&hold[i], 4096);
    alloc_t da = (alloc_t)stubDirect("cuMemAlloc_v2");
    free_t df = (free_t)stubDirect("cuMemFree_v2");
    launch_t dl = (launch_t)stubDirect("cuLaunchKernel");
    double *ad = calloc((size_t)rounds, sizeof(double)), *ld = calloc((size_t)rounds, sizeof(double));
    double *ab = calloc((size_t)rounds, sizeof(double)), *lb = calloc((size_t)rounds, sizeof(double));
    for (int r = 0; r < rounds; r++) {
        /* alternate the order so neither side always runs first */
        double h1, d1, h2, d2;
        if (r & 1) { d1 = pairs(da, df); h1 = pairs(cuMemAlloc_v2, cuMemFree_v2); d2 = launches(dl); h2 = launches(cuLaunchKernel); }
        else { h1 = pairs(cuMemAlloc_v2, cuMemFree_v2); d1 = pairs(da, df); h2 = launches(cuLaunchKernel); d2 = launches(dl); }
        ad[r] = h1 - d1; ab[r] = d1; ld[r] = h2 - d2; lb[r] = d2;
    }
    printf("alloc_free_ns %.1f\nalloc_free_direct_ns %.1f\nlaunch_ns %.1f\nlaunch_direct_ns %.1f\nprivate_kb %ld\n",
           median(ad, rounds), median(ab, rounds), median(ld, rounds), median(lb, rounds), private_kb());
    return 0;
}
