/* Test-only stub of libnvidia-ml.so.1 over the stub driver's shared state:
 * device handles, UUIDs, memory info, running processes (v1 records) and
 * per-process SM utilisation computed from the stub's recorded busy time. */
#include "vgpu_api.h"
#include "stub_state.h"
#include "stub_devices.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct { unsigned idx; } ndev_t;
static ndev_t g_devs[STUB_MAXDEV];

/* the host PID NVML reports for a record (see stub_state.h: PID offset, unique) */
static unsigned host_pid(stub_proc_t *p) { return (unsigned)atomic_load(&p->hostpid); }

static int dev_of(nvmlDevice_t d, unsigned *idx) {
    ndev_t *p = (ndev_t *)d;
    if (p < g_devs || p >= g_devs + st_nvis()) return 0;
    *idx = p->idx;
    return 1;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { st_get(); return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int f) { (void)f; return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "stub error"; }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { *c = (unsigned)st_nvis(); return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return nvmlDeviceGetCount_v2(c); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= (unsigned)st_nvis()) return NVML_ERROR_INVALID_ARGUMENT;
    g_devs[i].idx = i;
    *d = (nvmlDevice_t)&g_devs[i];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    return dev_of(d, i) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    unsigned i;
    if (!dev_of(d, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    if (len < 41) return NVML_ERROR_INSUFFICIENT_SIZE;
    st_uuid(st_phys((int)i), uuid, len);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    unsigned i;
    if (!dev_of(d, &i) || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->bus = (unsigned)st_phys((int)i) + 1; /* as the stub's libcuda: device i on bus i+1 */
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02x:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02x:00.0", pci->bus);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    unsigned i;
    if (!dev_of(d, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, len, "Stub GPU");
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    unsigned i;
    if (!dev_of(d, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t t = st_get()->mem_total, u = st_dev_used(st_phys((int)i), 1);
    m->total = t; m->used = u; m->free = u > t ? 0 : t - u;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    nvmlMemory_t v1;
    nvmlReturn_t r = nvmlDeviceGetMemoryInfo(d, &v1);
    if (r) return r;
    m->total = v1.total; m->used = v1.used; m->free = v1.free; m->reserved = 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    unsigned i, n = 0;
    if (!dev_of(d, &i) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    stub_state_t *s = st_get();
    st_dev_used(st_phys((int)i), 1); /* reap dead processes */
    /* VGPU_STUB_NVML_REVERSE: list newest records first (NVML's order is unspecified) */
    int rev = getenv("VGPU_STUB_NVML_REVERSE") != NULL;
    for (int k0 = 0; k0 < STUB_MAXPROC; k0++) {
        int k = rev ? STUB_MAXPROC - 1 - k0 : k0;
        stub_proc_t *p = &s->procs[k];
        int pid = atomic_load(&p->pid);
        if (pid <= 0 || atomic_load(&p->ctx[st_phys((int)i)]) <= 0) continue;
        if (n < *count && infos) { infos[n].pid = host_pid(p); infos[n].usedGpuMemory = atomic_load(&p->mem[st_phys((int)i)]); }
        n++;
    }
    nvmlReturn_t r = n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return r;
}
/* _v2 and _v3: the same list in the v2 layout (no MIG here: instance ids 0xFFFFFFFF) */
static nvmlReturn_t procs_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_v1_t v1[STUB_MAXPROC];
    unsigned n = STUB_MAXPROC;
    nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses(d, &n, v1);
    if (r) return r;
    if (!infos || *count < n) { *count = n; return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS; }
    for (unsigned k = 0; k < n; k++) {
        infos[k].pid = v1[k].pid;
        infos[k].usedGpuMemory = v1[k].usedGpuMemory;
        infos[k].gpuInstanceId = infos[k].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i) {
    return procs_v2(d, c, i);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i) {
    return procs_v2(d, c, i);
}
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *u,
                                                    unsigned int *count, unsigned long long lastSeen) {
    unsigned i, n = 0;
    if (!dev_of(d, &i) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    stub_state_t *s = st_get();
    uint64_t now = st_now_ns();
    uint64_t from = lastSeen ? lastSeen * 1000ull : now - 1000000000ull;
    if (from + 1000000000ull < now) from = now - 1000000000ull;
    if (from >= now) from = now - 1;
    for (int k = 0; k < STUB_MAXPROC; k++) {
        stub_proc_t *p = &s->procs[k];
        int pid = atomic_load(&p->pid);
        if (pid <= 0) continue;
        uint64_t head = atomic_load(&p->ring_head), busy = 0;
        int any = 0;
        for (uint64_t j = 0; j < STUB_RING && j < head; j++) {
            stub_busy_t *b = &ST_RING(s, p)[(head - 1 - j) % STUB_RING];
            if (b->end_ns <= from) break;
            if (b->dev != st_phys((int)i)) continue;
            uint64_t st = b->start_ns > from ? b->start_ns : from;
            uint64_t en = b->end_ns < now ? b->end_ns : now;
            if (en > st) { busy += en - st; any = 1; }
        }
        if (!any) continue;
        if (u && n < *count) {
            memset(&u[n], 0, sizeof u[n]);
            u[n].pid = host_pid(p);
            u[n].timeStamp = now / 1000;
            u[n].smUtil = (unsigned)(busy * 100 / (now - from));
        }
        n++;
    }
    nvmlReturn_t r = (!u || n > *count) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    if (n == 0) r = NVML_ERROR_NOT_FOUND;
    *count = n;
    return r;
}
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    unsigned i;
    if (!dev_of(d, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = 0; u->memory = 0;
    return NVML_SUCCESS;
}
