/* startup_probe: one process of the startup benchmark (bench/bench_startup.py).
 * It links the stub driver directly, like a CUDA program built with -lcuda.
 *
 * usage: startup_probe BYTES
 * The launcher puts its CLOCK_MONOTONIC time just before execve, in ns, into
 * VGPU_BENCH_EXEC_NS. The probe runs cuInit, retains and sets device 0's
 * primary context and allocates BYTES with cuMemAlloc_v2, then prints one line:
 *   probe RC T_MAIN_NS T_INIT_NS T_ALLOC_NS CPU_MAIN_NS CPU_INIT_NS CPU_ALLOC_NS
 * RC is cuMemAlloc_v2's result (0 ok, 2 out of memory); T_* are wall times since
 * exec at main's start, after cuInit + context, after the allocation; CPU_* the
 * process's CPU time (user+sys, CLOCK_PROCESS_CPUTIME_ID) at the same points.
 * Exit status 0 when the allocation returned RC, 1 on any other failure. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "vgpu_api.h"

static int64_t clk(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    int64_t t_main = clk(CLOCK_MONOTONIC), c_main = clk(CLOCK_PROCESS_CPUTIME_ID);
    if (argc != 2) { fprintf(stderr, "usage: startup_probe BYTES\n"); return 1; }
    const char *e = getenv("VGPU_BENCH_EXEC_NS");
    int64_t t0 = e ? strtoll(e, NULL, 10) : t_main;
    size_t bytes = (size_t)strtoull(argv[1], NULL, 10);
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "startup_probe: driver init failed\n");
        return 1;
    }
    int64_t t_init = clk(CLOCK_MONOTONIC), c_init = clk(CLOCK_PROCESS_CPUTIME_ID);
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc_v2(&p, bytes);
    int64_t t_alloc = clk(CLOCK_MONOTONIC), c_alloc = clk(CLOCK_PROCESS_CPUTIME_ID);
    printf("probe %d %lld %lld %lld %lld %lld %lld\n", (int)r, (long long)(t_main - t0), (long long)(t_init - t0),
           (long long)(t_alloc - t0), (long long)c_main, (long long)c_init, (long long)c_alloc);
    fflush(stdout);
    if (r == CUDA_SUCCESS) cuMemFree_v2(p);
    return (r == CUDA_SUCCESS || r == CUDA_ERROR_OUT_OF_MEMORY) ? 0 : 1;
}
