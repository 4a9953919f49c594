/* Stub driver, CUDA IPC (included by stub_mem.h), modelled as the CUDA driver API
 * reference describes it:
 *   cuIpcGetMemHandle names a cuMemAlloc allocation of this process in 64 bytes.
 *   cuIpcOpenMemHandle in another process maps it at a new address of that process
 *   (no new device memory); opened again by the same process, the reference count goes
 *   up and the same address comes back. cuIpcCloseMemHandle drops one reference and
 *   unmaps at zero; the exporter's allocation is unaffected. cuMemFree of an opened
 *   address is an error.
 */
#ifndef STUB_IPC_H
#define STUB_IPC_H
/* ---------------------------------------------------------------- CUDA IPC */
typedef struct { uint32_t magic; int32_t pid; uint64_t dptr, size; int32_t phys, pad; } stub_ipc_t;
#define STUB_IPC_MAGIC 0x49504331u
typedef struct { uint64_t va, src, size; int32_t pid, refs; } sm_open_t;
static sm_open_t g_opens[SM_MAX];
static int g_nopens;

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *out, CUdeviceptr dptr) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    uint64_t size; int dev;
    pthread_mutex_lock(&g_mu);
    int ok = tab_find(dptr, &size, &dev);
    pthread_mutex_unlock(&g_mu);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    stub_ipc_t h = {STUB_IPC_MAGIC, getpid(), dptr, size, st_cphys(dev), 0};
    memset(out, 0, sizeof *out);
    memcpy(out->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    (void)flags;
    stub_ipc_t h;
    memcpy(&h, handle.reserved, sizeof h);
    if (!pdptr || h.magic != STUB_IPC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* not within the exporting process */
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nopens; i++)
        if (g_opens[i].pid == h.pid && g_opens[i].src == h.dptr) {
            g_opens[i].refs++;
            *pdptr = g_opens[i].va;
            pthread_mutex_unlock(&g_mu);
            return CUDA_SUCCESS;
        }
    CUresult r = g_nopens >= SM_MAX ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    if (!r) {
        uint64_t a = atomic_fetch_add(&g_next_addr, (h.size + 511) & ~511ull);
        g_opens[g_nopens++] = (sm_open_t){a, h.dptr, h.size, h.pid, 1};
        *pdptr = a;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    return cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < g_nopens; i++)
        if (g_opens[i].va == dptr) {
            if (--g_opens[i].refs == 0) g_opens[i] = g_opens[--g_nopens];
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    return r;
}

#endif
