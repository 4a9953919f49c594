/* NVML hooks (memory info shows the container's slice), post-init:
 * region UUIDs, host-PID detection. */
#include "vgpu.h"
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NAME(n) #n,
#define HOOKPTR(n) (void *)&n,
const char *const vg_nvml_names[VGN_NALL] = {VG_NVML_HOOKS(NAME) VG_NVML_HELPERS(NAME)};
void *vg_nvml_hook[VGN_NHOOKS] = {VG_NVML_HOOKS(HOOKPTR)};
void *vg_nvml_real[VGN_NALL];

static pthread_mutex_t g_nload_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_nvml_loaded;
static __thread int t_nloading;

int vg_nvml_load(void) {
    int st = __atomic_load_n(&g_nvml_loaded, __ATOMIC_ACQUIRE);
    if (LIKELY(st)) return st > 0 ? 0 : -1;
    if (t_nloading) return -1;
    pthread_mutex_lock(&g_nload_mu);
    if (!g_nvml_loaded) {
        t_nloading = 1;
        void *(*rdlsym)(void *, const char *) = vg_get_real_dlsym();
        void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
        if (!h || !rdlsym) {
            LOG_WARN("cannot load libnvidia-ml.so.1: %s", dlerror());
            __atomic_store_n(&g_nvml_loaded, -1, __ATOMIC_RELEASE);
        } else {
            for (int i = 0; i < VGN_NALL; i++) vg_nvml_real[i] = rdlsym(h, vg_nvml_names[i]);
            if (!vg_nvml_real[VGN_nvmlDeviceGetHandleByIndex_v2])
                vg_nvml_real[VGN_nvmlDeviceGetHandleByIndex_v2] = rdlsym(h, "nvmlDeviceGetHandleByIndex");
            __atomic_store_n(&g_nvml_loaded, 1, __ATOMIC_RELEASE);
        }
        t_nloading = 0;
    }
    pthread_mutex_unlock(&g_nload_mu);
    return g_nvml_loaded > 0 ? 0 : -1;
}
#define NHAVE(n) (vg_nvml_real[VGN_##n] != NULL)

/* ------------------------------------------------------- region UUID list */
void vg_nvml_fill_region(void) {
    if (vg_nvml_load() != 0 || !NHAVE(nvmlDeviceGetCount_v2) || vg_region_ensure() != 0) return;
    unsigned n = 0;
    if (NVML_REAL(nvmlDeviceGetCount_v2)(&n) != NVML_SUCCESS) return;
    if (n > VG_MAXDEV) n = VG_MAXDEV;
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        char uuid[96] = {0};
        if (NVML_REAL(nvmlDeviceGetHandleByIndex_v2)(i, &d) != NVML_SUCCESS) continue;
        if (NVML_REAL(nvmlDeviceGetUUID)(d, uuid, sizeof uuid) != NVML_SUCCESS) continue;
        if (strncmp(vg_region->uuids[i], uuid, 96)) memcpy(vg_region->uuids[i], uuid, 96);
    }
    __atomic_store_n(&vg_region->device_num, (uint64_t)n, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------ hooks */
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;
static void nvml_post(void) { vg_nvml_fill_region(); }

static nvmlReturn_t nvml_pre(void) {
    if (vg_region_ensure() != 0) return NVML_ERROR_UNKNOWN;
    return vg_nvml_load() == 0 ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}
VG_EXPORT nvmlReturn_t nvmlInit_v2(void) {
    nvmlReturn_t r = nvml_pre();
    if (r) return r;
    if (!vg_nvml_real[VGN_nvmlInit_v2]) return NVML_ERROR_FUNCTION_NOT_FOUND;
    r = NVML_REAL(nvmlInit_v2)();
    if (r == NVML_SUCCESS) pthread_once(&g_nvml_once, nvml_post);
    return r;
}
VG_EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
VG_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    nvmlReturn_t r = nvml_pre();
    if (r) return r;
    if (!vg_nvml_real[VGN_nvmlInitWithFlags]) return NVML_ERROR_FUNCTION_NOT_FOUND;
    r = NVML_REAL(nvmlInitWithFlags)(flags);
    if (r == NVML_SUCCESS) pthread_once(&g_nvml_once, nvml_post);
    return r;
}

/* limit and this container's usage for an NVML device; 0 when not limited */
/* NVML's index in the container is the container device index (NVML ignores
 * CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER): no CUDA ordinal is involved */
static uint64_t slice_of(nvmlDevice_t d, uint64_t *used) {
    unsigned c;
    if (!NHAVE(nvmlDeviceGetIndex) || NVML_REAL(nvmlDeviceGetIndex)(d, &c) != NVML_SUCCESS || c >= VG_MAXDEV) return 0;
    uint64_t lim = vg_limit[c];
    if (!lim) return 0;
    vg_reclaim_dead();
    uint64_t u = vg_usage(c);
    *used = u > lim ? lim : u; /* clamp: never report free < 0 (field case B26) */
    return lim;
}
VG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    nvmlReturn_t r = nvml_pre();
    if (r) return r;
    if (!vg_nvml_real[VGN_nvmlDeviceGetMemoryInfo]) return NVML_ERROR_FUNCTION_NOT_FOUND;
    r = NVML_REAL(nvmlDeviceGetMemoryInfo)(d, m);
    if (r != NVML_SUCCESS || !m) return r;
    uint64_t used = 0, lim = slice_of(d, &used);
    if (lim) { m->total = lim; m->used = used; m->free = lim - used; }
    return r;
}
VG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    nvmlReturn_t r = nvml_pre();
    if (r) return r;
    if (!vg_nvml_real[VGN_nvmlDeviceGetMemoryInfo_v2]) return NVML_ERROR_FUNCTION_NOT_FOUND;
    r = NVML_REAL(nvmlDeviceGetMemoryInfo_v2)(d, m);
    if (r != NVML_SUCCESS || !m) return r;
    uint64_t used = 0, lim = slice_of(d, &used);
    if (lim) { m->total = lim; m->reserved = 0; m->used = used; m->free = lim - used; }
    return r;
}

/* Compute processes: on a limited device, only the container's processes (host PID
 * of a live slot of the region), each with the usage libvgpu counts for it, so the
 * list sums to the "used" of nvmlDeviceGetMemoryInfo and of cuMemGetInfo. Other
 * containers' processes on a shared card are not shown (HAMi-core shows them).
 * stride: 16 bytes (v1 records) or 24 (v2 layout, used by _v2 and _v3). */
typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, void *);
static nvmlReturn_t procs_common(int which, size_t stride, nvmlDevice_t d, unsigned int *count, void *infos) {
    nvmlReturn_t r = nvml_pre();
    if (r) return r;
    procs_fn real = (procs_fn)vg_nvml_real[which];
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    unsigned c;
    if (!count || !NHAVE(nvmlDeviceGetIndex) || NVML_REAL(nvmlDeviceGetIndex)(d, &c) != NVML_SUCCESS ||
        c >= VG_MAXDEV || !vg_limit[c])
        return real(d, count, infos);
    unsigned cap = 64, n;
    unsigned char *buf = NULL;
    for (;;) { /* the whole list of the card, then the container's part of it */
        free(buf);
        buf = calloc(cap, stride);
        if (!buf) return NVML_ERROR_UNKNOWN;
        n = cap;
        r = real(d, &n, buf);
        if (r != NVML_ERROR_INSUFFICIENT_SIZE || cap >= 65536) break;
        cap = n > cap ? n + 16 : cap * 2;
    }
    if (r != NVML_SUCCESS) { free(buf); return r; }
    vg_reclaim_dead();
    vg_region_t *rg = vg_region;
    int np = __atomic_load_n(&rg->proc_num, __ATOMIC_ACQUIRE);
    if (np > VG_MAXPROC) np = VG_MAXPROC;
    unsigned kept = 0;
    for (unsigned k = 0; k < n && k < cap; k++) {
        unsigned char *e = buf + (size_t)k * stride;
        unsigned pid;
        memcpy(&pid, e, sizeof pid);
        int slot = -1;
        for (int i = 0; i < np && slot < 0; i++)
            if (pid && __atomic_load_n(&rg->procs[i].pid, __ATOMIC_ACQUIRE) != 0 &&
                (unsigned)__atomic_load_n(&rg->procs[i].hostpid, __ATOMIC_RELAXED) == pid)
                slot = i;
        if (slot < 0) continue;
        unsigned long long used = __atomic_load_n(&rg->procs[slot].used[c].total, __ATOMIC_ACQUIRE);
        memcpy(e + offsetof(nvmlProcessInfo_v1_t, usedGpuMemory), &used, sizeof used);
        if (kept != k) memmove(buf + (size_t)kept * stride, e, stride);
        kept++;
    }
    if (!infos || *count < kept) {
        r = kept ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    } else {
        memcpy(infos, buf, (size_t)kept * stride);
    }
    *count = kept;
    free(buf);
    return r;
}
VG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count,
                                                            nvmlProcessInfo_v1_t *infos) {
    return procs_common(VGN_nvmlDeviceGetComputeRunningProcesses, sizeof(nvmlProcessInfo_v1_t), d, count, infos);
}
VG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count,
                                                               nvmlProcessInfo_v2_t *infos) {
    return procs_common(VGN_nvmlDeviceGetComputeRunningProcesses_v2, sizeof(nvmlProcessInfo_v2_t), d, count, infos);
}
VG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                               nvmlProcessInfo_v2_t *infos) {
    return procs_common(VGN_nvmlDeviceGetComputeRunningProcesses_v3, sizeof(nvmlProcessInfo_v2_t), d, count, infos);
}
_Static_assert(offsetof(nvmlProcessInfo_v1_t, usedGpuMemory) == offsetof(nvmlProcessInfo_v2_t, usedGpuMemory),
               "usedGpuMemory at the same offset in both layouts");

/* -------------------------------------------------------------- post-init */
volatile int vg_postinit_done;
int vg_hostpid_found;
uint64_t vg_context_size;
static pthread_mutex_t g_post_mu = PTHREAD_MUTEX_INITIALIZER;

static int list_procs(nvmlDevice_t d, nvmlProcessInfo_v1_t *buf, unsigned cap) {
    unsigned n = cap;
    nvmlReturn_t r = NVML_REAL(nvmlDeviceGetComputeRunningProcesses)(d, &n, buf);
    if (r != NVML_SUCCESS) return -1;
    return (int)n;
}

/* One detection round: the PIDs NVML lists on device d before and after this
 * process retains its primary context on CUDA device 0 (released again at the
 * end). Returns the number of PIDs that appeared (-1: NVML or the driver
 * failed), written to fresh[] with their usage in size[]; *own = 1 when our own
 * PID is listed (no PID namespace), then fresh[0] is it. */
static int detect_round(nvmlDevice_t d, nvmlProcessInfo_v1_t *before, nvmlProcessInfo_v1_t *after, unsigned cap,
                        unsigned *fresh, uint64_t *size, int *own) {
    int nb = list_procs(d, before, cap), na = -1, nf = 0;
    CUcontext ctx;
    int retained = nb >= 0 && CU_REAL(cuDevicePrimaryCtxRetain)(&ctx, 0) == CUDA_SUCCESS;
    if (retained) na = list_procs(d, after, cap);
    *own = 0;
    for (int i = 0; i < na; i++)
        if ((int)after[i].pid == vg_pid) { fresh[0] = after[i].pid; size[0] = after[i].usedGpuMemory; *own = 1; nf = 1; }
    for (int i = 0; i < na && !*own; i++) {
        int seen = 0;
        for (int j = 0; j < nb; j++) if (before[j].pid == after[i].pid) { seen = 1; break; }
        if (!seen) { fresh[nf] = after[i].pid; size[nf] = after[i].usedGpuMemory; nf++; }
    }
    if (retained) CU_REAL(cuDevicePrimaryCtxRelease_v2)(0);
    return na < 0 ? -1 : nf;
}

/* Host PID = the PID that appears in NVML's process list when this process
 * retains its first context (spec A.6.6). Ours appears in every round; another
 * process (of this container or another) creating a context at the same time
 * appears in a round too, so rounds are repeated after a random pause and the
 * candidates are the PIDs that appeared in every round so far; when one is left
 * it is ours. No lock is taken: HAMi serialised detection with a node-wide flock
 * (/tmp/vgpulock/lock, which any GPU container can hold) and the region's
 * sem_postinit (which any process of the container can hold, or die holding):
 * N processes starting at once then wait for N context creations one after
 * the other (issue 26 item 4), and a stopped or crashed holder stalls or
 * skips the detection of every later process of the container. */
static void detect_host_pid(void) {
    if (vg_nvml_load() != 0 || !NHAVE(nvmlDeviceGetComputeRunningProcesses) || !NHAVE(nvmlInit_v2)) return;
    if (NVML_REAL(nvmlInit_v2)() != NVML_SUCCESS) return;
    pthread_once(&g_nvml_once, nvml_post);
    int nvml0 = vg_dev(0); /* the context below is retained on CUDA device 0 */
    nvmlDevice_t d;
    if (NVML_REAL(nvmlDeviceGetHandleByIndex_v2)((unsigned)nvml0, &d) != NVML_SUCCESS) return;
    if (!vg_cuda_real[VGC_cuDevicePrimaryCtxRetain] || !vg_cuda_real[VGC_cuDevicePrimaryCtxRelease_v2]) return;

    enum { CAP = 1024, ROUNDS = 8 };
    nvmlProcessInfo_v1_t *before = calloc(CAP, sizeof *before), *after = calloc(CAP, sizeof *after);
    unsigned *fresh = calloc(CAP, sizeof *fresh), *cand = calloc(CAP, sizeof *cand);
    uint64_t *size = calloc(CAP, sizeof *size), *csize = calloc(CAP, sizeof *csize);
    int hostpid = 0, ncand = -1; /* -1: no candidates yet */
    uint64_t ctxsize = 0;
    unsigned seed = (unsigned)vg_pid ^ (unsigned)time(NULL);
    for (int round = 0; before && after && fresh && cand && size && csize && round < ROUNDS; round++) {
        int own = 0, nf = detect_round(d, before, after, CAP, fresh, size, &own);
        if (nf < 0) break;
        if (own) { hostpid = (int)fresh[0]; ctxsize = size[0]; break; }
        if (ncand < 0) { /* first round: all that appeared */
            memcpy(cand, fresh, (size_t)nf * sizeof *cand);
            memcpy(csize, size, (size_t)nf * sizeof *csize);
            ncand = nf;
        } else { /* keep those that appeared again */
            int k = 0;
            for (int i = 0; i < ncand; i++)
                for (int j = 0; j < nf; j++)
                    if (fresh[j] == cand[i]) { cand[k] = cand[i]; csize[k] = size[j]; k++; break; }
            ncand = k;
        }
        if (ncand == 1) { hostpid = (int)cand[0]; ctxsize = csize[0]; break; }
        /* none left: ours did not appear in some round (the driver was slow to list
         * it); start over. Several left: others created contexts with ours. */
        if (ncand == 0) ncand = -1;
        LOG_DEBUG("host PID detection: %d candidates after round %d; retrying", ncand, round + 1);
        usleep((useconds_t)(5000 + rand_r(&seed) % 45000) * (useconds_t)(round + 1));
    }
    free(before);
    free(after);
    free(fresh);
    free(cand);
    free(size);
    free(csize);
    if (!hostpid) { LOG_WARN("host PID not found; SM limiting is off for this process"); return; }
    vg_slot->hostpid = hostpid;
    vg_context_size = ctxsize;
    vg_hostpid_found = 1;
    LOG_INFO("host pid %d, context size %llu", hostpid, (unsigned long long)ctxsize);
}

void vg_nvml_fork_child(void) {
    pthread_mutex_init(&g_post_mu, NULL);
    pthread_mutex_init(&g_nload_mu, NULL);
    vg_hostpid_found = 0;
}

void vg_postinit(void) {
    pthread_mutex_lock(&g_post_mu);
    if (!vg_postinit_done && vg_slot) {
        vg_hostpid_found = 0;
        detect_host_pid();
        vg_watcher_start();
        LOG_DEBUG("Initialized");
        __atomic_store_n(&vg_postinit_done, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_post_mu);
}
