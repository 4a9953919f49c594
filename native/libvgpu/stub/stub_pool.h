/* Stub driver, part 3 (included by stub_cuda.c after stub_mem.h): stream-ordered
 * allocation, modelled as the CUDA driver API reference describes it.
 *
 * Each device has a default pool (cuDeviceGetMemPool; cuMemPoolCreate makes more). A
 * pool reserves device memory as allocations need it and keeps it after
 * cuMemFreeAsync; at the next stream, event or context synchronisation it gives back what it
 * holds above its release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0),
 * never what is in use. cuMemPoolTrimTo(pool, keep) gives back unused memory down to
 * keep bytes. The attributes RESERVED_MEM_CURRENT / USED_MEM_CURRENT report the two
 * figures. The stub reuses freed pool memory for any later allocation of the pool
 * (no fragmentation) and grows the pool by exactly what is missing.
 */
#ifndef STUB_POOL_H
#define STUB_POOL_H

/* ---------------------------------------------------- stream-ordered pools */
typedef struct { int dev; uint64_t reserved, used, threshold, reserved_hi, used_hi; int live; } stub_pool_t;
static stub_pool_t g_defpool[STUB_MAXDEV];
#define SM_POOLS 1024
static stub_pool_t *g_pools[SM_POOLS];
static int g_npools;
typedef struct { uint64_t va, size; stub_pool_t *pool; } sm_palloc_t;
static sm_palloc_t g_pallocs[SM_MAX];
static int g_npallocs;

static stub_pool_t *pool_of(CUmemoryPool p) {
    for (int i = 0; i < STUB_MAXDEV; i++) if ((void *)p == (void *)&g_defpool[i]) return &g_defpool[i];
    for (int i = 0; i < g_npools; i++) if ((void *)p == (void *)g_pools[i] && g_pools[i]->live) return g_pools[i];
    return NULL;
}
static stub_pool_t *defpool(int dev) {
    stub_pool_t *p = &g_defpool[dev];
    p->dev = dev; p->live = 1;
    return p;
}
/* give back unused memory above keep */
static void pool_shrink(stub_pool_t *p, uint64_t keep) {
    if (keep < p->used) keep = p->used;
    if (p->reserved > keep) { uncharge(p->dev, p->reserved - keep); p->reserved = keep; }
}
static void pools_sync(void) {
    for (int i = 0; i < STUB_MAXDEV; i++) if (g_defpool[i].live) pool_shrink(&g_defpool[i], g_defpool[i].threshold);
    for (int i = 0; i < g_npools; i++) if (g_pools[i]->live) pool_shrink(g_pools[i], g_pools[i]->threshold);
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    *pool = (CUmemoryPool)(void *)defpool(dev);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) { return cuDeviceGetMemPool(pool, dev); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *p) {
    if (!pool || !p || p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->location.id < 0 ||
        p->location.id >= st_ncvis())
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (g_npools >= SM_POOLS) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_OUT_OF_MEMORY; }
    stub_pool_t *np = calloc(1, sizeof *np);
    np->dev = p->location.id; np->live = 1;
    g_pools[g_npools++] = np;
    *pool = (CUmemoryPool)(void *)np;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
/* "If any pointers obtained from this pool haven't been freed ... the function will
 * return immediately and the resources associated with the pool will be released
 * automatically once there are no more outstanding allocations": the unused memory goes
 * back now, each outstanding allocation's as it is freed; the default pool cannot be
 * destroyed */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    pthread_mutex_lock(&g_mu);
    stub_pool_t *p = pool_of(pool);
    CUresult r = !p || (p >= g_defpool && p < g_defpool + STUB_MAXDEV) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (!r) {
        pool_shrink(p, 0);
        p->live = 0; /* its allocations still hold p->used */
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    stub_pool_t *p = pool_of(pool);
    CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (p) {
        cuuint64_t v = 0;
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = p->reserved; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = p->reserved_hi; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = p->used; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = p->used_hi; break;
        default: *(int *)value = 1; pthread_mutex_unlock(&g_mu); return CUDA_SUCCESS; /* reuse flags: enabled */
        }
        *(cuuint64_t *)value = v;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    stub_pool_t *p = pool_of(pool);
    CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (p && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) p->threshold = *(cuuint64_t *)value;
    else if (p && attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) p->reserved_hi = p->reserved;
    else if (p && attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) p->used_hi = p->used;
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    pthread_mutex_lock(&g_mu);
    stub_pool_t *p = pool_of(pool);
    if (p) pool_shrink(p, keep);
    pthread_mutex_unlock(&g_mu);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult pool_alloc(CUdeviceptr *out, size_t n, stub_pool_t *p) {
    if (!out || !n) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = g_npallocs >= SM_MAX ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    uint64_t spare = p->reserved - p->used;
    if (!r && spare < n) {
        r = charge(p->dev, n - spare);
        if (!r) p->reserved += n - spare;
    }
    if (!r) {
        p->used += n;
        if (p->used > p->used_hi) p->used_hi = p->used;
        if (p->reserved > p->reserved_hi) p->reserved_hi = p->reserved;
        uint64_t a = atomic_fetch_add(&g_next_addr, (n + 511) & ~511ull);
        g_pallocs[g_npallocs++] = (sm_palloc_t){a, n, p};
        *out = a;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
static int graph_free(uint64_t dptr);
static CUresult pool_free(CUdeviceptr a) {
    if (graph_free(a)) return CUDA_SUCCESS; /* a graph allocation goes back to the graph pool */
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < g_npallocs; i++)
        if (g_pallocs[i].va == a) {
            stub_pool_t *pl = g_pallocs[i].pool;
            pl->used -= g_pallocs[i].size; /* stays reserved until the next synchronisation */
            if (!pl->live) pool_shrink(pl, 0); /* a destroyed pool gives it back at once */
            g_pallocs[i] = g_pallocs[--g_npallocs];
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    return r;
}
/* stream capture (stub_graph.h): on a capturing stream an allocation or a free becomes a
 * node of the captured graph; 1 when it did */
static int capture_alloc(CUresult *r, CUdeviceptr *p, size_t n, int dev, CUstream s);
static int capture_free(CUdeviceptr p, CUstream s);
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
    CUresult cr;
    if (capture_alloc(&cr, p, n, cur_dev(), s)) return cr;
    pthread_mutex_lock(&g_mu);
    stub_pool_t *pl = defpool(cur_dev());
    pthread_mutex_unlock(&g_mu);
    return pool_alloc(p, n, pl);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    pthread_mutex_lock(&g_mu);
    stub_pool_t *pl = pool_of(pool);
    pthread_mutex_unlock(&g_mu);
    CUresult cr;
    if (pl && capture_alloc(&cr, p, n, pl->dev, s)) return cr;
    return pl ? pool_alloc(p, n, pl) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, n, pool, s);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return capture_free(p, s) ? CUDA_SUCCESS : pool_free(p); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    (void)s;
    pthread_mutex_lock(&g_mu); pools_sync(); pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
EXPORT CUresult cuCtxSynchronize(void) { return cuStreamSynchronize(NULL); }
EXPORT CUresult cuEventSynchronize(void *ev) { (void)ev; return cuStreamSynchronize(NULL); } /* launches complete at once */
/* a forked child holds none of these */
static void stub_pool_fork_child(void) {
    g_npallocs = 0;
    memset(g_defpool, 0, sizeof g_defpool);
    for (int i = 0; i < g_npools; i++) g_pools[i]->live = 0;
}
#endif
