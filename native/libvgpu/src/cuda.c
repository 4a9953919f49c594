/* CUDA driver hooks, core: the real-driver table, the entry gate every hook
 * passes (lazy initialisation, fork), cuInit and cuGetProcAddress. The hooks
 * themselves: memory.c (memory info, device allocations), contexts.c,
 * launch.c, vmm.c, pools.c, graphs.c; the allocation table: alloctab.c. */
#include "cudahook.h"
#include <dlfcn.h>
#include <unistd.h>

#define NAME(n) #n,
#define HOOKPTR(n) (void *)&n,
const char *const vg_cuda_names[VGC_NALL] = {VG_CUDA_HOOKS(NAME) VG_CUDA_HELPERS(NAME)};
void *vg_cuda_hook[VGC_NHOOKS] = {VG_CUDA_HOOKS(HOOKPTR)};
void *vg_cuda_real[VGC_NALL];

static pthread_mutex_t g_load_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_cuda_loaded; /* 1 ok, -1 failed */
static __thread int t_loading;

int vg_cuda_load(void) {
    int st = __atomic_load_n(&g_cuda_loaded, __ATOMIC_ACQUIRE);
    if (LIKELY(st)) return st > 0 ? 0 : -1;
    if (t_loading) return -1; /* re-entered from the driver's own initialisation */
    pthread_mutex_lock(&g_load_mu);
    if (!g_cuda_loaded) {
        t_loading = 1;
        vg_log_init();
        void *(*rdlsym)(void *, const char *) = vg_get_real_dlsym();
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
        if (!h || !rdlsym) {
            LOG_ERROR("cannot load libcuda.so.1: %s", dlerror());
            __atomic_store_n(&g_cuda_loaded, -1, __ATOMIC_RELEASE);
        } else {
            for (int i = 0; i < VGC_NALL; i++) {
                vg_cuda_real[i] = rdlsym(h, vg_cuda_names[i]);
                if (!vg_cuda_real[i]) LOG_DEBUG("driver lacks %s", vg_cuda_names[i]);
            }
            __atomic_store_n(&g_cuda_loaded, 1, __ATOMIC_RELEASE);
            LOG_DEBUG("loaded real libcuda");
        }
        t_loading = 0;
    }
    pthread_mutex_unlock(&g_load_mu);
    return g_cuda_loaded > 0 ? 0 : -1;
}

/* ------------------------------------------------------------ entry gate */
volatile int vg_ready;

static void fork_child(void) {
    vg_tab_fork_child();
    vg_ctx_fork_child();
    vg_ready = 0;
    vg_slot = NULL;
    vg_pid = 0;
    vg_postinit_done = 0;
    vg_limiter_fork_child();
    vg_region_fork_child();
    vg_nvml_fork_child();
    vg_devmap_fork_child();
    vg_vmm_fork_child();
    vg_pools_fork_child();
    vg_graphs_fork_child();
    pthread_mutex_init(&g_load_mu, NULL);
}

__attribute__((noinline)) int vg_enter_slow(void) {
    static int atfork;
    if (!__atomic_exchange_n(&atfork, 1, __ATOMIC_SEQ_CST)) pthread_atfork(vg_limiter_fork_prepare, vg_limiter_fork_parent, fork_child);
    if (vg_cuda_load() != 0) return -1;
    if (vg_slot_ensure() != 0) return -1;
    vg_ready = 1;
    return 0;
}

__attribute__((noinline)) void vg_run_gate_wait(void) {
    while (__atomic_load_n(&vg_slot->status, __ATOMIC_ACQUIRE) == 2) usleep(100000);
}

/* for the hooks in vmm.c and pools.c */
CUresult vg_cuda_enter(void) {
    ENTER();
    return CUDA_SUCCESS;
}
int vg_cur_ord(void) {
    CUdevice d;
    if (HAVE(cuCtxGetDevice) && CU_REAL(cuCtxGetDevice)(&d) == CUDA_SUCCESS && d >= 0 && d < VG_MAXDEV) return d;
    return 0;
}

/* ------------------------------------------------------------- init/entry */
VG_EXPORT CUresult cuInit(unsigned int flags) {
    ENTER();
    REAL_OR_MISSING(cuInit);
    CUresult r = CU_REAL(cuInit)(flags);
    if (r == CUDA_SUCCESS && !vg_postinit_done) vg_postinit();
    return r;
}

static void *map_hook(void *p) {
    if (!p) return p;
    for (int i = 0; i < VGC_NHOOKS; i++)
        if (vg_cuda_real[i] == p) return vg_cuda_hook[i];
    return p;
}

VG_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    ENTER();
    REAL_OR_MISSING(cuGetProcAddress);
    CUresult r = CU_REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = map_hook(*pfn);
    return r;
}

VG_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    ENTER();
    REAL_OR_MISSING(cuGetProcAddress_v2);
    CUresult r = CU_REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn) *pfn = map_hook(*pfn);
    return r;
}
