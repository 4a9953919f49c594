/* bench_vgpu: median cost of a cuMemAlloc/cuMemFree pair and of a
 * cuLaunchKernel, with N live allocations held, plus private memory
 * (Private_Clean+Private_Dirty of /proc/self/smaps_rollup minus the shared
 * region). Run with and without LD_PRELOAD=libvgpu.so; the Python driver
 * subtracts. usage: bench_vgpu LIVE ROUNDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "vgpu_api.h"

static double ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static long private_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = 0, v;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Private_Clean: %ld", &v) == 1 || sscanf(line, "Private_Dirty: %ld", &v) == 1) kb += v;
    fclose(f);
    return kb;
}
int main(int argc, char **argv) {
    int live = argc > 1 ? atoi(argv[1]) : 0, rounds = argc > 2 ? atoi(argv[2]) : 51;
    const int batch = 2000;
    CUcontext c;
    cuInit(0);
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    CUdeviceptr *hold = calloc((size_t)live + 1, sizeof *hold);
    for (int i = 0; i < live; i++) cuMemAlloc_v2(&hold[i], 4096);
    double *a = calloc((size_t)rounds, sizeof *a), *l = calloc((size_t)rounds, sizeof *l);
    CUdeviceptr p;
    for (int r = 0; r < rounds; r++) {
        double t0 = ns();
        for (int i = 0; i < batch; i++) { cuMemAlloc_v2(&p, 4096); cuMemFree_v2(p); }
        double t1 = ns();
        for (int i = 0; i < batch; i++) cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        double t2 = ns();
        a[r] = (t1 - t0) / batch;
        l[r] = (t2 - t1) / batch;
    }
    qsort(a, (size_t)rounds, sizeof *a, cmp);
    qsort(l, (size_t)rounds, sizeof *l, cmp);
    printf("alloc_free_ns %.1f\nlaunch_ns %.1f\nprivate_kb %ld\n", a[rounds / 2], l[rounds / 2], private_kb());
    return 0;
}
