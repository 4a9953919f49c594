/*
 * The stub driver's device lists (included after stub_state.h by stub_cuda.c and
 * stub_nvml.c): which physical devices of the shared state a process sees, in which
 * order, under which UUIDs and PCI bus ids. Per process: VGPU_STUB_RUNTIME,
 * NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, VGPU_STUB_SM_COUNTS
 * (see stub_state.h).
 *
 * The device lists, as the real libraries build them:
 *   NVML   the container's devices (all, or NVIDIA_VISIBLE_DEVICES with the runtime) in
 *          that order; NVML ignores CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER.
 *   libcuda the container's devices ordered by CUDA_DEVICE_ORDER (FASTEST_FIRST, the
 *          default: most multiprocessors first, ties in PCI bus order; PCI_BUS_ID: PCI
 *          bus order; physical device i sits on PCI bus i+1), then filtered and
 *          reordered by CUDA_VISIBLE_DEVICES: each entry an index into that order, a GPU
 *          UUID or a unique prefix of one, or a MIG UUID (the stub's MIG instance of
 *          device i is MIG-5a1e0000-0000-4000-9000-<i>; it reports that UUID and its
 *          parent's PCI bus id); the first invalid entry ends the list (the stub also
 *          ends it at a repeated one).
 *          CUDA_VISIBLE_DEVICES="" leaves no device.
 */
#ifndef STUB_DEVICES_H
#define STUB_DEVICES_H

/* the UUID of physical device phys (NVML's text form) */
static void st_uuid(int phys, char *buf, size_t len) {
    snprintf(buf, len, "GPU-5a1e0000-0000-4000-8000-%012x", phys);
}

/* the devices this process sees: ordinal -> physical index (see VGPU_STUB_RUNTIME) */
static int g_vis_n = -1;
static int g_vis[STUB_MAXDEV];

static void st_visible_init(void) {
    stub_state_t *s = st_get();
    const char *rt = getenv("VGPU_STUB_RUNTIME");
    const char *v = getenv("NVIDIA_VISIBLE_DEVICES");
    g_vis_n = 0;
    if (!rt || strcmp(rt, "nvidia") || !v || !strcmp(v, "all")) {
        for (int i = 0; i < s->ndev; i++) g_vis[g_vis_n++] = i;
        return;
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", v);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && g_vis_n < STUB_MAXDEV;
         tok = strtok_r(NULL, ",", &save)) {
        for (int i = 0; i < s->ndev; i++) {
            char u[64];
            st_uuid(i, u, sizeof u);
            char *end = NULL;
            long idx = strtol(tok, &end, 10);
            if (!strcmp(tok, u) || (end && *end == 0 && end != tok && idx == i)) {
                g_vis[g_vis_n++] = i;
                break;
            }
        }
    }
}

/* number of devices this process sees */
__attribute__((unused)) static int st_nvis(void) {
    if (g_vis_n < 0) st_visible_init();
    return g_vis_n;
}

/* physical index of ordinal dev (dev must be < st_nvis()) */
__attribute__((unused)) static int st_phys(int dev) {
    if (g_vis_n < 0) st_visible_init();
    return (dev >= 0 && dev < g_vis_n) ? g_vis[dev] : dev;
}

/* multiprocessors of physical device phys (VGPU_STUB_SM_COUNTS) */
static int st_sm_count(int phys) {
    const char *v = getenv("VGPU_STUB_SM_COUNTS");
    int n = 10;
    for (int i = 0; v && *v; i++) {
        char *end;
        long x = strtol(v, &end, 10);
        if (end == v) break;
        if (i == phys) { n = x > 0 ? (int)x : 10; break; }
        v = *end == ',' ? end + 1 : end;
        if (!*end) break;
    }
    return n;
}

/* the libcuda list: ordinal -> physical index, and whether that ordinal is a MIG instance */
static int g_cvis_n = -1;
static int g_cvis[STUB_MAXDEV];
static int g_cmig[STUB_MAXDEV];

static void st_mig_uuid(int phys, char *buf, size_t len) {
    snprintf(buf, len, "MIG-5a1e0000-0000-4000-9000-%012x", phys);
}

static void st_cuda_visible_init(void) {
    if (g_vis_n < 0) st_visible_init();
    int base[STUB_MAXDEV], nb = g_vis_n;
    memcpy(base, g_vis, sizeof base);
    const char *order = getenv("CUDA_DEVICE_ORDER");
    int pci = order && !strcmp(order, "PCI_BUS_ID");
    for (int i = 1; i < nb; i++) /* insertion sort: stable enough for 16 entries */
        for (int j = i; j > 0; j--) {
            int a = base[j - 1], b = base[j];
            int sa = pci ? 0 : st_sm_count(a), sb = pci ? 0 : st_sm_count(b);
            if (sb > sa || (sb == sa && b < a)) { base[j - 1] = b; base[j] = a; } else break;
        }
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    memset(g_cmig, 0, sizeof g_cmig);
    if (!cvd) {
        memcpy(g_cvis, base, sizeof base);
        g_cvis_n = nb;
        return;
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", cvd);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && n < STUB_MAXDEV;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        int phys = -1, mig = 0;
        char *end = NULL;
        long idx = strtol(tok, &end, 10);
        if (end != tok && *end == 0) {
            if (idx >= 0 && idx < nb) phys = base[idx];
        } else if (!strncmp(tok, "GPU-", 4)) {
            int hits = 0;
            for (int i = 0; i < nb; i++) {
                char u[64];
                st_uuid(base[i], u, sizeof u);
                if (!strncmp(u, tok, strlen(tok))) { phys = base[i]; hits++; }
            }
            if (hits != 1) phys = -1;
        } else if (!strncmp(tok, "MIG-", 4)) {
            for (int i = 0; i < nb; i++) {
                char u[64];
                st_mig_uuid(base[i], u, sizeof u);
                if (!strcmp(u, tok)) { phys = base[i]; mig = 1; }
            }
        }
        for (int k = 0; k < n; k++) if (g_cvis[k] == phys) phys = -1; /* repeated */
        if (phys < 0) break; /* an invalid entry ends the list */
        g_cmig[n] = mig;
        g_cvis[n++] = phys;
    }
    g_cvis_n = n;
}

/* number of devices libcuda shows this process */
__attribute__((unused)) static int st_ncvis(void) {
    if (g_cvis_n < 0) st_cuda_visible_init();
    return g_cvis_n;
}

/* physical index of CUDA ordinal dev (dev must be < st_ncvis()) */
__attribute__((unused)) static int st_cphys(int dev) {
    if (g_cvis_n < 0) st_cuda_visible_init();
    return (dev >= 0 && dev < g_cvis_n) ? g_cvis[dev] : dev;
}
#endif
