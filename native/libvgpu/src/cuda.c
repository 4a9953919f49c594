/* CUDA driver hooks: real-driver table, allocation accounting on every
 * device allocation path, memory-info virtualisation, cuGetProcAddress. */
#include "vgpu.h"
#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME(n) #n,
#define HOOKPTR(n) (void *)&n,
const char *const vg_cuda_names[VGC_NALL] = {VG_CUDA_HOOKS(NAME) VG_CUDA_HELPERS(NAME)};
void *vg_cuda_hook[VGC_NHOOKS] = {VG_CUDA_HOOKS(HOOKPTR)};
void *vg_cuda_real[VGC_NALL];

static pthread_mutex_t g_load_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_cuda_loaded; /* 1 ok, -1 failed */
static __thread int t_loading;

int vg_cuda_load(void) {
    int st = __atomic_load_n(&g_cuda_loaded, __ATOMIC_ACQUIRE);
    if (LIKELY(st)) return st > 0 ? 0 : -1;
    if (t_loading) return -1; /* re-entered from the driver's own initialisation */
    pthread_mutex_lock(&g_load_mu);
    if (!g_cuda_loaded) {
        t_loading = 1;
        vg_log_init();
        void *(*rdlsym)(void *, const char *) = vg_get_real_dlsym();
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
        if (!h || !rdlsym) {
            LOG_ERROR("cannot load libcuda.so.1: %s", dlerror());
            __atomic_store_n(&g_cuda_loaded, -1, __ATOMIC_RELEASE);
        } else {
            for (int i = 0; i < VGC_NALL; i++) {
                vg_cuda_real[i] = rdlsym(h, vg_cuda_names[i]);
                if (!vg_cuda_real[i]) LOG_DEBUG("driver lacks %s", vg_cuda_names[i]);
            }
            __atomic_store_n(&g_cuda_loaded, 1, __ATOMIC_RELEASE);
            LOG_DEBUG("loaded real libcuda");
        }
        t_loading = 0;
    }
    pthread_mutex_unlock(&g_load_mu);
    return g_cuda_loaded > 0 ? 0 : -1;
}

/* ------------------------------------------------------------ entry gate */
static volatile int g_ready;

static void tab_fork_child(void);
static void fork_child(void) {
    tab_fork_child();
    g_ready = 0;
    vg_slot = NULL;
    vg_pid = 0;
    vg_postinit_done = 0;
    vg_limiter_fork_child();
    vg_region_fork_child();
    vg_nvml_fork_child();
    vg_devmap_fork_child();
    vg_vmm_fork_child();
    vg_pools_fork_child();
    vg_graphs_fork_child();
    pthread_mutex_init(&g_load_mu, NULL);
}

static __attribute__((noinline)) int enter_slow(void) {
    static int atfork;
    if (!__atomic_exchange_n(&atfork, 1, __ATOMIC_SEQ_CST)) pthread_atfork(vg_limiter_fork_prepare, vg_limiter_fork_parent, fork_child);
    if (vg_cuda_load() != 0) return -1;
    if (vg_slot_ensure() != 0) return -1;
    g_ready = 1;
    return 0;
}

static __attribute__((noinline)) void run_gate_wait(void) {
    while (__atomic_load_n(&vg_slot->status, __ATOMIC_ACQUIRE) == 2) usleep(100000);
}

#define ENTER()                                                                      \
    do {                                                                             \
        if (UNLIKELY(!g_ready) && enter_slow() != 0) return CUDA_ERROR_NOT_INITIALIZED; \
        if (UNLIKELY(__atomic_load_n(&vg_slot->status, __ATOMIC_RELAXED) == 2)) run_gate_wait(); \
    } while (0)
#define HAVE(n) (vg_cuda_real[VGC_##n] != NULL)
#define REAL_OR_MISSING(n) do { if (UNLIKELY(!HAVE(n))) return CUDA_ERROR_NOT_FOUND; } while (0)

/* the container device of the current context (of CUDA device 0 without one) */
static inline int cur_dev(void) {
    CUdevice d;
    if (LIKELY(HAVE(cuCtxGetDevice)) && CU_REAL(cuCtxGetDevice)(&d) == CUDA_SUCCESS && d >= 0 && d < VG_MAXDEV)
        return vg_dev(d);
    return vg_dev(0);
}

/* --------------------------------------------- process-local allocation table */
enum { K_DPTR = 1, K_VMM, K_ARRAY, K_MIPMAP, K_CTX, K_VMMREL /* released while mapped (vmm.c) */ };
typedef struct { uint64_t key, size; uint32_t hash; uint8_t kind, cat; int16_t dev; } ent_t;
static ent_t *g_tab;
static uint32_t g_cap, g_cnt;
/* table lock: a test-and-test-and-set spinlock (critical sections are a few
 * dozen instructions; unlock is a plain release store) */
static int g_tab_lk;
static inline void tab_lock(void) {
    while (__atomic_exchange_n(&g_tab_lk, 1, __ATOMIC_ACQUIRE)) {
        for (int n = 0; __atomic_load_n(&g_tab_lk, __ATOMIC_RELAXED); n++) {
            if (n > 200) { sched_yield(); n = 0; }
#if defined(__x86_64__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ __volatile__("yield");
#endif
        }
    }
}
static inline void tab_unlock(void) { __atomic_store_n(&g_tab_lk, 0, __ATOMIC_RELEASE); }

/* data_size of the own slot mirrors the DATA entries of the table; only this
 * process writes its slot and only under the table lock */
static inline void data_cat(const ent_t *e, int sign) {
    if (e->cat != VG_CAT_DATA || e->dev < 0 || e->dev >= VG_MAXDEV || !vg_slot) return;
    uint64_t *f = &vg_slot->used[e->dev].data_size;
    uint64_t v = __atomic_load_n(f, __ATOMIC_RELAXED);
    __atomic_store_n(f, sign > 0 ? v + e->size : v - e->size, __ATOMIC_RELAXED);
}

static inline uint32_t hkey(uint64_t k, int kind) {
    /* splitmix64 finaliser: device pointers share their low bits (alignment),
     * so every input bit must reach the low bits used as the index */
    k ^= (uint64_t)kind * 0x9e3779b97f4a7c15ull;
    k ^= k >> 30; k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27; k *= 0x94d049bb133111ebull;
    k ^= k >> 31;
    return (uint32_t)k;
}
static void tab_put_nolock(const ent_t *e);
static int tab_grow(void) {
    uint32_t ncap = g_cap ? g_cap * 2 : 1024;
    ent_t *n = calloc(ncap, sizeof *n), *old = g_tab;
    if (!n) return -1;
    uint32_t ocap = g_cap;
    g_tab = n; g_cap = ncap; g_cnt = 0;
    for (uint32_t i = 0; i < ocap; i++) if (old[i].kind) tab_put_nolock(&old[i]);
    free(old);
    return 0;
}
static void tab_put_nolock(const ent_t *e) {
    if ((g_cnt + 1) * 2 > g_cap && tab_grow() != 0) return;
    uint32_t m = g_cap - 1;
    for (uint32_t i = e->hash & m;; i = (i + 1) & m) {
        if (!g_tab[i].kind || (g_tab[i].key == e->key && g_tab[i].kind == e->kind)) {
            if (!g_tab[i].kind) g_cnt++;
            g_tab[i] = *e;
            return;
        }
    }
}
static void tab_put(int kind, uint64_t key, uint64_t size, int dev, int cat) {
    ent_t e = {key, size, hkey(key, kind), (uint8_t)kind, (uint8_t)cat, (int16_t)dev};
    tab_lock();
    tab_put_nolock(&e);
    data_cat(&e, +1);
    tab_unlock();
}
static void tab_restore(const ent_t *e) {
    tab_lock();
    tab_put_nolock(e);
    data_cat(e, +1);
    tab_unlock();
}
/* remove (kind,key) into *out; backward-shift deletion keeps probes short */
static int tab_take(int kind, uint64_t key, ent_t *out) {
    uint32_t hv = hkey(key, kind);
    tab_lock();
    if (!g_cap) { tab_unlock(); return 0; }
    uint32_t m = g_cap - 1, i = hv & m;
    for (;; i = (i + 1) & m) {
        if (!g_tab[i].kind) { tab_unlock(); return 0; }
        if (g_tab[i].key == key && g_tab[i].kind == kind) break;
    }
    *out = g_tab[i];
    data_cat(out, -1);
    g_cnt--;
    uint32_t j = i;
    for (;;) {
        g_tab[i].kind = 0;
        for (;;) {
            j = (j + 1) & m;
            if (!g_tab[j].kind) goto done;
            uint32_t h = g_tab[j].hash & m;
            if (i <= j ? (i < h && h <= j) : (i < h || h <= j)) continue;
            break;
        }
        g_tab[i] = g_tab[j];
        i = j;
    }
done:
    tab_unlock();
    return 1;
}
static pthread_mutex_t g_ctx_mu;
static int g_prim_refs[VG_MAXDEV];
static uint64_t g_prim_charged[VG_MAXDEV];

/* the child of fork owns none of the parent's device objects */
static void tab_fork_child(void) {
    g_tab_lk = 0;
    pthread_mutex_init(&g_ctx_mu, NULL);
    if (g_tab) memset(g_tab, 0, (size_t)g_cap * sizeof *g_tab);
    g_cnt = 0;
    memset(g_prim_refs, 0, sizeof g_prim_refs);
    memset(g_prim_charged, 0, sizeof g_prim_charged);
}

/* after the real call: keep the reservation and remember the object, or undo */
static inline CUresult settle(CUresult r, int kind, uint64_t key, uint64_t size, int dev, int cat) {
    if (r != CUDA_SUCCESS) { vg_unreserve(dev, size, cat); return r; }
    tab_put(kind, key, size, dev, cat);
    return r;
}
#define OOM(what, dev, size)                                                                     \
    do {                                                                                         \
        if (vg_deny) {                                                                           \
            LOG_WARN("%s: %llu bytes on device %d refused (fail closed, see the error above)",  \
                     what, (unsigned long long)(size), dev);                                     \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                     \
        }                                                                                        \
        LOG_WARN("%s: %llu bytes on device %d would exceed the limit %llu (in use %llu)", what,  \
                 (unsigned long long)(size), dev, (unsigned long long)vg_limit[dev],     \
                 (unsigned long long)vg_usage(dev));                                             \
        return CUDA_ERROR_OUT_OF_MEMORY;                                                         \
    } while (0)

/* free path: forget first, free, restore the entry if the driver refused */
#define FREE_TRACKED(kind, key, call)                                         \
    do {                                                                      \
        ent_t e_;                                                             \
        int had_ = tab_take(kind, key, &e_);                                  \
        CUresult r_ = call;                                                   \
        if (had_) {                                                           \
            if (r_ == CUDA_SUCCESS) vg_unreserve(e_.dev, e_.size, e_.cat);    \
            else tab_restore(&e_);                                          \
        }                                                                     \
        return r_;                                                            \
    } while (0)

/* for the hooks in vmm.c and pools.c */
CUresult vg_cuda_enter(void) {
    ENTER();
    return CUDA_SUCCESS;
}
int vg_cur_ord(void) {
    CUdevice d;
    if (HAVE(cuCtxGetDevice) && CU_REAL(cuCtxGetDevice)(&d) == CUDA_SUCCESS && d >= 0 && d < VG_MAXDEV) return d;
    return 0;
}
/* a cuMemCreate allocation whose handle is released while mapped: its entry moves to
 * the private key k (the handle's value may come back from the next cuMemCreate);
 * 1 if there was one */
int vg_vmm_park(uint64_t handle, uint64_t k) {
    ent_t e;
    if (!tab_take(K_VMM, handle, &e)) return 0;
    e.key = k; e.kind = K_VMMREL; e.hash = hkey(k, K_VMMREL);
    tab_restore(&e);
    return 1;
}
void vg_vmm_unpark(uint64_t k, uint64_t handle) {
    ent_t e;
    if (!tab_take(K_VMMREL, k, &e)) return;
    e.key = handle; e.kind = K_VMM; e.hash = hkey(handle, K_VMM);
    tab_restore(&e);
}
/* the last mapping of a parked allocation is gone: uncount it (after an importer that
 * still holds it took the charge over) */
void vg_vmm_drop(uint64_t k) {
    ent_t e;
    vg_vmm_gone(k);
    if (tab_take(K_VMMREL, k, &e)) vg_unreserve(e.dev, e.size, e.cat);
}
/* 1 with its size and device when handle is a live cuMemCreate allocation of this process */
int vg_vmm_created(uint64_t handle, uint64_t *size, int *dev) {
    uint32_t hv = hkey(handle, K_VMM);
    int found = 0;
    tab_lock();
    if (g_cap)
        for (uint32_t m = g_cap - 1, i = hv & m; g_tab[i].kind; i = (i + 1) & m)
            if (g_tab[i].key == handle && g_tab[i].kind == K_VMM) {
                *size = g_tab[i].size; *dev = g_tab[i].dev; found = 1;
                break;
            }
    tab_unlock();
    return found;
}
/* bytes a pool holds from the device, counted as data of this process whatever the
 * limit (the device already holds them); sign > 0 adds */
void vg_charge_data(int dev, uint64_t bytes, int sign) {
    if (dev < 0 || dev >= VG_MAXDEV || !bytes || !vg_slot) return;
    ent_t e = {0, bytes, 0, 0, VG_CAT_DATA, (int16_t)dev};
    tab_lock();
    if (sign > 0) __atomic_fetch_add(&vg_slot->used[dev].total, bytes, __ATOMIC_SEQ_CST);
    data_cat(&e, sign);
    tab_unlock();
    if (sign < 0) vg_unreserve(dev, bytes, VG_CAT_DATA);
}

/* ------------------------------------------------------------- init/entry */
VG_EXPORT CUresult cuInit(unsigned int flags) {
    ENTER();
    REAL_OR_MISSING(cuInit);
    CUresult r = CU_REAL(cuInit)(flags);
    if (r == CUDA_SUCCESS && !vg_postinit_done) vg_postinit();
    return r;
}

static void *map_hook(void *p) {
    if (!p) return p;
    for (int i = 0; i < VGC_NHOOKS; i++)
        if (vg_cuda_real[i] == p) return vg_cuda_hook[i];
    return p;
}

VG_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    ENTER();
    REAL_OR_MISSING(cuGetProcAddress);
    CUresult r = CU_REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = map_hook(*pfn);
    return r;
}

VG_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    ENTER();
    REAL_OR_MISSING(cuGetProcAddress_v2);
    CUresult r = CU_REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn) *pfn = map_hook(*pfn);
    return r;
}

/* ------------------------------------------------------------ memory info */
VG_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    ENTER();
    REAL_OR_MISSING(cuDeviceTotalMem_v2);
    CUresult r = CU_REAL(cuDeviceTotalMem_v2)(bytes, dev);
    int cd = r == CUDA_SUCCESS ? vg_dev(dev) : -1;
    if (bytes && cd >= 0) {
        uint64_t lim = vg_limit[cd];
        if (lim && lim < *bytes) *bytes = lim;
    }
    return r;
}

static uint64_t usage_fresh(int dev) {
    /* queries are rare: reclaim killed processes so the figure does not drift */
    static __thread uint64_t last;
    uint64_t now = (uint64_t)time(NULL);
    if (now != last) { last = now; vg_reclaim_dead(); }
    return vg_usage(dev);
}

VG_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    ENTER();
    REAL_OR_MISSING(cuMemGetInfo_v2);
    size_t rf = 0, rt = 0;
    CUresult r = CU_REAL(cuMemGetInfo_v2)(&rf, &rt);
    if (r != CUDA_SUCCESS) return r;
    int dev = cur_dev();
    uint64_t lim = dev >= 0 ? vg_limit[dev] : 0;
    if (lim) {
        vg_pools_sync_all(); /* what the pools hold now (they give memory back at synchronisation) */
        vg_graphs_sync_all();
        uint64_t total = lim < rt ? lim : rt;
        uint64_t used = usage_fresh(dev);
        if (used > total) used = total; /* never wrap (field case B26) */
        uint64_t fr = total - used;
        if (fr > rf) fr = rf; /* other tenants of the GPU also hold memory */
        rf = fr; rt = total;
    }
    if (free_bytes) *free_bytes = rf;
    if (total_bytes) *total_bytes = rt;
    return r;
}

/* ------------------------------------------------------- device allocations */
static CUresult alloc_dptr(const char *what, CUdeviceptr *dptr, size_t size, int dev,
                           CUresult (*fn)(CUdeviceptr *, size_t, void *, void *), void *a, void *b) {
    if (!dptr) return fn(dptr, size, a, b);
    if (vg_reserve(dev, size, VG_CAT_DATA) != 0) OOM(what, dev, size);
    CUresult r = fn(dptr, size, a, b);
    return settle(r, K_DPTR, *dptr, size, dev, VG_CAT_DATA);
}

VG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    ENTER();
    REAL_OR_MISSING(cuMemAlloc_v2);
    int dev = cur_dev();
    if (!dptr || !size) return CU_REAL(cuMemAlloc_v2)(dptr, size);
    if (vg_reserve(dev, size, VG_CAT_DATA) != 0) OOM("cuMemAlloc", dev, size);
    CUresult r = CU_REAL(cuMemAlloc_v2)(dptr, size);
    return settle(r, K_DPTR, *dptr, size, dev, VG_CAT_DATA);
}

VG_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    ENTER();
    REAL_OR_MISSING(cuMemFree_v2);
    if (!dptr) return CU_REAL(cuMemFree_v2)(dptr);
    FREE_TRACKED(K_DPTR, dptr, CU_REAL(cuMemFree_v2)(dptr));
}

static CUresult c_managed(CUdeviceptr *p, size_t n, void *a, void *b) {
    (void)b; return CU_REAL(cuMemAllocManaged)(p, n, (unsigned)(uintptr_t)a);
}
VG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    ENTER();
    REAL_OR_MISSING(cuMemAllocManaged);
    if (!size) return CU_REAL(cuMemAllocManaged)(dptr, size, flags);
    return alloc_dptr("cuMemAllocManaged", dptr, size, cur_dev(), c_managed, (void *)(uintptr_t)flags, NULL);
}

VG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h, unsigned int es) {
    ENTER();
    REAL_OR_MISSING(cuMemAllocPitch_v2);
    if (!dptr || !pPitch || !w || !h || h > SIZE_MAX / w) return CU_REAL(cuMemAllocPitch_v2)(dptr, pPitch, w, h, es);
    int dev = cur_dev();
    uint64_t est = (uint64_t)w * h;
    if (vg_reserve(dev, est, VG_CAT_DATA) != 0) OOM("cuMemAllocPitch", dev, est);
    CUresult r = CU_REAL(cuMemAllocPitch_v2)(dptr, pPitch, w, h, es);
    if (r != CUDA_SUCCESS) { vg_unreserve(dev, est, VG_CAT_DATA); return r; }
    uint64_t actual = (uint64_t)*pPitch * h; /* the real footprint includes the row padding */
    if (actual > est) {
        if (vg_reserve(dev, actual - est, VG_CAT_DATA) != 0) {
            CU_REAL(cuMemFree_v2)(*dptr);
            vg_unreserve(dev, est, VG_CAT_DATA);
            OOM("cuMemAllocPitch", dev, actual);
        }
    } else if (actual < est) {
        vg_unreserve(dev, est - actual, VG_CAT_DATA);
    }
    tab_put(K_DPTR, *dptr, actual, dev, VG_CAT_DATA);
    return r;
}

VG_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    ENTER();
    REAL_OR_MISSING(cuMemFreeAsync);
    FREE_TRACKED(K_DPTR, dptr, CU_REAL(cuMemFreeAsync)(dptr, s));
}
VG_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    ENTER();
    REAL_OR_MISSING(cuMemFreeAsync_ptsz);
    FREE_TRACKED(K_DPTR, dptr, CU_REAL(cuMemFreeAsync_ptsz)(dptr, s));
}

/* virtual memory: only device-located physical allocations count, against
 * the device named in the properties (field cases B29, B30) */
VG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    ENTER();
    REAL_OR_MISSING(cuMemCreate);
    if (!handle || !prop || !size || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= VG_MAXDEV)
        return CU_REAL(cuMemCreate)(handle, size, prop, flags);
    int dev = vg_dev(prop->location.id);
    if (vg_reserve(dev, size, VG_CAT_DATA) != 0) OOM("cuMemCreate", dev, size);
    CUresult r = CU_REAL(cuMemCreate)(handle, size, prop, flags);
    return settle(r, K_VMM, *handle, size, dev, VG_CAT_DATA);
}
VG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    ENTER();
    REAL_OR_MISSING(cuMemRelease);
    int mapped;
    CUresult r = vg_vmm_release(handle, &mapped); /* still mapped: counted until the last unmap */
    if (mapped) return r;
    ent_t e;
    int had = tab_take(K_VMM, handle, &e);
    r = CU_REAL(cuMemRelease)(handle);
    if (r == CUDA_SUCCESS) {
        vg_vmm_gone(handle); /* an importer still holding it takes the charge over first */
        if (had) vg_unreserve(e.dev, e.size, e.cat);
    } else if (had) {
        tab_restore(&e);
    }
    return r;
}

/* arrays: footprint estimated from the descriptor (elements x format size) */
static uint64_t fmt_bytes(int f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}
static uint64_t nz(size_t v) { return v ? v : 1; }
static uint64_t arr3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t w = nz(d->Width), h = nz(d->Height), z = nz(d->Depth), tot = 0;
    for (unsigned i = 0; i < levels; i++) {
        tot += w * h * z;
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : 1;
        if (!(d->Flags & 0x1)) z = z > 1 ? z / 2 : 1; /* layered arrays keep their layers */
    }
    return tot * d->NumChannels * fmt_bytes(d->Format);
}
VG_EXPORT CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d) {
    ENTER();
    REAL_OR_MISSING(cuArrayCreate_v2);
    if (!h || !d) return CU_REAL(cuArrayCreate_v2)(h, d);
    int dev = cur_dev();
    uint64_t size = nz(d->Width) * nz(d->Height) * d->NumChannels * fmt_bytes(d->Format);
    if (vg_reserve(dev, size, VG_CAT_DATA) != 0) OOM("cuArrayCreate", dev, size);
    CUresult r = CU_REAL(cuArrayCreate_v2)(h, d);
    return settle(r, K_ARRAY, (uint64_t)(uintptr_t)*h, size, dev, VG_CAT_DATA);
}
VG_EXPORT CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    ENTER();
    REAL_OR_MISSING(cuArray3DCreate_v2);
    if (!h || !d) return CU_REAL(cuArray3DCreate_v2)(h, d);
    int dev = cur_dev();
    uint64_t size = arr3d_bytes(d, 1);
    if (vg_reserve(dev, size, VG_CAT_DATA) != 0) OOM("cuArray3DCreate", dev, size);
    CUresult r = CU_REAL(cuArray3DCreate_v2)(h, d);
    return settle(r, K_ARRAY, (uint64_t)(uintptr_t)*h, size, dev, VG_CAT_DATA);
}
VG_EXPORT CUresult cuArrayDestroy(CUarray h) {
    ENTER();
    REAL_OR_MISSING(cuArrayDestroy);
    FREE_TRACKED(K_ARRAY, (uint64_t)(uintptr_t)h, CU_REAL(cuArrayDestroy)(h));
}
VG_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    ENTER();
    REAL_OR_MISSING(cuMipmappedArrayCreate);
    if (!h || !d || !levels) return CU_REAL(cuMipmappedArrayCreate)(h, d, levels);
    int dev = cur_dev();
    uint64_t size = arr3d_bytes(d, levels);
    if (vg_reserve(dev, size, VG_CAT_DATA) != 0) OOM("cuMipmappedArrayCreate", dev, size);
    CUresult r = CU_REAL(cuMipmappedArrayCreate)(h, d, levels);
    return settle(r, K_MIPMAP, (uint64_t)(uintptr_t)*h, size, dev, VG_CAT_DATA);
}
VG_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) {
    ENTER();
    REAL_OR_MISSING(cuMipmappedArrayDestroy);
    FREE_TRACKED(K_MIPMAP, (uint64_t)(uintptr_t)h, CU_REAL(cuMipmappedArrayDestroy)(h));
}

/* --------------------------------------------------------------- contexts */
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;

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
