/* libvgpu internal declarations. */
#ifndef VGPU_INTERNAL_H
#define VGPU_INTERNAL_H
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <sys/types.h>
#include "vgpu_api.h"

#define VG_EXPORT __attribute__((visibility("default")))
#define VG_HIDDEN __attribute__((visibility("hidden")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---------------------------------------------- shared region, v1.2 (spec A.6.1) */
#define VG_MAGIC 19920718
#define VG_MAJOR 1
#define VG_MINOR 2
#define VG_MAXDEV 16
#define VG_MAXPROC 1024

typedef struct {
    uint64_t context_size, module_size, data_size, offset, total, unused[3];
} vg_devmem_t;

typedef struct {
    uint64_t dec_util, enc_util, sm_util, unused[3];
} vg_devutil_t;

typedef struct {
    int32_t pid;
    int32_t hostpid;
    vg_devmem_t used[VG_MAXDEV];
    uint64_t monitorused[VG_MAXDEV];
    vg_devutil_t device_util[VG_MAXDEV];
    int32_t status;
    int32_t pad0;
    uint64_t seqlock;
    uint64_t unused[2];
} vg_slot_t;

typedef struct {
    int32_t initialized_flag;
    uint32_t major_version;
    uint32_t minor_version;
    int32_t sm_init_flag;
    uint64_t owner_pid;
    sem_t sem;
    uint64_t device_num;
    char uuids[VG_MAXDEV][96];
    uint64_t limit[VG_MAXDEV];
    uint64_t sm_limit[VG_MAXDEV];
    vg_slot_t procs[VG_MAXPROC];
    int32_t proc_num;
    int32_t utilization_switch;
    int32_t recent_kernel;
    int32_t priority;
    uint64_t last_kernel_time;
    sem_t sem_postinit;
} vg_region_t;

/* usage categories inside vg_devmem_t */
enum { VG_CAT_CONTEXT = 0, VG_CAT_MODULE = 1, VG_CAT_DATA = 2 };

/* ---------------------------------------------------------------- logging */
enum { VG_LOG_ERROR = 0, VG_LOG_WARN = 2, VG_LOG_MSG = 2, VG_LOG_INFO = 3, VG_LOG_DEBUG = 4 };
VG_HIDDEN extern int vg_log_level;
VG_HIDDEN void vg_log_init(void);
VG_HIDDEN void vg_log(int level, const char *tag, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define LOG_ERROR(...) vg_log(VG_LOG_ERROR, "ERROR", __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...) do { if (vg_log_level >= VG_LOG_WARN) vg_log(VG_LOG_WARN, "Warn", __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define LOG_MSG(...) do { if (vg_log_level >= VG_LOG_MSG) vg_log(VG_LOG_MSG, "Msg", __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define LOG_INFO(...) do { if (vg_log_level >= VG_LOG_INFO) vg_log(VG_LOG_INFO, "Info", __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define LOG_DEBUG(...) do { if (vg_log_level >= VG_LOG_DEBUG) vg_log(VG_LOG_DEBUG, "Debug", __FILE__, __LINE__, __VA_ARGS__); } while (0)

/* ------------------------------------------------------------ env parsing */
VG_HIDDEN int vg_parse_bytes(const char *s, uint64_t *out);
VG_HIDDEN int vg_parse_percent(const char *s, uint64_t *out);
VG_HIDDEN uint64_t vg_env_mem_limit(int dev);
VG_HIDDEN uint64_t vg_env_sm_limit(int dev);
typedef const char *(*vg_getter_t)(void *ctx, const char *name);
VG_HIDDEN uint64_t vg_lookup_mem_limit(vg_getter_t get, void *ctx, int dev, int *bad);
VG_HIDDEN uint64_t vg_lookup_sm_limit(vg_getter_t get, void *ctx, int dev, int *bad);

/* ------------------------------------------------- process limits (limits.c)
 * This process's limits: the environment, capped by the read-only limits file the
 * device plugin mounts next to the library (VG_LIMITS_FILE); a shared region can
 * only lower them. vg_deny: refuse every device allocation (fail closed). */
#define VG_LIMITS_FILE "limits.env"
VG_HIDDEN extern uint64_t vg_limit[VG_MAXDEV];    /* bytes, 0 = no limit */
VG_HIDDEN extern uint64_t vg_sm_limit[VG_MAXDEV]; /* percent, 100 = no limit */
VG_HIDDEN extern int vg_deny;
VG_HIDDEN void vg_limits_init(void);
VG_HIDDEN const char *vg_cache_path(void);
VG_HIDDEN int vg_has_limit(void);
VG_HIDDEN void vg_fail_closed(const char *why);
/* <directory of libvgpu.so>/<name> into out; -1 when it cannot be known */
VG_HIDDEN int vg_lib_file(const char *name, char *out, size_t n);

/* ------------------------------------------------ monitor feedback (feedback.c)
 * The read-only file the device plugin mounts next to the library and the monitor
 * rewrites every tick; when valid, the only source of the two feedback decisions. */
#define VG_FEEDBACK_FILE "feedback"
#define VG_FEEDBACK_MAGIC 0x42464756u /* "VGFB" little-endian */
#define VG_FEEDBACK_VERSION 1u
#define VG_FEEDBACK_SIZE 16
typedef struct {
    uint32_t magic;
    uint32_t version;
    int32_t utilization_switch; /* 0: uncontended */
    int32_t blocked;            /* non-zero: priority block */
} vg_feedback_t;
enum { VG_FB_ABSENT = 0, VG_FB_VALID = 1, VG_FB_INVALID = 2 };
VG_HIDDEN extern const volatile vg_feedback_t *vg_feedback; /* set when VG_FB_VALID */
VG_HIDDEN extern int vg_feedback_state;
VG_HIDDEN void vg_feedback_init(void);
enum { VG_POLICY_DEFAULT = 0, VG_POLICY_FORCE = 1, VG_POLICY_DISABLE = 2 };
VG_HIDDEN int vg_env_policy(void);
VG_HIDDEN int vg_parse_policy(const char *s);

/* ------------------------------------------------------------------ region */
VG_HIDDEN extern vg_region_t *vg_region;
VG_HIDDEN extern vg_slot_t *vg_slot;   /* own slot, NULL until registered */
VG_HIDDEN extern int vg_pid;           /* cached getpid(), reset after fork */
VG_HIDDEN extern int vg_policy;
VG_HIDDEN int vg_region_ensure(void);  /* attach (no slot) */
VG_HIDDEN int vg_slot_ensure(void);    /* attach + register own slot */
VG_HIDDEN void vg_lock(void);
VG_HIDDEN void vg_unlock(void);
VG_HIDDEN int vg_reclaim_dead(void);   /* returns slots reclaimed; takes the lock */
VG_HIDDEN int vg_pid_alive(int pid);
VG_HIDDEN int vg_region_is_shared(void); /* the container's region file, not a private fallback */

/* ------------------------------------- VMM memory shared between processes (vmmshare.c) */
VG_HIDDEN int vg_share_export(int dev, uint64_t bytes, int fd, uint32_t *id, int *privfd); /* record or -1 */
VG_HIDDEN void vg_share_unexport(uint32_t id, int dev, uint64_t bytes);
VG_HIDDEN int vg_share_link(int fd, int *dev, uint64_t *bytes, uint32_t *id, int *cpid);  /* record or -1 */
VG_HIDDEN void vg_share_floor(int rec, uint64_t bytes);
VG_HIDDEN void vg_share_unimport(int rec, uint32_t id, int cpid, int dev, uint64_t cap);
VG_HIDDEN void vg_share_reclaim_nolock(vg_slot_t *s);
VG_HIDDEN int vg_share_any(const vg_slot_t *s);

VG_HIDDEN int vg_reserve_slow(int dev, uint64_t bytes);

/* container usage on dev: sum of every slot's total */
static inline uint64_t vg_usage(int dev) {
    vg_region_t *r = vg_region;
    int n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE);
    if (n > VG_MAXPROC) n = VG_MAXPROC;
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += __atomic_load_n(&r->procs[i].used[dev].total, __ATOMIC_SEQ_CST);
    return sum;
}

/*
 * Reserve bytes on dev for the own slot; 0 ok, -1 over the limit.
 * Reserve-then-check: add to the own slot's total first, then sum every
 * slot. Two processes racing for the last bytes may both fail (and retry
 * after dead-slot reclaim) but can never both succeed past the limit: each
 * sees at least the other's reservation (sequentially consistent add + loads).
 * data_size is maintained by the allocation table (under its lock);
 * context_size is updated here atomically.
 */
static inline int vg_reserve(int dev, uint64_t bytes, int cat) {
    if (UNLIKELY(dev < 0 || dev >= VG_MAXDEV)) return 0;
    if (UNLIKELY(vg_deny) && bytes) return -1;
    vg_devmem_t *m = &vg_slot->used[dev];
    uint64_t limit = vg_limit[dev];
    if (limit && bytes > limit) return -1;
    __atomic_fetch_add(&m->total, bytes, __ATOMIC_SEQ_CST);
    if (limit && UNLIKELY(vg_usage(dev) > limit) && vg_reserve_slow(dev, bytes) != 0) return -1;
    if (cat == VG_CAT_CONTEXT) __atomic_fetch_add(&m->context_size, bytes, __ATOMIC_RELAXED);
    return 0;
}

static inline void vg_unreserve(int dev, uint64_t bytes, int cat) {
    if (UNLIKELY(dev < 0 || dev >= VG_MAXDEV)) return;
    vg_devmem_t *m = &vg_slot->used[dev];
    if (cat == VG_CAT_CONTEXT) __atomic_fetch_sub(&m->context_size, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&m->total, bytes, __ATOMIC_RELEASE);
}

/* ---------------------------------------------------- real driver table */
#define VG_CUDA_HOOKS(X)                                                                                 \
    X(cuInit) X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuDeviceTotalMem_v2) X(cuMemGetInfo_v2)        \
    X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemAllocAsync)        \
    X(cuMemAllocAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemAllocFromPoolAsync)           \
    X(cuMemAllocFromPoolAsync_ptsz) X(cuMemCreate) X(cuMemRelease) X(cuArrayCreate_v2)                    \
    X(cuArray3DCreate_v2) X(cuArrayDestroy) X(cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy)          \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset_v2)             \
    X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuLaunchKernel)            \
    X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) X(cuLaunchCooperativeKernel)      \
    X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch) X(cuGraphLaunch_ptsz) X(cuMemPoolCreate)            \
    X(cuMemPoolDestroy) X(cuDeviceGetMemPool) X(cuDeviceGetDefaultMemPool) X(cuMemMap) X(cuMemUnmap)         \
    X(cuMemPoolTrimTo) X(cuMemPoolSetAttribute) X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz)        \
    X(cuCtxSynchronize) X(cuGraphAddMemAllocNode) X(cuGraphInstantiateWithFlags) X(cuGraphInstantiate_v2)        \
    X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuDeviceGraphMemTrim) X(cuEventSynchronize)                     \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuGraphInstantiateWithParams)
#define VG_CUDA_HELPERS(X)                                                                                 \
    X(cuCtxGetDevice) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2)   \
    X(cuDeviceGetPCIBusId) X(cuMemPoolGetAttribute) X(cuDeviceGetGraphMemAttribute)                          \
    X(cuMemGetAllocationPropertiesFromHandle) X(cuGraphGetNodes) X(cuGraphNodeGetType) X(cuGraphMemAllocNodeGetParams)           \
    X(cuStreamIsCapturing) X(cuGraphChildGraphNodeGetGraph)

#define VG_ENUM(n) VGC_##n,
enum { VG_CUDA_HOOKS(VG_ENUM) VGC_NHOOKS, VGC_BASE_ = VGC_NHOOKS - 1, VG_CUDA_HELPERS(VG_ENUM) VGC_NALL };

#define VG_NVML_HOOKS(X)                                                                                   \
    X(nvmlInit) X(nvmlInit_v2) X(nvmlInitWithFlags) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)  \
    X(nvmlDeviceGetComputeRunningProcesses) X(nvmlDeviceGetComputeRunningProcesses_v2)                       \
    X(nvmlDeviceGetComputeRunningProcesses_v3)
#define VG_NVML_HELPERS(X)                                                                                 \
    X(nvmlDeviceGetCount_v2) X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetIndex) X(nvmlDeviceGetUUID) \
    X(nvmlDeviceGetProcessUtilization) X(nvmlDeviceGetPciInfo_v3)
#define VG_NENUM(n) VGN_##n,
enum { VG_NVML_HOOKS(VG_NENUM) VGN_NHOOKS, VGN_BASE_ = VGN_NHOOKS - 1, VG_NVML_HELPERS(VG_NENUM) VGN_NALL };

VG_HIDDEN extern void *vg_cuda_real[VGC_NALL];
VG_HIDDEN extern void *vg_cuda_hook[VGC_NHOOKS];
VG_HIDDEN extern const char *const vg_cuda_names[VGC_NALL];
VG_HIDDEN extern void *vg_nvml_real[VGN_NALL];
VG_HIDDEN extern void *vg_nvml_hook[VGN_NHOOKS];
VG_HIDDEN extern const char *const vg_nvml_names[VGN_NALL];
#define CU_REAL(n) ((__typeof__(&n))vg_cuda_real[VGC_##n])
#define NVML_REAL(n) ((__typeof__(&n))vg_nvml_real[VGN_##n])

VG_HIDDEN int vg_cuda_load(void);  /* 0 ok */
VG_HIDDEN int vg_nvml_load(void);  /* 0 ok */
VG_HIDDEN void *(*vg_get_real_dlsym(void))(void *, const char *);

/* ------------------------------------------------------------ post-init */
VG_HIDDEN extern volatile int vg_postinit_done;
VG_HIDDEN void vg_postinit(void);
VG_HIDDEN extern int vg_hostpid_found;
VG_HIDDEN extern uint64_t vg_context_size;
VG_HIDDEN void vg_nvml_fill_region(void);

/* ------------------------------------------------- device map (devmap.c)
 * CUDA ordinal -> container device index (NVML's order in the container, the index
 * of CUDA_DEVICE_MEMORY_LIMIT_<i> and of the region's per-device arrays), matched by
 * UUID or PCI bus id once per ordinal. Every limit and every usage counter is kept
 * per container device; CUDA ordinals never index them. */
VG_HIDDEN extern int8_t vg_c2i[VG_MAXDEV]; /* 0 = not resolved yet, else index + 1 */
VG_HIDDEN int vg_dev_slow(int ord);
VG_HIDDEN int vg_dev_count(void);          /* container devices (NVML or region list) */
VG_HIDDEN void vg_devmap_fork_child(void);
/* container device of CUDA ordinal ord; -1 when ord is out of range */
static inline int vg_dev(int ord) {
    if (UNLIKELY((unsigned)ord >= VG_MAXDEV)) return -1;
    int v = __atomic_load_n(&vg_c2i[ord], __ATOMIC_ACQUIRE);
    return LIKELY(v > 0) ? v - 1 : vg_dev_slow(ord);
}

/* ---------- allocation paths (memory.c, contexts.c, vmm.c, pools.c; the table: alloctab.c;
 * the hooks' own entry gate and helpers: cudahook.h) */
VG_HIDDEN CUresult vg_cuda_enter(void);   /* the hooks' entry gate; 0 = go on */
#define VG_ENTER() do { CUresult e_ = vg_cuda_enter(); if (UNLIKELY(e_)) return e_; } while (0)
VG_HIDDEN int vg_cur_ord(void);           /* CUDA ordinal of the current context (0 without one) */
VG_HIDDEN int vg_vmm_park(uint64_t handle, uint64_t k);
VG_HIDDEN void vg_vmm_unpark(uint64_t k, uint64_t handle);
VG_HIDDEN void vg_vmm_drop(uint64_t k);
VG_HIDDEN int vg_vmm_created(uint64_t handle, uint64_t *size, int *dev); /* 1: a cuMemCreate of this process */
VG_HIDDEN void vg_vmm_gone(uint64_t key); /* the last local reference of an allocation went (vmm.c) */
VG_HIDDEN void vg_charge_data(int dev, uint64_t bytes, int sign);
/* cuMemRelease of a mapped handle (*mapped = 1; the result) or nothing (*mapped = 0) */
VG_HIDDEN CUresult vg_vmm_release(uint64_t handle, int *mapped);
VG_HIDDEN void vg_vmm_fork_child(void);
VG_HIDDEN void vg_pools_sync_all(void);
VG_HIDDEN void vg_pools_fork_child(void);
VG_HIDDEN void vg_graphs_sync_all(void);
VG_HIDDEN void vg_graphs_fork_child(void);
VG_HIDDEN CUresult vg_graph_launch(void *exec, CUstream s, int ptsz);

/* --------------------------------------------------------------- limiter */
VG_HIDDEN extern volatile int vg_limiter_on;   /* some device has 0<sm<100 and host pid known */
VG_HIDDEN extern volatile int vg_launched;     /* set by launches, consumed by the watcher */
VG_HIDDEN void vg_rate_limit(uint64_t grid);
VG_HIDDEN void vg_watcher_start(void);
VG_HIDDEN void vg_record_kernel_time(void);
VG_HIDDEN void vg_limiter_fork_child(void);
VG_HIDDEN void vg_limiter_fork_prepare(void);
VG_HIDDEN void vg_limiter_fork_parent(void);
VG_HIDDEN void vg_region_fork_child(void);
VG_HIDDEN void vg_nvml_fork_child(void);

#endif
