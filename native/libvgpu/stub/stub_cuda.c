/* Test-only stub of libcuda.so.1: N devices with given memory, a bump
 * allocator, contexts, launch counting with simulated busy time, and
 * cuGetProcAddress resolving base names against its own table. */
#include <pthread.h>
#include "vgpu_api.h"
#include "stub_state.h"
#include "stub_devices.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct { int dev; int primary; } stub_ctx_t;
static stub_ctx_t g_primary[STUB_MAXDEV];
static int g_primary_refs[STUB_MAXDEV];
/* static TLS, as a driver would use: no __tls_get_addr call per lookup */
static __thread stub_ctx_t *t_cur __attribute__((tls_model("initial-exec")));
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* process-local allocation table: key -> (size, dev) */
#define TAB_BITS 15
#define TAB_SIZE (1u << TAB_BITS)
typedef struct { uint64_t key; uint64_t size; int dev; } ent_t;
static ent_t *g_tab;
static _Atomic uint64_t g_next_addr = 0x7f0000000000ull;

static uint32_t hsh(uint64_t k) {
    k ^= k >> 30; k *= 0xbf58476d1ce4e5b9ull; k ^= k >> 27; k *= 0x94d049bb133111ebull; k ^= k >> 31;
    return (uint32_t)k & (TAB_SIZE - 1);
}

static int tab_find(uint64_t key, uint64_t *size, int *dev) {
    if (!g_tab || key == 0) return 0;
    for (uint32_t i = hsh(key);; i = (i + 1) & (TAB_SIZE - 1)) {
        if (g_tab[i].key == 0) return 0;
        if (g_tab[i].key == key) { *size = g_tab[i].size; *dev = g_tab[i].dev; return 1; }
    }
}
static void tab_put(uint64_t key, uint64_t size, int dev) {
    if (!g_tab) g_tab = calloc(TAB_SIZE, sizeof(ent_t));
    for (uint32_t i = hsh(key);; i = (i + 1) & (TAB_SIZE - 1))
        if (g_tab[i].key == 0) { g_tab[i].key = key; g_tab[i].size = size; g_tab[i].dev = dev; return; }
}
static int tab_take(uint64_t key, uint64_t *size, int *dev) {
    if (!g_tab || key == 0) return 0;
    for (uint32_t i = hsh(key);; i = (i + 1) & (TAB_SIZE - 1)) {
        if (g_tab[i].key == 0) return 0;
        if (g_tab[i].key == key) {
            *size = g_tab[i].size; *dev = g_tab[i].dev;
            /* backward-shift delete */
            uint32_t j = i;
            for (;;) {
                g_tab[i].key = 0;
                for (;;) {
                    j = (j + 1) & (TAB_SIZE - 1);
                    if (g_tab[j].key == 0) return 1;
                    uint32_t h = hsh(g_tab[j].key);
                    if (i <= j ? (i < h && h <= j) : (i < h || h <= j)) continue;
                    break;
                }
                g_tab[i] = g_tab[j];
                i = j;
            }
        }
    }
}

/* a forked child starts without contexts, as with the real driver */
static void stub_mem_fork_child(void);
static void stub_pool_fork_child(void);
static void stub_graph_fork_child(void);
static void stub_fork_child(void) {
    stub_mem_fork_child();
    stub_pool_fork_child();
    stub_graph_fork_child();
    memset(g_primary_refs, 0, sizeof g_primary_refs);
    t_cur = NULL;
    pthread_mutex_init(&g_mu, NULL);
}
__attribute__((constructor)) static void stub_ctor(void) { pthread_atfork(NULL, NULL, stub_fork_child); }

static int cur_dev(void) { return t_cur ? t_cur->dev : 0; }

static CUresult charge(int dev, uint64_t size) {
    stub_state_t *s = st_get();
    stub_proc_t *me = st_me();
    if (size > s->mem_total || st_dev_used(st_cphys(dev), 0) + size > s->mem_total) {
        if (size > s->mem_total || st_dev_used(st_cphys(dev), 1) + size > s->mem_total) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_fetch_add(&me->mem[st_cphys(dev)], size);
    return CUDA_SUCCESS;
}
static void uncharge(int dev, uint64_t size) { atomic_fetch_sub(&st_me()->mem[st_cphys(dev)], size); }

static CUresult alloc_common(CUdeviceptr *p, size_t size, int dev) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = charge(dev, size);
    if (r) return r;
    uint64_t a = atomic_fetch_add(&g_next_addr, (size + 511) & ~511ull);
    pthread_mutex_lock(&g_mu);
    tab_put(a, size, dev);
    pthread_mutex_unlock(&g_mu);
    *p = a;
    return CUDA_SUCCESS;
}
static CUresult free_common(uint64_t key) {
    uint64_t size; int dev, ok;
    pthread_mutex_lock(&g_mu);
    ok = tab_take(key, &size, &dev);
    pthread_mutex_unlock(&g_mu);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    uncharge(dev, size);
    return CUDA_SUCCESS;
}

#include "stub_mem.h"
#include "stub_pool.h"

EXPORT CUresult cuInit(unsigned int flags) { (void)flags; st_me(); return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 12040; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *c) { *c = st_ncvis(); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ord) {
    if (ord < 0 || ord >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    *d = ord; return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *pi, int attr, CUdevice dev) {
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    if (attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) *pi = st_sm_count(st_cphys(dev));
    else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) *pi = 1024;
    else *pi = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice dev) {
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    *b = st_get()->mem_total; return CUDA_SUCCESS;
}
/* the 16 bytes of the text UUID st_uuid/st_mig_uuid give (MIG instances their own) */
EXPORT CUresult cuDeviceGetUuid_v2(unsigned char u[16], CUdevice dev) {
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    static const unsigned char head[10] = {0x5a, 0x1e, 0, 0, 0, 0, 0x40, 0, 0x80, 0};
    memcpy(u, head, sizeof head);
    if (g_cmig[dev]) u[8] = 0x90;
    int phys = st_cphys(dev);
    for (int i = 0; i < 6; i++) u[15 - i] = (unsigned char)(phys >> (8 * i));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(unsigned char u[16], CUdevice dev) { return cuDeviceGetUuid_v2(u, dev); }
/* PCI bus id "domain:bus:device.function"; the stub's device i sits on bus i+1 */
EXPORT CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
    if (!id || len < 13) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(id, (size_t)len, "0000:%02x:00.0", st_cphys(dev) + 1);
    return CUDA_SUCCESS;
}

static void ctx_charge(int dev, int delta) {
    stub_proc_t *me = st_me();
    int phys = st_cphys(dev);
    atomic_fetch_add(&me->ctx[phys], delta);
    if (delta > 0) atomic_fetch_add(&me->mem[phys], st_get()->ctx_bytes);
    else atomic_fetch_sub(&me->mem[phys], st_get()->ctx_bytes);
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    int created = g_primary_refs[dev]++ == 0;
    if (created) { g_primary[dev].dev = dev; g_primary[dev].primary = 1; ctx_charge(dev, 1); }
    pthread_mutex_unlock(&g_mu);
    /* VGPU_STUB_RETAIN_DELAY_MS: a slow context creation (the process is already
     * listed by NVML meanwhile), to widen races between processes */
    if (created && getenv("VGPU_STUB_RETAIN_DELAY_MS")) usleep((useconds_t)atoi(getenv("VGPU_STUB_RETAIN_DELAY_MS")) * 1000u);
    *pctx = (CUcontext)&g_primary[dev];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (g_primary_refs[dev] == 0) r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--g_primary_refs[dev] == 0) ctx_charge(dev, -1);
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    pthread_mutex_lock(&g_mu);
    if (g_primary_refs[dev] > 0) { g_primary_refs[dev] = 0; ctx_charge(dev, -1); }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
static CUresult ctx_create(CUcontext *pctx, CUdevice dev) {
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    stub_state_t *s = st_get();
    if (s->ctx_bytes && st_dev_used(st_cphys(dev), 1) + s->ctx_bytes > s->mem_total) return CUDA_ERROR_OUT_OF_MEMORY;
    stub_ctx_t *c = calloc(1, sizeof *c);
    c->dev = dev;
    ctx_charge(dev, 1);
    t_cur = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *p, unsigned int f, CUdevice d) { (void)f; return ctx_create(p, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *p, void *a, int n, unsigned int f, CUdevice d) { (void)a; (void)n; (void)f; return ctx_create(p, d); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *p, void *a, unsigned int f, CUdevice d) { (void)a; (void)f; return ctx_create(p, d); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    stub_ctx_t *c = (stub_ctx_t *)ctx;
    if (!c || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_charge(c->dev, -1);
    if (t_cur == c) t_cur = NULL;
    free(c);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { if (!t_cur) return CUDA_ERROR_INVALID_CONTEXT; *d = t_cur->dev; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *p) { *p = (CUcontext)t_cur; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { t_cur = (stub_ctx_t *)c; return CUDA_SUCCESS; }

EXPORT CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot) {
    int dev = cur_dev();
    uint64_t t = st_get()->mem_total, u = st_dev_used(st_cphys(dev), 1);
    if (fr) *fr = u > t ? 0 : t - u;
    if (tot) *tot = t;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc_common(p, n, cur_dev()); }
static int graph_free(uint64_t dptr);
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!p || graph_free(p)) return CUDA_SUCCESS; /* a graph allocation goes back to the graph pool */
    return free_common(p);
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int es) {
    if (es != 4 && es != 8 && es != 16) return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (w + 511) & ~(size_t)511;
    CUresult r = alloc_common(p, pt * h, cur_dev());
    if (!r) *pitch = pt;
    return r;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int f) { (void)f; return alloc_common(p, n, cur_dev()); }

static size_t fmt_bytes(int f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}
static size_t nz(size_t v) { return v ? v : 1; }
static CUresult arr_alloc(void **h, size_t bytes) {
    CUdeviceptr p;
    CUresult r = alloc_common(&p, bytes, cur_dev());
    if (!r) *h = (void *)(uintptr_t)p;
    return r;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d) {
    return arr_alloc((void **)h, nz(d->Width) * nz(d->Height) * d->NumChannels * fmt_bytes(d->Format));
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return arr_alloc((void **)h, nz(d->Width) * nz(d->Height) * nz(d->Depth) * d->NumChannels * fmt_bytes(d->Format));
}
EXPORT CUresult cuArrayDestroy(CUarray h) { return free_common((uint64_t)(uintptr_t)h); }
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    size_t w = nz(d->Width), hh = nz(d->Height), dd = nz(d->Depth), tot = 0;
    for (unsigned i = 0; i < levels; i++) {
        tot += w * hh * dd;
        w = w > 1 ? w / 2 : 1; hh = hh > 1 ? hh / 2 : 1; dd = dd > 1 ? dd / 2 : 1;
    }
    return arr_alloc((void **)h, tot * d->NumChannels * fmt_bytes(d->Format));
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return free_common((uint64_t)(uintptr_t)h); }

static CUresult launch(uint64_t blocks) {
    stub_state_t *s = st_get();
    stub_proc_t *me = st_me();
    atomic_fetch_add(&s->launches, 1);
    atomic_fetch_add(&me->launches, 1);
    if (s->ns_per_block) {
        /* a synchronous kernel: the simulated GPU is busy until t1; long
         * kernels sleep (no CPU use, so host load does not skew the duty
         * cycle), short ones spin */
        uint64_t t0 = st_now_ns(), t1 = t0 + blocks * s->ns_per_block;
        if (t1 - t0 >= 200000) {
            struct timespec ts = {(time_t)(t1 / 1000000000ull), (long)(t1 % 1000000000ull)};
            while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) != 0) { }
        }
        while (st_now_ns() < t1) { }
        t1 = st_now_ns();
        uint64_t i = atomic_fetch_add(&me->ring_head, 1) % STUB_RING;
        stub_busy_t *ring = ST_RING(st_get(), me);
        ring[i].dev = st_cphys(cur_dev());
        ring[i].start_ns = t0;
        ring[i].end_ns = t1;
    }
    return CUDA_SUCCESS;
}
#define GRID(x, y, z) ((uint64_t)(x) * (y) * (z))
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned sm, CUstream st, void **pa, void **ex) {
    (void)f; (void)bx; (void)by; (void)bz; (void)sm; (void)st; (void)pa; (void)ex;
    return launch(GRID(gx, gy, gz));
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned sm, CUstream st, void **pa, void **ex) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sm, st, pa, ex);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **pa, void **ex) {
    (void)f; (void)pa; (void)ex;
    return launch(GRID(c->gridDimX, c->gridDimY, c->gridDimZ));
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **pa, void **ex) {
    return cuLaunchKernelEx(c, f, pa, ex);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned sm, CUstream st, void **pa) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sm, st, pa, NULL);
}
#include "stub_graph.h"
EXPORT CUresult cuGetExportTable(const void **t, const void *id) { (void)t; (void)id; return CUDA_ERROR_NOT_SUPPORTED; }

/* test helpers (not part of the driver API) */
EXPORT unsigned long long stubLaunchCount(void) { return atomic_load(&st_get()->launches); }
EXPORT unsigned long long stubProcLaunchCount(void) { return atomic_load(&st_me()->launches); }
EXPORT unsigned long long stubDeviceUsed(int dev) { return st_dev_used(st_cphys(dev), 1); }

/* test helper: the stub's own entry point by exact name, bypassing any
 * interposer (benchmarks call the driver directly and through libvgpu in the
 * same process) */
EXPORT void *stubDirect(const char *name) {
    if (!strcmp(name, "cuMemAlloc_v2")) return (void *)cuMemAlloc_v2;
    if (!strcmp(name, "cuMemFree_v2")) return (void *)cuMemFree_v2;
    if (!strcmp(name, "cuLaunchKernel")) return (void *)cuLaunchKernel;
    return NULL;
}

#include "stub_procs.h"
