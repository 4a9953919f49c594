/* Stub driver, part 5 (included last by stub_cuda.c): cuGetProcAddress. A base name
 * and the caller's CUDA version pick the newest of the stub's own entry points that
 * version knows (the _ptsz variant with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
 * symbolStatus says whether the name is unknown or the version too old. */
#ifndef STUB_PROCS_H
#define STUB_PROCS_H

/* cuGetProcAddress: base name + version -> own function (newest first) */
typedef struct { const char *base; int minver; int ptsz; void *fn; } proc_t;
#define P(b, v, f) {b, v, 0, (void *)f}
#define PT(b, v, f) {b, v, 1, (void *)f}
static const proc_t g_procs[] = {
    P("cuInit", 2000, cuInit), P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2), P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuDeviceGet", 2000, cuDeviceGet), P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute), P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2), P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId), P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute), P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy), P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuCtxCreate", 12050, cuCtxCreate_v4), P("cuCtxCreate", 11040, cuCtxCreate_v3), P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2), P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent), P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2), P("cuMemAlloc", 3020, cuMemAlloc_v2), P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2), P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz), P("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz), P("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz), P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    P("cuMemCreate", 10020, cuMemCreate), P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve), P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemMap", 10020, cuMemMap), P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    P("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle), P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    P("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle), P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute), P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    PT("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz), P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize), P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuArrayCreate", 3020, cuArrayCreate_v2), P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, cuArrayDestroy), P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    PT("cuLaunchKernel", 7000, cuLaunchKernel_ptsz), P("cuLaunchKernel", 4000, cuLaunchKernel),
    PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz), P("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    P("cuGraphCreate", 10000, cuGraphCreate), P("cuGraphDestroy", 10000, cuGraphDestroy),
    PT("cuGraphLaunch", 10000, cuGraphLaunch_ptsz), P("cuGraphLaunch", 10000, cuGraphLaunch),
    P("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode), P("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams), P("cuGraphGetNodes", 10000, cuGraphGetNodes),
    P("cuGraphNodeGetType", 10000, cuGraphNodeGetType), P("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
    P("cuStreamCreate", 2000, cuStreamCreate), P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2), P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    P("cuGraphInstantiate", 11000, cuGraphInstantiate_v2), P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    P("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    P("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    P("cuGetExportTable", 3000, cuGetExportTable),
};

static CUresult proc_lookup(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st) {
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    int found_name = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const proc_t *p = &g_procs[i];
        if (strcmp(p->base, sym)) continue;
        found_name = 1;
        if (p->ptsz && !(flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) continue;
        if (p->minver > ver) continue;
        *pfn = p->fn;
        if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
    if (st) *st = found_name ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    return proc_lookup(sym, pfn, ver, flags, NULL);
}
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *st) {
    return proc_lookup(sym, pfn, ver, flags, st);
}
#endif
