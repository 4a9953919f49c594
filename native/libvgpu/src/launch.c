/* CUDA driver hooks: kernel and graph launches. Each passes the SM limiter
 * (limiter.c) with its grid's block count (a graph costs one) before the real
 * call; graph launches also settle graph memory nodes (graphs.c). */
#include "cudahook.h"

/* ---------------------------------------------------------------- launches */
static inline void pre_launch(uint64_t grid) {
    if (UNLIKELY(!vg_postinit_done)) vg_postinit();
    if (!vg_launched) vg_launched = 1;
    if (UNLIKELY(vg_limiter_on)) vg_rate_limit(grid);
}
#define GRID3(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

VG_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    ENTER();
    REAL_OR_MISSING(cuLaunchKernel);
    pre_launch(GRID3(gx, gy, gz));
    return CU_REAL(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
VG_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                       void **extra) {
    ENTER();
    REAL_OR_MISSING(cuLaunchKernel_ptsz);
    pre_launch(GRID3(gx, gy, gz));
    return CU_REAL(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
VG_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    ENTER();
    REAL_OR_MISSING(cuLaunchKernelEx);
    if (c) pre_launch(GRID3(c->gridDimX, c->gridDimY, c->gridDimZ));
    return CU_REAL(cuLaunchKernelEx)(c, f, params, extra);
}
VG_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    ENTER();
    REAL_OR_MISSING(cuLaunchKernelEx_ptsz);
    if (c) pre_launch(GRID3(c->gridDimX, c->gridDimY, c->gridDimZ));
    return CU_REAL(cuLaunchKernelEx_ptsz)(c, f, params, extra);
}
VG_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    ENTER();
    REAL_OR_MISSING(cuLaunchCooperativeKernel);
    pre_launch(GRID3(gx, gy, gz));
    return CU_REAL(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params);
}
VG_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                  unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                                                  void **params) {
    ENTER();
    REAL_OR_MISSING(cuLaunchCooperativeKernel_ptsz);
    pre_launch(GRID3(gx, gy, gz));
    return CU_REAL(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params);
}
VG_EXPORT CUresult cuGraphLaunch(void *g, CUstream s) {
    ENTER();
    REAL_OR_MISSING(cuGraphLaunch);
    pre_launch(1);
    return vg_graph_launch(g, s, 0); /* graph memory nodes: graphs.c */
}
VG_EXPORT CUresult cuGraphLaunch_ptsz(void *g, CUstream s) {
    ENTER();
    REAL_OR_MISSING(cuGraphLaunch_ptsz);
    pre_launch(1);
    return vg_graph_launch(g, s, 1); /* graph memory nodes: graphs.c */
}
