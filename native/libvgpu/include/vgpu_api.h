/*
 * vgpu_api.h - prototypes of the driver / NVML entry points that libvgpu
 * interposes and the stubs implement (signatures from the public CUDA driver
 * API and NVML reference). Shared by the library, the stubs and the tests so
 * the compiler checks that all three agree.
 */
#ifndef VGPU_API_H
#define VGPU_API_H
#include "vgpu_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetUuid(unsigned char uuid[16], CUdevice dev);
CUresult cuDeviceGetUuid_v2(unsigned char uuid[16], CUdevice dev);
CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, int shHandleType);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle);
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuCtxSynchronize(void);
CUresult cuEventSynchronize(void *hEvent);
CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);
CUresult cuGraphLaunch_ptsz(void *hGraphExec, CUstream hStream);
CUresult cuGraphCreate(void **phGraph, unsigned int flags);
CUresult cuGraphLaunch(void *hGraphExec, CUstream hStream);
CUresult cuGraphDestroy(void *hGraph);
CUresult cuGraphAddMemAllocNode(void **phGraphNode, void *hGraph, void *const *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
CUresult cuGraphAddMemFreeNode(void **phGraphNode, void *hGraph, void *const *dependencies, size_t numDependencies,
                               CUdeviceptr dptr);
CUresult cuGraphInstantiateWithFlags(void **phGraphExec, void *hGraph, unsigned long long flags);
CUresult cuGraphInstantiate_v2(void **phGraphExec, void *hGraph, void **phErrorNode, char *logBuffer,
                               size_t bufferSize);
CUresult cuGraphExecDestroy(void *hGraphExec);
CUresult cuGraphInstantiateWithParams(void **phGraphExec, void *hGraph, void *instantiateParams);
CUresult cuGraphGetNodes(void *hGraph, void **nodes, size_t *numNodes);
CUresult cuGraphNodeGetType(void *hNode, int *type); /* CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10 */
CUresult cuGraphMemAllocNodeGetParams(void *hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out);
CUresult cuGraphAddChildGraphNode(void **phGraphNode, void *hGraph, void *const *dependencies, size_t numDependencies,
                                  void *childGraph);
CUresult cuGraphChildGraphNodeGetGraph(void *hNode, void **phGraph);
CUresult cuGraphAddEmptyNode(void **phGraphNode, void *hGraph, void *const *dependencies, size_t numDependencies);
CUresult cuGraphAddNode(void **phGraphNode, void *hGraph, void *const *dependencies, size_t numDependencies,
                        CUgraphNodeParams *nodeParams);
CUresult cuStreamCreate(CUstream *phStream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
CUresult cuStreamEndCapture(CUstream hStream, void **phGraph);
CUresult cuStreamIsCapturing(CUstream hStream, int *captureStatus);
CUresult cuDeviceGraphMemTrim(CUdevice device);
CUresult cuDeviceGetGraphMemAttribute(CUdevice device, int attr, void *value);

nvmlReturn_t nvmlInit(void);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t r);
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);

#ifdef __cplusplus
}
#endif
#endif
