/* SM limiter (spec A.5, own controller): per-device token buckets refilled by
 * a watcher thread from NVML per-process utilisation; the monitor's feedback
 * (utilization_switch, priority block) honoured at every limited launch, from
 * the read-only feedback file when it is mounted (feedback.c), else from the
 * region's utilization_switch / recent_kernel fields as in HAMi-core. */
#include "vgpu.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PERIOD_US 100000

volatile int vg_limiter_on;
volatile int vg_launched;
static int g_sm[VG_MAXDEV];          /* percent, from the region */
static int64_t g_tokens[VG_MAXDEV];  /* grid blocks allowed before blocking */
static int64_t g_share[VG_MAXDEV];   /* refill per period */
static int64_t g_cap[VG_MAXDEV];     /* upper bound of share */
static int64_t g_after_refill[VG_MAXDEV];
static unsigned long long g_last_us[VG_MAXDEV];
static int g_watcher_running;
/* held by the watcher while it samples NVML; fork waits for it so a child
 * never inherits a lock (NVML's, the allocator's) taken mid-cycle */
static pthread_mutex_t g_watch_mu = PTHREAD_MUTEX_INITIALIZER;
/* set (under g_watch_mu) once the watcher has finished starting. A new
 * thread's start-up, before it runs our code, may allocate (glibc's
 * pthread_getattr_np under ASan's thread set-up takes the sanitizer
 * allocator's size-class lock); a fork in that window left the child with
 * that lock held forever and its exit-time leak check hung. So the watcher
 * is started only once it is past that point, and fork waits for it too. */
static int g_watcher_ready;
static pthread_cond_t g_watch_cv = PTHREAD_COND_INITIALIZER;
static int g_ndev;

void vg_record_kernel_time(void) {
    if (!vg_launched || !vg_region) return;
    vg_launched = 0;
    uint64_t now = (uint64_t)time(NULL), cur = __atomic_load_n(&vg_region->last_kernel_time, __ATOMIC_RELAXED);
    while (cur < now &&
           !__atomic_compare_exchange_n(&vg_region->last_kernel_time, &cur, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { }
}

static inline int effective_switch(void) {
    if (vg_policy == VG_POLICY_FORCE) return 1;
    if (vg_policy == VG_POLICY_DISABLE) return 0;
    if (vg_feedback_state == VG_FB_VALID) return vg_feedback->utilization_switch != 0;
    if (vg_feedback_state == VG_FB_INVALID) return 1;
    return __atomic_load_n(&vg_region->utilization_switch, __ATOMIC_RELAXED) != 0;
}

/* the monitor's priority block (spec C.6): the feedback file's flag when it is
 * mounted and valid (the region's recent_kernel is the container's to write),
 * else recent_kernel < 0 as in HAMi-core */
static inline int blocked(const vg_region_t *r) {
    if (vg_feedback_state == VG_FB_VALID) return vg_feedback->blocked != 0;
    return __atomic_load_n(&r->recent_kernel, __ATOMIC_ACQUIRE) < 0;
}

void vg_rate_limit(uint64_t grid) {
    CUdevice ord = 0;
    if (vg_cuda_real[VGC_cuCtxGetDevice] && CU_REAL(cuCtxGetDevice)(&ord) != CUDA_SUCCESS) ord = 0;
    int dev = vg_dev(ord); /* buckets are per container device, as the SM limits */
    if (dev < 0 || dev >= VG_MAXDEV) return;
    int sm = g_sm[dev];
    if (sm <= 0 || sm >= 100 || !effective_switch()) return;
    vg_region_t *r = vg_region;
    while (blocked(r)) usleep(20000);
    if (__atomic_load_n(&r->recent_kernel, __ATOMIC_RELAXED) != 2) __atomic_store_n(&r->recent_kernel, 2, __ATOMIC_RELAXED);
    int64_t cost = grid > (uint64_t)INT32_MAX ? INT32_MAX : (int64_t)grid;
    for (;;) {
        int64_t b = __atomic_load_n(&g_tokens[dev], __ATOMIC_RELAXED);
        if (b < 0) { usleep(1000); continue; }
        if (__atomic_compare_exchange_n(&g_tokens[dev], &b, b - cost, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) return;
    }
}

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
}

static int is_container_pid(unsigned pid) {
    vg_region_t *r = vg_region;
    int n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && i < VG_MAXPROC; i++)
        if (r->procs[i].hostpid == (int)pid && r->procs[i].pid != 0) return 1;
    return 0;
}

static void refill(int d, int util) {
    int64_t t = __atomic_load_n(&g_tokens[d], __ATOMIC_RELAXED);
    int64_t consumed = g_after_refill[d] - t;
    int sm = g_sm[d];
    if (!effective_switch()) {
        util = -1;
    } else if (util >= 0 && consumed > 0) {
        /* one-step estimate of the refill that would give `sm` percent, damped */
        int64_t target = util > 0 ? consumed * sm / util : g_share[d] * 2;
        int64_t s = (g_share[d] + target) / 2;
        if (s > g_share[d] * 4) s = g_share[d] * 4;
        if (s < g_share[d] / 4) s = g_share[d] / 4;
        if (s < 1) s = 1;
        if (s >= g_cap[d]) {
            s = g_cap[d];
            if (util < sm && g_cap[d] < ((int64_t)1 << 40)) g_cap[d] *= 2; /* tiny kernels: not saturated */
        }
        g_share[d] = s;
    }
    int64_t share = g_share[d];
    for (;;) {
        int64_t n = t + share;
        if (n > share) n = share; /* at most one period of burst */
        if (__atomic_compare_exchange_n(&g_tokens[d], &t, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            g_after_refill[d] = n;
            break;
        }
    }
}

/* d: container device = NVML index in the container */
static void sample_device(int d, nvmlProcessUtilizationSample_t *buf, nvmlProcessInfo_v1_t *procs) {
    nvmlDevice_t h;
    if (NVML_REAL(nvmlDeviceGetHandleByIndex_v2)((unsigned)d, &h) != NVML_SUCCESS) return;
    unsigned long long now = now_us();
    unsigned count = 1024;
    int util = -1;
    nvmlReturn_t r = NVML_REAL(nvmlDeviceGetProcessUtilization)(h, buf, &count, g_last_us[d] ? g_last_us[d] : now - 1000000);
    g_last_us[d] = now;
    uint64_t own = 0;
    if (r == NVML_SUCCESS || r == NVML_ERROR_NOT_FOUND) {
        util = 0;
        for (unsigned i = 0; r == NVML_SUCCESS && i < count; i++) {
            if (!is_container_pid(buf[i].pid)) continue;
            util += (int)buf[i].smUtil;
            if ((int)buf[i].pid == vg_slot->hostpid) own += buf[i].smUtil;
        }
        vg_slot->device_util[d].sm_util = own;
    }
    if (vg_nvml_real[VGN_nvmlDeviceGetComputeRunningProcesses]) {
        unsigned n = 1024;
        if (NVML_REAL(nvmlDeviceGetComputeRunningProcesses)(h, &n, procs) == NVML_SUCCESS)
            for (unsigned i = 0; i < n; i++)
                if ((int)procs[i].pid == vg_slot->hostpid) vg_slot->monitorused[d] = procs[i].usedGpuMemory;
    }
    if (vg_limiter_on && g_sm[d] > 0 && g_sm[d] < 100) refill(d, util > 100 ? 100 : util);
}

static nvmlProcessUtilizationSample_t *g_samples; /* watcher buffers, kept reachable */
static nvmlProcessInfo_v1_t *g_procs;

static void wait_ready_locked(void);

static void *watcher(void *arg) {
    (void)arg;
    nvmlProcessUtilizationSample_t *buf = g_samples;
    nvmlProcessInfo_v1_t *procs = g_procs;
    pthread_setname_np(pthread_self(), "vgpu-watcher"); /* seen in ps -L; the tests look for it */
    pthread_mutex_lock(&g_watch_mu);
    g_watcher_ready = 1;
    pthread_cond_broadcast(&g_watch_cv);
    pthread_mutex_unlock(&g_watch_mu);
    if (!buf || !procs) return NULL;
    for (;;) {
        usleep(PERIOD_US);
        pthread_mutex_lock(&g_watch_mu);
        vg_record_kernel_time();
        if (vg_hostpid_found && vg_slot && vg_nvml_real[VGN_nvmlDeviceGetProcessUtilization])
            for (int d = 0; d < g_ndev; d++) sample_device(d, buf, procs);
        pthread_mutex_unlock(&g_watch_mu);
    }
    return NULL;
}

/* Buckets, SM limits and samples are per container device (NVML's index); the
 * devices this process reaches through CUDA are found by mapping its ordinals. */
void vg_watcher_start(void) {
    int n = 0;
    if (vg_cuda_real[VGC_cuDeviceGetCount] && CU_REAL(cuDeviceGetCount)(&n) != CUDA_SUCCESS) n = 0;
    if (n > VG_MAXDEV) n = VG_MAXDEV;
    int ndev = vg_dev_count();
    g_ndev = ndev > VG_MAXDEV ? VG_MAXDEV : ndev;
    int any = 0;
    int64_t total[VG_MAXDEV];
    int reach[VG_MAXDEV] = {0};
    for (int d = 0; d < VG_MAXDEV; d++) total[d] = 1 << 20;
    for (int c = 0; c < n; c++) {
        int d = vg_dev(c), sms = 0, thr = 0;
        if (d < 0) continue;
        reach[d] = 1;
        if (vg_cuda_real[VGC_cuDeviceGetAttribute]) {
            CU_REAL(cuDeviceGetAttribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c);
            CU_REAL(cuDeviceGetAttribute)(&thr, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, c);
        }
        if (sms > 0 && thr > 0) total[d] = (int64_t)sms * thr * 32;
    }
    for (int d = 0; d < VG_MAXDEV; d++) {
        g_sm[d] = (int)vg_sm_limit[d];
        g_cap[d] = total[d];
        g_share[d] = total[d];
        g_tokens[d] = total[d];
        g_after_refill[d] = total[d];
        g_last_us[d] = 0;
        if (reach[d] && g_sm[d] > 0 && g_sm[d] < 100) any = 1;
    }
    vg_limiter_on = any && vg_hostpid_found && vg_policy != VG_POLICY_DISABLE;
    if (any && !vg_hostpid_found) LOG_WARN("SM limit set but the host PID is unknown: compute is not limited");
    /* buffers are allocated here, not in the thread: a fork must never catch
     * the watcher inside the allocator */
    if (!g_samples) g_samples = calloc(1024, sizeof *g_samples);
    if (!g_procs) g_procs = calloc(1024, sizeof *g_procs);
    if (!g_watcher_running && g_samples && g_procs) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 256 * 1024);
        /* under g_watch_mu: a fork from another thread sees either no watcher
         * or one that is past its start-up */
        pthread_mutex_lock(&g_watch_mu);
        if (pthread_create(&t, &a, watcher, NULL) == 0) g_watcher_running = 1;
        wait_ready_locked();
        pthread_mutex_unlock(&g_watch_mu);
        pthread_attr_destroy(&a);
    }
}

/* With g_watch_mu held: wait until a started watcher runs our code. Bounded
 * (a thread that never gets scheduled must not hang the process); on the
 * timeout the caller goes on as it did before this wait existed. */
static void wait_ready_locked(void) {
    if (!g_watcher_running || g_watcher_ready) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    while (!g_watcher_ready)
        if (pthread_cond_timedwait(&g_watch_cv, &g_watch_mu, &ts) == ETIMEDOUT) {
            LOG_WARN("watcher thread not started after 10 s");
            return;
        }
}

/* fork: the watcher is neither starting nor sampling while the child is made */
void vg_limiter_fork_prepare(void) {
    pthread_mutex_lock(&g_watch_mu);
    wait_ready_locked();
}
void vg_limiter_fork_parent(void) { pthread_mutex_unlock(&g_watch_mu); }

/* the child has no watcher thread (only the forking thread is copied) */
void vg_limiter_fork_child(void) {
    pthread_mutex_init(&g_watch_mu, NULL);
    pthread_cond_init(&g_watch_cv, NULL);
    g_watcher_ready = 0;
    g_watcher_running = 0;
    vg_limiter_on = 0;
    vg_hostpid_found = 0;
}
