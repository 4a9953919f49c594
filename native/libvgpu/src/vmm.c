/* Virtual memory management: a cuMemCreate allocation is counted from cuMemCreate
 * until its memory is freed, which the driver does "when all outstanding mappings to
 * the memory are unmapped and when all outstanding references to the handle are also
 * released". A handle released while still mapped (the usual create, map, release
 * pattern) stays counted until its last mapping is unmapped, apart from any later
 * allocation that gets the same handle value. Reserving and freeing
 * address space, mapping, exporting and importing allocate no device memory and count
 * nothing; an imported handle is counted by the process that created the memory. */
#include <stdlib.h>
#include "vgpu.h"

typedef struct { CUdeviceptr ptr; uint64_t handle; } map_t;
typedef struct { uint64_t handle; int maps, released; } hstate_t;
static map_t *g_maps;
static hstate_t *g_hs;
static int g_nmaps, g_capmaps, g_nhs, g_caphs;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

#define REAL_OR_MISSING(n) do { if (UNLIKELY(!vg_cuda_real[VGC_##n])) return CUDA_ERROR_NOT_FOUND; } while (0)

static hstate_t *hs_find(uint64_t h) {
    for (int i = 0; i < g_nhs; i++) if (g_hs[i].handle == h) return &g_hs[i];
    return NULL;
}
static void hs_del(hstate_t *s) { *s = g_hs[--g_nhs]; }

/* a handle released while mapped: the allocation lives on under a private key (the
 * handle's value may come back from the next cuMemCreate), its mappings with it */
static uint64_t g_seq;
CUresult vg_vmm_release(uint64_t handle, int *mapped) {
    pthread_mutex_lock(&g_mu);
    hstate_t *s = hs_find(handle);
    *mapped = s && s->maps > 0;
    if (!*mapped) { pthread_mutex_unlock(&g_mu); return CUDA_SUCCESS; }
    uint64_t k = ++g_seq | (1ull << 63);
    int parked = vg_vmm_park(handle, k); /* before the release: the value cannot be reused yet */
    CUresult r = CU_REAL(cuMemRelease)(handle);
    if (r != CUDA_SUCCESS) {
        if (parked) vg_vmm_unpark(k, handle);
    } else {
        s->handle = k;
        s->released = 1;
        for (int i = 0; i < g_nmaps; i++) if (g_maps[i].handle == handle) g_maps[i].handle = k;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
void vg_vmm_fork_child(void) {
    pthread_mutex_init(&g_mu, NULL);
    g_nmaps = g_nhs = 0; /* the child owns none of the parent's mappings */
}

VG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemMap);
    pthread_mutex_lock(&g_mu);
    CUresult r = CU_REAL(cuMemMap)(ptr, size, offset, handle, flags);
    if (r == CUDA_SUCCESS) {
        hstate_t *s = hs_find(handle);
        if (!s && g_nhs == g_caphs) {
            int n = g_caphs ? g_caphs * 2 : 64;
            hstate_t *p = realloc(g_hs, (size_t)n * sizeof *p);
            if (p) { g_hs = p; g_caphs = n; }
        }
        if (!s && g_nhs < g_caphs) { s = &g_hs[g_nhs++]; *s = (hstate_t){handle, 0, 0}; }
        if (g_nmaps == g_capmaps) {
            int n = g_capmaps ? g_capmaps * 2 : 64;
            map_t *p = realloc(g_maps, (size_t)n * sizeof *p);
            if (p) { g_maps = p; g_capmaps = n; }
        }
        if (s && g_nmaps < g_capmaps) {
            g_maps[g_nmaps++] = (map_t){ptr, handle};
            s->maps++;
        } else {
            LOG_WARN("cuMemMap: no memory to track the mapping at %#llx", (unsigned long long)ptr);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
VG_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemUnmap);
    pthread_mutex_lock(&g_mu);
    CUresult r = CU_REAL(cuMemUnmap)(ptr, size);
    uint64_t drop = 0;
    int dropping = 0;
    if (r == CUDA_SUCCESS) {
        for (int i = 0; i < g_nmaps; i++) {
            if (g_maps[i].ptr != ptr) continue;
            uint64_t h = g_maps[i].handle;
            g_maps[i] = g_maps[--g_nmaps];
            hstate_t *s = hs_find(h);
            if (s && --s->maps == 0) {
                if (s->released) { drop = h; dropping = 1; }
                hs_del(s);
            }
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (dropping) vg_vmm_drop(drop);
    return r;
}
