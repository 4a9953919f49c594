/* Stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync): a pool holds
 * device memory beyond what is allocated from it (freed blocks stay in the pool up to
 * its release threshold until a synchronisation, or until cuMemPoolTrimTo), so the
 * library counts what each pool really holds from the device, the pool's
 * CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, not the sizes of the allocations.
 *
 * An allocation first brings the pool's figure up to date, then reserves against the
 * limit only what the pool cannot serve from its unused memory (reserved - used), and
 * after the call counts the pool's new figure. Pools are brought up to date again after
 * every call that can make them give memory back (stream, event and context synchronisation,
 * trim, release threshold, destruction) and before a memory query. A pool grows in the
 * driver's granularity, so what it reserves may exceed the request; that excess is
 * counted as soon as it exists. */
#include "vgpu.h"

#include <stdlib.h>

typedef struct { CUmemoryPool pool; int dev; uint64_t charged; } pool_t;
static pool_t *g_pools; /* grows; entries move only under g_mu */
static int g_npools, g_cap;
static int g_any_charged; /* a fast path for the synchronisation hooks */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

#define HAVE(n) (vg_cuda_real[VGC_##n] != NULL)
#define REAL_OR_MISSING(n) do { if (UNLIKELY(!HAVE(n))) return CUDA_ERROR_NOT_FOUND; } while (0)

/* the entry of pool (dev: its container device when it is new); NULL when out of
 * memory; caller holds g_mu */
static pool_t *pool_get(CUmemoryPool pool, int dev) {
    for (int i = 0; i < g_npools; i++) if (g_pools[i].pool == pool) return &g_pools[i];
    if (dev < 0) dev = 0;
    if (g_npools == g_cap) {
        int n = g_cap ? g_cap * 2 : 16;
        pool_t *p = realloc(g_pools, (size_t)n * sizeof *p);
        if (!p) return NULL;
        g_pools = p;
        g_cap = n;
    }
    g_pools[g_npools] = (pool_t){pool, dev, 0};
    return &g_pools[g_npools++];
}
static uint64_t pool_attr(CUmemoryPool pool, int attr, int *ok) {
    cuuint64_t v = 0;
    *ok = HAVE(cuMemPoolGetAttribute) && CU_REAL(cuMemPoolGetAttribute)(pool, attr, &v) == CUDA_SUCCESS;
    return v;
}
/* count what the pool holds now; caller holds g_mu */
static void pool_sync(pool_t *e) {
    int ok;
    uint64_t held = pool_attr(e->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok);
    if (!ok || held == e->charged) return;
    if (held > e->charged) vg_charge_data(e->dev, held - e->charged, +1);
    else vg_charge_data(e->dev, e->charged - held, -1);
    e->charged = held;
    if (held) g_any_charged = 1;
}
void vg_pools_sync_all(void) {
    if (!__atomic_load_n(&g_any_charged, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&g_mu);
    int any = 0;
    for (int i = 0; i < g_npools; i++) {
        if (g_pools[i].pool) pool_sync(&g_pools[i]);
        any |= g_pools[i].charged != 0;
    }
    g_any_charged = any;
    pthread_mutex_unlock(&g_mu);
}
void vg_pools_fork_child(void) {
    pthread_mutex_init(&g_mu, NULL);
    g_npools = 0; /* pools belong to the parent's contexts */
    g_any_charged = 0;
}
static void note(CUmemoryPool pool, int dev) {
    pthread_mutex_lock(&g_mu);
    pool_t *e = pool_get(pool, dev);
    if (e && !e->charged) e->dev = dev;
    pthread_mutex_unlock(&g_mu);
}

/* s is capturing a graph: the allocation adds a node and allocates nothing now */
static int capturing(CUstream s) {
    int st = 0;
    return s && HAVE(cuStreamIsCapturing) && CU_REAL(cuStreamIsCapturing)(s, &st) == CUDA_SUCCESS && st == 1;
}
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult pool_alloc(const char *what, CUdeviceptr *dptr, size_t size, CUmemoryPool pool, int dev,
                           CUstream s, alloc_fn fn) {
    pthread_mutex_lock(&g_mu);
    pool_t *e = pool_get(pool, dev);
    if (!e) { /* cannot count it: refuse rather than let it pass uncounted */
        pthread_mutex_unlock(&g_mu);
        LOG_WARN("%s: no memory to track the pool; %llu bytes refused", what, (unsigned long long)size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    dev = e->dev;
    pool_sync(e);
    int ok;
    uint64_t used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &ok);
    uint64_t spare = ok && e->charged > used ? e->charged - used : 0;
    uint64_t need = size > spare ? size - spare : 0;
    if (need && vg_reserve(dev, need, VG_CAT_DATA) != 0) {
        if (capturing(s)) { /* an allocation node of the captured graph: checked at its launch */
            CUresult r = fn(dptr, size, pool, s);
            pthread_mutex_unlock(&g_mu);
            return r;
        }
        pthread_mutex_unlock(&g_mu);
        LOG_WARN("%s: %llu bytes on device %d (pool needs %llu more) would exceed the limit %llu (in use %llu)",
                 what, (unsigned long long)size, dev, (unsigned long long)need, (unsigned long long)vg_limit[dev],
                 (unsigned long long)vg_usage(dev));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = fn(dptr, size, pool, s);
    if (need) vg_unreserve(dev, need, VG_CAT_DATA);
    pool_sync(e);
    pthread_mutex_unlock(&g_mu);
    return r;
}
static CUresult c_pool(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return CU_REAL(cuMemAllocFromPoolAsync)(p, n, pool, s);
}
static CUresult c_pool_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return CU_REAL(cuMemAllocFromPoolAsync_ptsz)(p, n, pool, s);
}
static CUresult c_async(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)pool; return CU_REAL(cuMemAllocAsync)(p, n, s);
}
static CUresult c_async_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)pool; return CU_REAL(cuMemAllocAsync_ptsz)(p, n, s);
}
/* cuMemAllocAsync allocates from the current device's current pool */
static CUresult async_alloc(const char *what, CUdeviceptr *dptr, size_t size, CUstream s, alloc_fn fn) {
    int ord = vg_cur_ord();
    CUmemoryPool pool = NULL;
    if (!dptr || !size || !HAVE(cuDeviceGetMemPool) || CU_REAL(cuDeviceGetMemPool)(&pool, ord) != CUDA_SUCCESS)
        return fn(dptr, size, NULL, s);
    return pool_alloc(what, dptr, size, pool, vg_dev(ord), s, fn);
}

VG_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemAllocAsync);
    return async_alloc("cuMemAllocAsync", dptr, size, s, c_async);
}
VG_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemAllocAsync_ptsz);
    return async_alloc("cuMemAllocAsync", dptr, size, s, c_async_ptsz);
}
VG_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemAllocFromPoolAsync);
    if (!dptr || !size) return c_pool(dptr, size, pool, s);
    return pool_alloc("cuMemAllocFromPoolAsync", dptr, size, pool, vg_dev(vg_cur_ord()), s, c_pool);
}
VG_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemAllocFromPoolAsync_ptsz);
    if (!dptr || !size) return c_pool_ptsz(dptr, size, pool, s);
    return pool_alloc("cuMemAllocFromPoolAsync", dptr, size, pool, vg_dev(vg_cur_ord()), s, c_pool_ptsz);
}

VG_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemPoolCreate);
    CUresult r = CU_REAL(cuMemPoolCreate)(pool, props);
    if (r == CUDA_SUCCESS && pool && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        note(*pool, vg_dev(props->location.id));
    return r;
}
/* "If any pointers obtained from this pool haven't been freed ... the function will return
 * immediately and the resources associated with the pool will be released automatically
 * once there are no more outstanding allocations": what is in use at the destruction stays
 * counted, until the process exits (the library does not follow each pointer); a
 * destroyed pool with live allocations must not be a way around the limit */
VG_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemPoolDestroy);
    pthread_mutex_lock(&g_mu);
    int ok;
    uint64_t used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &ok);
    CUresult r = CU_REAL(cuMemPoolDestroy)(pool);
    for (int i = 0; r == CUDA_SUCCESS && i < g_npools; i++)
        if (g_pools[i].pool == pool) {
            pool_t *e = &g_pools[i];
            uint64_t keep = ok ? used : e->charged;
            if (keep > e->charged) vg_charge_data(e->dev, keep - e->charged, +1);
            else vg_charge_data(e->dev, e->charged - keep, -1);
            *e = g_pools[--g_npools];
            break;
        }
    pthread_mutex_unlock(&g_mu);
    return r;
}
VG_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    VG_ENTER();
    REAL_OR_MISSING(cuDeviceGetMemPool);
    CUresult r = CU_REAL(cuDeviceGetMemPool)(pool, dev);
    if (r == CUDA_SUCCESS && pool) note(*pool, vg_dev(dev));
    return r;
}
VG_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    VG_ENTER();
    REAL_OR_MISSING(cuDeviceGetDefaultMemPool);
    CUresult r = CU_REAL(cuDeviceGetDefaultMemPool)(pool, dev);
    if (r == CUDA_SUCCESS && pool) note(*pool, vg_dev(dev));
    return r;
}
static void sync_one(CUmemoryPool pool) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_npools; i++) if (g_pools[i].pool == pool) pool_sync(&g_pools[i]);
    pthread_mutex_unlock(&g_mu);
}
VG_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemPoolTrimTo);
    CUresult r = CU_REAL(cuMemPoolTrimTo)(pool, keep);
    sync_one(pool);
    return r;
}
VG_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemPoolSetAttribute);
    CUresult r = CU_REAL(cuMemPoolSetAttribute)(pool, attr, value);
    sync_one(pool);
    return r;
}
VG_EXPORT CUresult cuStreamSynchronize(CUstream s) {
    VG_ENTER();
    REAL_OR_MISSING(cuStreamSynchronize);
    CUresult r = CU_REAL(cuStreamSynchronize)(s);
    vg_pools_sync_all();
    return r;
}
VG_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) {
    VG_ENTER();
    REAL_OR_MISSING(cuStreamSynchronize_ptsz);
    CUresult r = CU_REAL(cuStreamSynchronize_ptsz)(s);
    vg_pools_sync_all();
    return r;
}
VG_EXPORT CUresult cuEventSynchronize(void *ev) {
    VG_ENTER();
    REAL_OR_MISSING(cuEventSynchronize);
    CUresult r = CU_REAL(cuEventSynchronize)(ev);
    vg_pools_sync_all();
    return r;
}
VG_EXPORT CUresult cuCtxSynchronize(void) {
    VG_ENTER();
    REAL_OR_MISSING(cuCtxSynchronize);
    CUresult r = CU_REAL(cuCtxSynchronize)();
    vg_pools_sync_all();
    return r;
}
