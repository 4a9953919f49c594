/* Virtual memory management: a cuMemCreate allocation is counted from cuMemCreate
 * until its memory is freed, which the driver does "when all outstanding mappings to
 * the memory are unmapped and when all outstanding references to the handle are also
 * released". A handle released while still mapped (the usual create, map, release
 * pattern) stays counted until its last mapping is unmapped, apart from any later
 * allocation that gets the same handle value. Reserving and freeing
 * address space, mapping, exporting and importing allocate no device memory. An
 * imported handle is counted by the process that created the memory while it holds
 * it, then by an importer that still does (vmmshare.c); an import that cannot be
 * linked to its creator is counted by the importer for what it maps. */
#include <stdlib.h>
#include <unistd.h>
#include "vgpu.h"

typedef struct { CUdeviceptr ptr; uint64_t handle; } map_t;
typedef struct { uint64_t handle; int maps, released; } hstate_t;
static map_t *g_maps;
static hstate_t *g_hs;
static int g_nmaps, g_capmaps, g_nhs, g_caphs;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* exports of this process's allocations and imports, by local key (the handle, or the
 * private key of a handle released while mapped); g_mu */
enum { SH_EXPORT = 1, SH_IMPORT = 2 };
typedef struct { uint64_t key, size, charged; uint32_t id; int kind, rec, privfd, cpid, dev; } sh_t;
static sh_t *g_sh;
static int g_nsh, g_capsh;
static int sh_room(void) {
    if (g_nsh < g_capsh) return 1;
    int n = g_capsh ? g_capsh * 2 : 16;
    sh_t *p = realloc(g_sh, (size_t)n * sizeof *p);
    if (!p) return 0;
    g_sh = p; g_capsh = n;
    return 1;
}
static sh_t *sh_find(uint64_t key, int kind) {
    for (int i = 0; i < g_nsh; i++) if (g_sh[i].key == key && g_sh[i].kind == kind) return &g_sh[i];
    return NULL;
}

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
        for (int i = 0; i < g_nsh; i++) if (g_sh[i].key == handle) g_sh[i].key = k;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
void vg_vmm_fork_child(void) {
    pthread_mutex_init(&g_mu, NULL);
    g_nmaps = g_nhs = 0; /* the child owns none of the parent's mappings */
    for (int i = 0; i < g_nsh; i++) if (g_sh[i].kind == SH_EXPORT) close(g_sh[i].privfd); /* nor exports */
    g_nsh = 0;
}

/* the last local reference of the allocation under key went: an export's charge goes to
 * an importer that still holds it (the caller then gives up its own); an import gives
 * up what it paid */
void vg_vmm_gone(uint64_t key) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nsh; i++) {
        if (g_sh[i].key != key) continue;
        sh_t e = g_sh[i];
        g_sh[i--] = g_sh[--g_nsh];
        if (e.kind == SH_EXPORT) {
            vg_share_unexport(e.id, e.dev, e.size);
            close(e.privfd);
        } else if (e.rec >= 0) {
            vg_share_unimport(e.rec, e.id, e.cpid, e.dev, e.size);
        } else if (e.charged) {
            vg_unreserve(e.dev, e.charged, VG_CAT_DATA);
        }
    }
    pthread_mutex_unlock(&g_mu);
}

VG_EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle, int type,
                                                unsigned long long flags) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemExportToShareableHandle);
    CUresult r = CU_REAL(cuMemExportToShareableHandle)(out, handle, type, flags);
    uint64_t size;
    int dev;
    if (r != CUDA_SUCCESS || !out || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        !vg_vmm_created(handle, &size, &dev))
        return r;
    pthread_mutex_lock(&g_mu);
    sh_t *old = sh_find(handle, SH_EXPORT);
    sh_t e = {handle, size, 0, old ? old->id : 0, SH_EXPORT, -1, -1, 0, dev};
    if (sh_room() && (e.rec = vg_share_export(dev, size, *(int *)out, &e.id, &e.privfd)) >= 0) g_sh[g_nsh++] = e;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* the container device an imported allocation lives on (-1: host memory) */
static int import_dev(CUmemGenericAllocationHandle h) {
    CUmemAllocationProp p = {0};
    if (vg_cuda_real[VGC_cuMemGetAllocationPropertiesFromHandle] &&
        CU_REAL(cuMemGetAllocationPropertiesFromHandle)(&p, h) == CUDA_SUCCESS) {
        if (p.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return -1;
        return vg_dev(p.location.id);
    }
    return vg_dev(vg_cur_ord());
}

VG_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemImportFromShareableHandle);
    CUresult r = CU_REAL(cuMemImportFromShareableHandle)(h, os, type);
    if (r != CUDA_SUCCESS || !h) return r;
    sh_t e = {*h, 0, 0, 0, SH_IMPORT, -1, -1, 0, -1};
    /* only a descriptor can be linked; other handle types (fabric) pay for what they map */
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        e.rec = vg_share_link((int)(intptr_t)os, &e.dev, &e.size, &e.id, &e.cpid);
    if (e.rec < 0) e.dev = import_dev(*h);
    pthread_mutex_lock(&g_mu);
    if (sh_room()) g_sh[g_nsh++] = e;
    else if (e.rec >= 0) vg_share_unimport(e.rec, e.id, e.cpid, e.dev, 0);
    pthread_mutex_unlock(&g_mu);
    return r;
}

VG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
    VG_ENTER();
    REAL_OR_MISSING(cuMemMap);
    pthread_mutex_lock(&g_mu);
    /* an import not linked to its creator: the importer pays for the bytes it maps */
    sh_t *im = sh_find(handle, SH_IMPORT);
    uint64_t want = offset + size, add = 0;
    if (im && im->rec < 0 && im->dev >= 0 && want > im->charged) {
        add = want - im->charged;
        if (vg_reserve(im->dev, add, VG_CAT_DATA) != 0) {
            pthread_mutex_unlock(&g_mu);
            LOG_WARN("cuMemMap: %llu bytes of an imported allocation on device %d would exceed the limit %llu",
                     (unsigned long long)add, im->dev, (unsigned long long)vg_limit[im->dev]);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    CUresult r = CU_REAL(cuMemMap)(ptr, size, offset, handle, flags);
    if (add && r != CUDA_SUCCESS) vg_unreserve(im->dev, add, VG_CAT_DATA);
    else if (add) im->charged = want;
    if (r == CUDA_SUCCESS && im && im->rec >= 0 && want > im->charged) { /* linked: a floor for what it pays */
        im->charged = want;
        if (want > im->size) im->size = want;
        vg_share_floor(im->rec, want);
    }
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
    if (dropping) vg_vmm_drop(drop); /* vg_vmm_gone first: an importer may take it over */
    return r;
}
