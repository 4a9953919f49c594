/* Stub driver, part 2 (included by stub_cuda.c): the allocation APIs of real
 * frameworks, modelled as the CUDA driver API reference describes them.
 *
 * Virtual memory management
 *   cuMemCreate allocates device memory (a shared object, stub_state.h); the handle is
 *   one reference. cuMemAddressReserve / cuMemAddressFree take and give back address
 *   space only. cuMemMap adds a reference (a mapping), cuMemUnmap drops it.
 *   cuMemExportToShareableHandle gives a file descriptor (POSIX file descriptor type) or
 *   64 bytes (fabric type) naming the object and allocates nothing; cuMemImportFromShareableHandle,
 *   in any process, gives a new handle that is one more reference. cuMemRelease drops
 *   the handle's reference (its value may be given to a later handle): "the memory
 *   allocation will be freed when all outstanding mappings to the memory are unmapped
 *   and when all outstanding references to the handle (including its shareable
 *   counterparts) are also released". (The stub's exported descriptor itself holds no
 *   reference.) cuMemGetAllocationPropertiesFromHandle reports a handle's location and type
 *   (the property structure has no size). A process that dies drops its references: what others still reference
 *   stays on the device (st_reap_objs).
 * CUDA IPC: stub_ipc.h.
 * Stream-ordered allocation: stub_pool.h.
 */
#ifndef STUB_MEM_H
#define STUB_MEM_H

#define SM_MAX 4096

/* ------------------------------------------------------ shared VMM objects */
static int obj_new(uint64_t size, int phys) {
    stub_state_t *s = st_get();
    for (int i = 0; i < STUB_MAXOBJ; i++) {
        uint64_t z = 0, id = atomic_fetch_add(&s->next_handle, 1);
        if (atomic_compare_exchange_strong(&s->objs[i].id, &z, id)) {
            s->objs[i].size = size;
            s->objs[i].phys = phys;
            s->objs[i].creator = (int)(st_me() - s->procs);
            atomic_store(&s->objs[i].orphan, 0);
            atomic_store(&s->objs[i].creator_refs, 1);
            atomic_store(&s->objs[i].refs, 1);
            return i;
        }
    }
    return -1;
}
/* the creator's own references, which its death drops (st_reap_objs) */
static void obj_mine(int i, int32_t delta) {
    stub_state_t *s = st_get();
    stub_obj_t *o = &s->objs[i];
    if (o->creator == (int)(st_me() - s->procs) && !atomic_load(&o->orphan)) atomic_fetch_add(&o->creator_refs, delta);
}
/* drop one reference; free the object (its charge) at zero */
static void obj_unref(int i) {
    stub_state_t *s = st_get();
    stub_obj_t *o = &s->objs[i];
    obj_mine(i, -1);
    if (atomic_fetch_sub(&o->refs, 1) != 1) return;
    if (atomic_load(&o->orphan)) atomic_fetch_sub(&s->orphan_mem[o->phys], o->size);
    else atomic_fetch_sub(&s->procs[o->creator].mem[o->phys], o->size);
    atomic_store(&o->id, 0);
}

/* this process's references: handles and mappings (obj = shared index) */
typedef struct { uint64_t key, size; int obj; } sm_ref_t;
static sm_ref_t g_handles[SM_MAX], g_maps[SM_MAX], g_reserved[SM_MAX];
static int g_nhandles, g_nmaps, g_nreserved;

/* handle values: a released handle's value is given to the next new handle (LIFO), as
 * with a driver whose handles are addresses of its own objects */
static uint64_t g_free_keys[SM_MAX];
static int g_nfree_keys;
static uint64_t new_key(void) {
    if (g_nfree_keys) return g_free_keys[--g_nfree_keys];
    return atomic_fetch_add(&st_get()->next_handle, 1) | (1ull << 62);
}
static void free_key(uint64_t k) { if (g_nfree_keys < SM_MAX) g_free_keys[g_nfree_keys++] = k; }

static int ref_find(sm_ref_t *a, int n, uint64_t key) {
    for (int i = 0; i < n; i++) if (a[i].key == key) return i;
    return -1;
}
static void ref_del(sm_ref_t *a, int *n, int i) { a[i] = a[--*n]; }

/* the creator drops its last own reference while other processes still hold some:
 * the bytes stay on the device, charged to no process */
static void obj_local_last(int obj) {
    stub_state_t *s = st_get();
    stub_obj_t *o = &s->objs[obj];
    if (o->creator != (int)(st_me() - s->procs) || atomic_load(&o->orphan) || atomic_load(&o->refs) <= 1) return;
    for (int i = 0; i < g_nhandles; i++) if (g_handles[i].obj == obj) return;
    for (int i = 0; i < g_nmaps; i++) if (g_maps[i].obj == obj) return;
    atomic_store(&o->orphan, 1);
    atomic_fetch_sub(&s->procs[o->creator].mem[o->phys], o->size);
    atomic_fetch_add(&s->orphan_mem[o->phys], o->size);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    (void)flags;
    if (!h || !prop || n == 0) return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (prop->location.id < 0 || prop->location.id >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
        dev = prop->location.id;
    }
    pthread_mutex_lock(&g_mu);
    if (g_nhandles >= SM_MAX) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_OUT_OF_MEMORY; }
    CUresult r = dev >= 0 ? charge(dev, n) : CUDA_SUCCESS; /* host memory costs the device nothing */
    int obj = r ? -1 : obj_new(dev >= 0 ? n : 0, dev >= 0 ? st_cphys(dev) : 0);
    if (!r && obj < 0) { if (dev >= 0) uncharge(dev, n); r = CUDA_ERROR_OUT_OF_MEMORY; }
    if (!r) {
        uint64_t key = new_key();
        g_handles[g_nhandles++] = (sm_ref_t){key, n, obj};
        *h = key;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    pthread_mutex_lock(&g_mu);
    int i = ref_find(g_handles, g_nhandles, h);
    if (i < 0) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE; }
    int obj = g_handles[i].obj;
    ref_del(g_handles, &g_nhandles, i);
    free_key(h);
    obj_local_last(obj);
    obj_unref(obj);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    (void)align; (void)addr; (void)flags;
    if (!ptr || !size) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (g_nreserved >= SM_MAX) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_OUT_OF_MEMORY; }
    uint64_t a = atomic_fetch_add(&g_next_addr, (size + 511) & ~511ull);
    g_reserved[g_nreserved++] = (sm_ref_t){a, size, -1};
    pthread_mutex_unlock(&g_mu);
    *ptr = a;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    pthread_mutex_lock(&g_mu);
    int i = ref_find(g_reserved, g_nreserved, ptr);
    CUresult r = i < 0 || g_reserved[i].size != size ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (!r) ref_del(g_reserved, &g_nreserved, i);
    pthread_mutex_unlock(&g_mu);
    return r;
}
/* a mapping must lie in a reservation and name a live handle of this process */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    (void)flags;
    pthread_mutex_lock(&g_mu);
    int hi = ref_find(g_handles, g_nhandles, h), in = 0;
    for (int i = 0; i < g_nreserved; i++)
        if (ptr >= g_reserved[i].key && ptr + size <= g_reserved[i].key + g_reserved[i].size) in = 1;
    CUresult r = CUDA_SUCCESS;
    if (hi < 0 || !in || !size || offset + size > g_handles[hi].size || ref_find(g_maps, g_nmaps, ptr) >= 0 ||
        g_nmaps >= SM_MAX)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        g_maps[g_nmaps++] = (sm_ref_t){ptr, size, g_handles[hi].obj};
        obj_mine(g_handles[hi].obj, 1);
        atomic_fetch_add(&st_get()->objs[g_handles[hi].obj].refs, 1);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    pthread_mutex_lock(&g_mu);
    int i = ref_find(g_maps, g_nmaps, ptr);
    if (i < 0 || g_maps[i].size != size) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE; }
    int obj = g_maps[i].obj;
    ref_del(g_maps, &g_nmaps, i);
    obj_local_last(obj);
    obj_unref(obj);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
/* the exported descriptor: a memfd holding (object index, object id) */
EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                             unsigned long long flags) {
    (void)flags;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && type != CU_MEM_HANDLE_TYPE_FABRIC)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_mu);
    int hi = ref_find(g_handles, g_nhandles, h);
    uint64_t rec[2] = {0, 0};
    if (hi >= 0) { rec[0] = (uint64_t)g_handles[hi].obj; rec[1] = atomic_load(&st_get()->objs[rec[0]].id); }
    pthread_mutex_unlock(&g_mu);
    if (hi < 0) return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_MEM_HANDLE_TYPE_FABRIC) { /* 64 bytes naming the object, valid in any process */
        memset(out, 0, sizeof(CUmemFabricHandle));
        memcpy(out, rec, sizeof rec);
        return CUDA_SUCCESS;
    }
    int fd = memfd_create("stub-vmm", 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (pwrite(fd, rec, sizeof rec, 0) != (ssize_t)sizeof rec) { close(fd); return CUDA_ERROR_UNKNOWN; }
    *(int *)out = fd;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type) {
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && type != CU_MEM_HANDLE_TYPE_FABRIC)
        return CUDA_ERROR_NOT_SUPPORTED;
    uint64_t rec[2];
    if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
        if (!os) return CUDA_ERROR_INVALID_VALUE;
        memcpy(rec, os, sizeof rec);
    } else if (pread((int)(intptr_t)os, rec, sizeof rec, 0) != (ssize_t)sizeof rec) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (rec[0] >= STUB_MAXOBJ) return CUDA_ERROR_INVALID_VALUE;
    stub_obj_t *o = &st_get()->objs[rec[0]];
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    int32_t refs = atomic_load(&o->refs);
    /* take a reference only while the object lives */
    do {
        if (refs <= 0 || atomic_load(&o->id) != rec[1] || g_nhandles >= SM_MAX) { r = CUDA_ERROR_INVALID_VALUE; break; }
    } while (!atomic_compare_exchange_weak(&o->refs, &refs, refs + 1));
    if (!r) {
        obj_mine((int)rec[0], 1);
        uint64_t key = new_key();
        g_handles[g_nhandles++] = (sm_ref_t){key, o->size, (int)rec[0]};
        *h = key;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* "Retrieve the contents of the property structure defining properties for this
 * handle" (created or imported): the stub fills the location (the device as this
 * process numbers it, or the host) and the allocation type; the structure has no size */
EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    int i = ref_find(g_handles, g_nhandles, h);
    CUresult r = i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (!r) {
        stub_obj_t *o = &st_get()->objs[g_handles[i].obj];
        memset(prop, 0, sizeof *prop);
        prop->type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
        prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop->location.type = o->size ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
        for (int d = 0; o->size && d < st_ncvis(); d++)
            if (st_cphys(d) == o->phys) { prop->location.id = d; break; }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

#include "stub_ipc.h"

/* a forked child holds none of these */
static void stub_mem_fork_child(void) {
    g_nhandles = g_nmaps = g_nreserved = g_nopens = g_nfree_keys = 0;
}
#endif
