/*
 * vgpu_abi.h - the subset of the CUDA driver API and NVML ABI that libvgpu and
 * its test stubs use. Written from the public API documentation (types, enum
 * values, function signatures); no NVIDIA header is included or copied.
 * Only x86_64 / aarch64 Linux (LP64) is supported.
 */
#ifndef VGPU_ABI_H
#define VGPU_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- driver */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_UNKNOWN = 999,
};

/* cuDeviceGetAttribute */
enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
};

/* cuGetProcAddress_v2 symbolStatus (CUdriverProcAddressQueryResult) */
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* cuGetProcAddress flags */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
};

/* virtual memory management */
typedef enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
} CUmemLocationType;

typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CUmemAllocationType (1 = pinned) */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* CUDA IPC and shareable handles */
typedef struct { char reserved[64]; } CUipcMemHandle;
enum { CU_MEM_HANDLE_TYPE_NONE = 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1, CU_MEM_HANDLE_TYPE_FABRIC = 8 };
typedef struct { unsigned char data[64]; } CUmemFabricHandle;

/* memory pools */
typedef struct {
    int allocType;   /* CUmemAllocationType */
    int handleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* graph memory nodes */
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;
enum { /* CUgraphNodeType */
    CU_GRAPH_NODE_TYPE_GRAPH = 4, /* a child graph node */
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
};
/* child graph nodes (cuGraphAddNode, CUDA 12.x): CLONE copies the child into the node (it
 * must hold no memory nodes); MOVE hands the child graph itself to the parent, which may
 * then hold allocation and free nodes inside it */
enum { CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE = 0, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE = 1 };
typedef struct { void *graph; int ownership; } CUDA_CHILD_GRAPH_NODE_PARAMS;
typedef struct { /* CUgraphNodeParams: the node types used here */
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_CHILD_GRAPH_NODE_PARAMS graph;
        CUDA_MEM_ALLOC_NODE_PARAMS alloc; /* _v2: the same fields */
    };
    long long reserved2;
} CUgraphNodeParams;
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams is 256 bytes");
enum { /* CUgraphMem_attribute */
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
    CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
};

typedef enum {
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
} CUmemPool_attribute;

/* arrays */
typedef enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;

typedef struct {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* cuLaunchKernelEx */
typedef struct {
    int id;
    int pad;
    char value[64];
} CUlaunchAttribute;

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* ------------------------------------------------------------------ NVML */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* v1 layout of nvmlProcessInfo_t (nvmlDeviceGetComputeRunningProcesses) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* the layout of nvmlDeviceGetComputeRunningProcesses_v2 and _v3 */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* microseconds */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

/* nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3); busId is "domain:bus:device.function" */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#ifdef __cplusplus
}
#endif
#endif /* VGPU_ABI_H */
