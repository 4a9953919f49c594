/* CUDA driver hooks: memory-info virtualisation (cuDeviceTotalMem and cuMemGetInfo
 * show the container's limit and usage) and the counted device allocation
 * paths: linear memory (plain, managed, pitched, freed asynchronously), VMM
 * physical allocations, arrays and mipmapped arrays. Each reserves against the
 * limit before the real call and settles in the allocation table after it. */
#include "cudahook.h"
#include <time.h>

/* the container device of the current context (of CUDA device 0 without one) */
static inline int cur_dev(void) {
    CUdevice d;
    if (LIKELY(HAVE(cuCtxGetDevice)) && CU_REAL(cuCtxGetDevice)(&d) == CUDA_SUCCESS && d >= 0 && d < VG_MAXDEV)
        return vg_dev(d);
    return vg_dev(0);
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
    vg_tab_put(K_DPTR, *dptr, actual, dev, VG_CAT_DATA);
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
    int had = vg_tab_take(K_VMM, handle, &e);
    r = CU_REAL(cuMemRelease)(handle);
    if (r == CUDA_SUCCESS) {
        vg_vmm_gone(handle); /* an importer still holding it takes the charge over first */
        if (had) vg_unreserve(e.dev, e.size, e.cat);
    } else if (had) {
        vg_tab_restore(&e);
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
