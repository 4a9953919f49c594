/* CUDA driver hooks: contexts. A primary context is counted once per device
 * while it is retained; every other context from its creation to its
 * destruction. Each costs the measured context size (vg_context_size). */
#include "cudahook.h"
#include <string.h>

/* --------------------------------------------------------------- contexts */
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_prim_refs[VG_MAXDEV];
static uint64_t g_prim_charged[VG_MAXDEV];

void vg_ctx_fork_child(void) {
    pthread_mutex_init(&g_ctx_mu, NULL);
    memset(g_prim_refs, 0, sizeof g_prim_refs);
    memset(g_prim_charged, 0, sizeof g_prim_charged);
}

VG_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    ENTER();
    REAL_OR_MISSING(cuDevicePrimaryCtxRetain);
    if (dev < 0 || dev >= VG_MAXDEV) return CU_REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    pthread_mutex_lock(&g_ctx_mu);
    uint64_t charge = 0;
    int cd = g_prim_refs[dev] == 0 && vg_context_size ? vg_dev(dev) : -1; /* refs per ordinal, bytes per device */
    if (cd >= 0) {
        if (vg_reserve(cd, vg_context_size, VG_CAT_CONTEXT) != 0) {
            pthread_mutex_unlock(&g_ctx_mu);
            OOM("cuDevicePrimaryCtxRetain", cd, vg_context_size);
        }
        charge = vg_context_size;
    }
    CUresult r = CU_REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (r == CUDA_SUCCESS) {
        if (g_prim_refs[dev]++ == 0) g_prim_charged[dev] = charge;
    } else if (charge) {
        vg_unreserve(cd, charge, VG_CAT_CONTEXT);
    }
    pthread_mutex_unlock(&g_ctx_mu);
    return r;
}
VG_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER();
    REAL_OR_MISSING(cuDevicePrimaryCtxRelease_v2);
    pthread_mutex_lock(&g_ctx_mu);
    CUresult r = CU_REAL(cuDevicePrimaryCtxRelease_v2)(dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < VG_MAXDEV && g_prim_refs[dev] > 0 && --g_prim_refs[dev] == 0) {
        if (g_prim_charged[dev]) vg_unreserve(vg_dev(dev), g_prim_charged[dev], VG_CAT_CONTEXT);
        g_prim_charged[dev] = 0;
    }
    pthread_mutex_unlock(&g_ctx_mu);
    return r;
}
VG_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    ENTER();
    REAL_OR_MISSING(cuDevicePrimaryCtxReset_v2);
    pthread_mutex_lock(&g_ctx_mu);
    CUresult r = CU_REAL(cuDevicePrimaryCtxReset_v2)(dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < VG_MAXDEV && g_prim_refs[dev] > 0) {
        g_prim_refs[dev] = 0;
        if (g_prim_charged[dev]) vg_unreserve(vg_dev(dev), g_prim_charged[dev], VG_CAT_CONTEXT);
        g_prim_charged[dev] = 0;
    }
    pthread_mutex_unlock(&g_ctx_mu);
    return r;
}

#define CTX_CREATE(what, dev, call)                                                        \
    do {                                                                                   \
        int cd_ = vg_context_size ? vg_dev(dev) : -1;                                      \
        uint64_t sz_ = cd_ >= 0 ? vg_context_size : 0;                                     \
        if (sz_ && vg_reserve(cd_, sz_, VG_CAT_CONTEXT) != 0) OOM(what, cd_, sz_);        \
        CUresult r_ = call;                                                                \
        if (!sz_) return r_;                                                               \
        return settle(r_, K_CTX, (uint64_t)(uintptr_t)*pctx, sz_, cd_, VG_CAT_CONTEXT);   \
    } while (0)

VG_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    ENTER();
    REAL_OR_MISSING(cuCtxCreate_v2);
    if (!pctx) return CU_REAL(cuCtxCreate_v2)(pctx, flags, dev);
    CTX_CREATE("cuCtxCreate", dev, CU_REAL(cuCtxCreate_v2)(pctx, flags, dev));
}
VG_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned int flags, CUdevice dev) {
    ENTER();
    REAL_OR_MISSING(cuCtxCreate_v3);
    if (!pctx) return CU_REAL(cuCtxCreate_v3)(pctx, params, n, flags, dev);
    CTX_CREATE("cuCtxCreate", dev, CU_REAL(cuCtxCreate_v3)(pctx, params, n, flags, dev));
}
VG_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev) {
    ENTER();
    REAL_OR_MISSING(cuCtxCreate_v4);
    if (!pctx) return CU_REAL(cuCtxCreate_v4)(pctx, params, flags, dev);
    CTX_CREATE("cuCtxCreate", dev, CU_REAL(cuCtxCreate_v4)(pctx, params, flags, dev));
}
VG_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    ENTER();
    REAL_OR_MISSING(cuCtxDestroy_v2);
    FREE_TRACKED(K_CTX, (uint64_t)(uintptr_t)ctx, CU_REAL(cuCtxDestroy_v2)(ctx));
}
