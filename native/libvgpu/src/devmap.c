/* CUDA device -> container device.
 *
 * Limits (CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT_<i>) and the shared
 * region's uuids[i], limit[i], used[i] are indexed by the container's device index:
 * the order of NVML's device list in the container (NVML ignores
 * CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER). A CUDA ordinal is no such index: the
 * driver orders devices by CUDA_DEVICE_ORDER (FASTEST_FIRST by default) and then
 * filters and reorders them by CUDA_VISIBLE_DEVICES, which every process may set.
 *
 * So every CUDA device is mapped once to the container device with the same UUID
 * (cuDeviceGetUuid_v2, which names a MIG instance by its own UUID, else
 * cuDeviceGetUuid), else the same PCI bus id (cuDeviceGetPCIBusId against
 * nvmlDeviceGetPciInfo_v3: a MIG instance sits on its parent's bus). The container's
 * list comes from NVML, else from the region's uuids (written by a process that had
 * NVML). A device that matches nothing keeps its ordinal, with a warning. */
#include "vgpu.h"
#include <ctype.h>
#include <stdio.h>
#include <string.h>

int8_t vg_c2i[VG_MAXDEV];

static pthread_mutex_t g_map_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_loaded;            /* container list read */
static int g_n;                 /* container devices */
static char g_uuid[VG_MAXDEV][40]; /* UUID without its GPU-/MIG- prefix, lower case */
static unsigned g_pci[VG_MAXDEV][3]; /* domain, bus, device; bus 0 = unknown */

typedef CUresult (*uuid_fn)(unsigned char *, CUdevice);
typedef CUresult (*busid_fn)(char *, int, CUdevice);
typedef nvmlReturn_t (*pci_fn)(nvmlDevice_t, nvmlPciInfo_t *);

/* "GPU-1a2b..." / "MIG-..." / bare -> the lower-case hex-and-dash part (36 chars) */
static void norm_uuid(const char *in, char out[40]) {
    if (!strncmp(in, "GPU-", 4) || !strncmp(in, "MIG-", 4)) in += 4;
    size_t k = 0;
    for (; in[k] && k < 39; k++) out[k] = (char)tolower((unsigned char)in[k]);
    out[k] = 0;
}

/* "dddd:bb:dd.f" or "dddddddd:bb:dd.f" -> domain, bus, device; 0 on success */
static int parse_bus_id(const char *s, unsigned out[3]) {
    unsigned d, b, v;
    if (sscanf(s, "%x:%x:%x", &d, &b, &v) != 3) return -1;
    out[0] = d; out[1] = b; out[2] = v;
    return 0;
}

static void load_list_nolock(void) {
    if (g_loaded) return;
    g_n = 0;
    if (vg_nvml_load() == 0 && vg_nvml_real[VGN_nvmlInit_v2] && vg_nvml_real[VGN_nvmlDeviceGetCount_v2] &&
        NVML_REAL(nvmlInit_v2)() == NVML_SUCCESS) {
        unsigned n = 0;
        if (NVML_REAL(nvmlDeviceGetCount_v2)(&n) != NVML_SUCCESS) n = 0;
        if (n > VG_MAXDEV) n = VG_MAXDEV;
        pci_fn pci = (pci_fn)vg_nvml_real[VGN_nvmlDeviceGetPciInfo_v3];
        for (unsigned i = 0; i < n; i++) {
            nvmlDevice_t d;
            char uuid[96] = {0};
            nvmlPciInfo_t pi;
            g_uuid[i][0] = 0;
            g_pci[i][1] = 0;
            if (NVML_REAL(nvmlDeviceGetHandleByIndex_v2)(i, &d) != NVML_SUCCESS) continue;
            if (vg_nvml_real[VGN_nvmlDeviceGetUUID] && NVML_REAL(nvmlDeviceGetUUID)(d, uuid, sizeof uuid) == NVML_SUCCESS)
                norm_uuid(uuid, g_uuid[i]);
            if (pci && pci(d, &pi) == NVML_SUCCESS && parse_bus_id(pi.busId, g_pci[i]) != 0) g_pci[i][1] = 0;
        }
        g_n = (int)n;
    }
    if (!g_n && vg_region) { /* no NVML here: the list another process of the container wrote */
        uint64_t n = __atomic_load_n(&vg_region->device_num, __ATOMIC_ACQUIRE);
        if (n > VG_MAXDEV) n = VG_MAXDEV;
        for (uint64_t i = 0; i < n; i++) {
            char u[97];
            memcpy(u, vg_region->uuids[i], 96);
            u[96] = 0;
            norm_uuid(u, g_uuid[i]);
            g_pci[i][1] = 0;
        }
        g_n = (int)n;
    }
    g_loaded = 1;
}

static int match(int ord) {
    unsigned char raw[16];
    uuid_fn f = (uuid_fn)vg_cuda_real[VGC_cuDeviceGetUuid_v2];
    if (!f) f = (uuid_fn)vg_cuda_real[VGC_cuDeviceGetUuid];
    if (f && f(raw, ord) == CUDA_SUCCESS) {
        char u[40];
        snprintf(u, sizeof u, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", raw[0], raw[1],
                 raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], raw[8], raw[9], raw[10], raw[11], raw[12], raw[13],
                 raw[14], raw[15]);
        for (int i = 0; i < g_n; i++)
            if (!strcmp(g_uuid[i], u)) return i;
    }
    busid_fn b = (busid_fn)vg_cuda_real[VGC_cuDeviceGetPCIBusId];
    char id[64];
    unsigned pci[3];
    if (b && b(id, sizeof id, ord) == CUDA_SUCCESS && parse_bus_id(id, pci) == 0)
        for (int i = 0; i < g_n; i++)
            if (g_pci[i][1] && !memcmp(g_pci[i], pci, sizeof pci)) return i;
    return -1;
}

int vg_dev_slow(int ord) {
    if (ord < 0 || ord >= VG_MAXDEV) return -1;
    pthread_mutex_lock(&g_map_mu);
    int v = __atomic_load_n(&vg_c2i[ord], __ATOMIC_ACQUIRE);
    if (v > 0) { pthread_mutex_unlock(&g_map_mu); return v - 1; }
    load_list_nolock();
    int idx = match(ord);
    if (idx < 0) {
        /* the driver may not be initialised yet (no cache then: retried next time) */
        int n = 0;
        if (!vg_cuda_real[VGC_cuDeviceGetCount] || CU_REAL(cuDeviceGetCount)(&n) != CUDA_SUCCESS || ord >= n) {
            pthread_mutex_unlock(&g_map_mu);
            return ord;
        }
        if (g_n) LOG_WARN("CUDA device %d matches none of the container's %d devices by UUID or PCI bus id; "
                          "counting it as device %d", ord, g_n, ord);
        idx = ord;
    } else if (idx != ord) {
        LOG_INFO("CUDA device %d is the container's device %d", ord, idx);
    }
    __atomic_store_n(&vg_c2i[ord], (int8_t)(idx + 1), __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_map_mu);
    return idx;
}

int vg_dev_count(void) {
    pthread_mutex_lock(&g_map_mu);
    load_list_nolock();
    int n = g_n;
    pthread_mutex_unlock(&g_map_mu);
    return n;
}

/* the child keeps the parent's map (same environment, same devices) */
void vg_devmap_fork_child(void) { pthread_mutex_init(&g_map_mu, NULL); }
