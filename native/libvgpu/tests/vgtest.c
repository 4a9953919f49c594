/* vgtest: scriptable driver client for the pytest suite. It links the stub
 * driver directly (like a CUDA program built with -lcuda), so under
 * LD_PRELOAD=libvgpu.so every call binds to the library's wrappers.
 *
 * usage: vgtest CMD [ARGS]... ; commands run left to right:
 *   init                 cuInit + retain/set primary context of device 0
 *   dev N                make device N's primary context current
 *   noctx                no current context (a bare worker thread)
 *   ctx N                cuCtxCreate on device N (kept on the object stack)
 *   alloc KIND BYTES RC  allocate; KIND: mem pitch managed async async_ptsz
 *                        pool pool1 cpool vmm vmm1 vmm_host vmm_badid array array3d
 *                        mipmap ctx
 *                        expect return code RC (0 ok, 2 OOM, -1 any); keep the object
 *   free                 free the newest object (expect 0)
 *   freeall              free every object
 *   info                 print "info FREE TOTAL" (cuMemGetInfo)
 *   total N              print "total N BYTES" (cuDeviceTotalMem)
 *   nvml N               print "nvml N TOTAL USED FREE" (nvmlDeviceGetMemoryInfo)
 *   launch N GRID        N launches of GRID blocks
 *   rate SECS GRID       launch for SECS seconds, print "rate LAUNCHES_PER_S BUSY_PERCENT
 *                        ALL_BUSY_PERCENT": BUSY_PERCENT is the simulated GPU's busy
 *                        time of this process over those seconds (its SM utilisation
 *                        as NVML reports it; see busy_t), the quantity an SM limit
 *                        holds; ALL_BUSY_PERCENT the same summed over every process
 *                        NVML lists (the stub state's); both -1 when NVML never listed
 *                        getpid() + VGPU_STUB_PID_OFFSET or failed
 *   echo WORD            print WORD (flushes; for synchronisation)
 *   sleep SECS           sleep
 *   waitfile PATH        wait until PATH exists (at most 120 s; "waitfile timeout" then)
 *   hold                 print "holding" and sleep until killed
 *   fork SCRIPT...       run the rest in a forked child and wait for it; with a "--"
 *                        in the rest, the child runs up to it and the parent
 *                        continues after it
 *   exec SCRIPT...       the same, the child exec'ing vgtest SCRIPT...
 *   setenv NAME VALUE    setenv (inherited by fork and exec)
 *   tasks                print "task NAME" for every thread of this process
 *   forkstorm N          N times: fork a child that runs cuInit (starting its own
 *                        watcher thread) and at once forks a grandchild that
 *                        exits; print "forkstorm EXITED STUCK" (a child not
 *                        finished after 30 s is stuck; it and its grandchild
 *                        are killed)
 *   procs N              print "procs N COUNT SUM_USED" and "proc PID USED" lines
 *                        (nvmlDeviceGetComputeRunningProcesses, v1 records) and
 *                        "procs3 N COUNT SUM_USED SIZE_QUERY" (_v3)
 *   threads N ITER BYTES N threads each doing ITER cuMemAlloc/cuMemFree pairs
 *   race N BYTES         N threads allocate BYTES at once; print "race SUCCESSES"
 *                        (objects kept)
 *   uid                  print "uid N" (getuid; used with a preloaded interposer)
 * and the commands of vgpat.h (pools, VMM mappings and sharing, CUDA IPC)
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "vgpu_api.h"

typedef struct { char kind[16]; uint64_t h, va, size; } obj_t;
static obj_t objs[4096];
static int nobj;

static void die(const char *msg, long a, long b) {
    fprintf(stderr, "vgtest: %s (%ld vs %ld)\n", msg, a, b);
    exit(1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The simulated GPU's busy time of this process (and of every process), as NVML
 * reports it (the SM utilisation the limiter acts on): nvmlDeviceGetProcessUtilization
 * sampled every BUSY_SAMPLE_S, each sample covering the time since the previous one
 * (the stub looks back at most 1 s), summed over every device. A sample's smUtil is
 * a whole percent rounded down, so a process's sum reads up to 1 point low. */
#define BUSY_SAMPLE_S 0.25
typedef struct { unsigned long long last_us, busy_us, all_us, window_us; unsigned hostpid; int seen, ok; } busy_t;

static unsigned long long realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* NVML's time stamps */
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
}

static void busy_start(busy_t *b) {
    const char *off = getenv("VGPU_STUB_PID_OFFSET"); /* the PID NVML reports for us */
    b->ok = nvmlInit_v2() == NVML_SUCCESS;
    b->hostpid = (unsigned)getpid() + (unsigned)(off ? atoi(off) : 0);
    b->busy_us = b->all_us = b->window_us = 0;
    b->seen = 0;
    b->last_us = realtime_us();
}

static void busy_sample(busy_t *b) {
    static nvmlProcessUtilizationSample_t u[512];
    unsigned nd = 0;
    unsigned long long end = realtime_us();
    if (b->ok && nvmlDeviceGetCount_v2(&nd) != NVML_SUCCESS) b->ok = 0;
    if (!b->ok) nd = 0;
    for (unsigned d = 0; d < nd; d++) {
        nvmlDevice_t h;
        unsigned cnt = 512;
        nvmlReturn_t r = nvmlDeviceGetHandleByIndex_v2(d, &h);
        if (r == NVML_SUCCESS) r = nvmlDeviceGetProcessUtilization(h, u, &cnt, b->last_us);
        if (r == NVML_ERROR_NOT_FOUND) continue;
        if (r != NVML_SUCCESS) { b->ok = 0; break; } /* the figures are unknown: -1 */
        for (unsigned i = 0; i < cnt; i++) {
            unsigned long long us = (unsigned long long)u[i].smUtil * (u[i].timeStamp - b->last_us) / 100;
            b->all_us += us;
            if (u[i].pid == b->hostpid) {
                b->seen = 1;
                if (u[i].timeStamp > end) end = u[i].timeStamp; /* the stub's end of the sample */
                b->busy_us += us;
            }
        }
    }
    b->window_us += end - b->last_us;
    b->last_us = end;
}

static CUmemoryPool g_cpool; /* vgpat.h: poolmk / pooldestroy */
static CUresult do_alloc(const char *kind, size_t n, uint64_t *h) {
    CUdeviceptr p = 0;
    CUresult r;
    if (!strcmp(kind, "mem")) r = cuMemAlloc_v2(&p, n);
    else if (!strcmp(kind, "managed")) r = cuMemAllocManaged(&p, n, 1);
    else if (!strcmp(kind, "async")) r = cuMemAllocAsync(&p, n, NULL);
    else if (!strcmp(kind, "async_ptsz")) r = cuMemAllocAsync_ptsz(&p, n, NULL);
    else if (!strcmp(kind, "pool")) {
        CUmemoryPool pool;
        CUdevice d = 0;
        cuCtxGetDevice(&d);
        cuDeviceGetMemPool(&pool, d);
        r = cuMemAllocFromPoolAsync(&p, n, pool, NULL);
    } else if (!strcmp(kind, "cpool")) {
        r = cuMemAllocFromPoolAsync(&p, n, g_cpool, NULL);
    } else if (!strcmp(kind, "pool1")) {
        /* an explicit pool on device 1, whatever the current device */
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = 1;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = 1;
        CUmemoryPool pool;
        r = cuMemPoolCreate(&pool, &pp);
        if (!r) r = cuMemAllocFromPoolAsync(&p, n, pool, NULL);
    } else if (!strcmp(kind, "pitch")) {
        size_t pitch = 0;
        /* width 512 bytes (row padding 0 on the stub), height n/512 */
        r = cuMemAllocPitch_v2(&p, &pitch, 512, n / 512, 4);
    } else if (!strncmp(kind, "vmm", 3)) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        CUdevice d = 0;
        cuCtxGetDevice(&d);
        prop.location.type = strcmp(kind, "vmm_host") ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
        prop.location.id = !strcmp(kind, "vmm_badid") ? 123456 : (!strcmp(kind, "vmm_host") ? -77 : d);
        if (!strcmp(kind, "vmm1")) prop.location.id = 1;
        CUmemGenericAllocationHandle hh = 0;
        r = cuMemCreate(&hh, n, &prop, 0);
        p = hh;
    } else if (!strcmp(kind, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = n / 4, .Height = 1, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUarray a = NULL;
        r = cuArrayCreate_v2(&a, &d);
        p = (uintptr_t)a;
    } else if (!strcmp(kind, "array3d")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = n / 16, .Height = 2, .Depth = 2, .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                                     .NumChannels = 4};
        CUarray a = NULL;
        r = cuArray3DCreate_v2(&a, &d);
        p = (uintptr_t)a;
    } else if (!strcmp(kind, "mipmap")) {
        /* 2 levels of a 1-D uint8 array: n*2/3 + n/3 elements (n divisible by 3, even) */
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = n / 3 * 2, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
        CUmipmappedArray a = NULL;
        r = cuMipmappedArrayCreate(&a, &d, 2);
        p = (uintptr_t)a;
    } else if (!strcmp(kind, "ctx")) {
        CUcontext c = NULL, prev = NULL;
        CUdevice d = 0;
        cuCtxGetCurrent(&prev);
        cuCtxGetDevice(&d);
        r = cuCtxCreate_v4(&c, NULL, 0, d);
        cuCtxSetCurrent(prev);
        p = (uintptr_t)c;
    } else {
        fprintf(stderr, "unknown kind %s\n", kind);
        exit(2);
    }
    *h = p;
    return r;
}

static CUresult do_free(obj_t *o) {
    const char *k = o->kind;
    if (!strcmp(k, "ipc")) return cuIpcCloseMemHandle(o->h);
    if (!strcmp(k, "gexec")) return cuGraphExecDestroy((void *)(uintptr_t)o->h);
    if (!strcmp(k, "mem") || !strcmp(k, "managed") || !strcmp(k, "pitch")) return cuMemFree_v2(o->h);
    if (!strcmp(k, "async") || !strcmp(k, "pool") || !strcmp(k, "pool1") || !strcmp(k, "cpool"))
        return cuMemFreeAsync(o->h, NULL);
    if (!strcmp(k, "async_ptsz")) return cuMemFreeAsync_ptsz(o->h, NULL);
    if (!strncmp(k, "vmm", 3)) return cuMemRelease(o->h);
    if (!strcmp(k, "array") || !strcmp(k, "array3d")) return cuArrayDestroy((CUarray)(uintptr_t)o->h);
    if (!strcmp(k, "mipmap")) return cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)o->h);
    if (!strcmp(k, "ctx")) return cuCtxDestroy_v2((CUcontext)(uintptr_t)o->h);
    return CUDA_ERROR_INVALID_VALUE;
}

static CUcontext g_ctx0;
static size_t t_bytes;
static long t_iter;
static pthread_barrier_t t_bar;
static int t_ok;
static pthread_mutex_t t_mu = PTHREAD_MUTEX_INITIALIZER;

static void *churn(void *arg) {
    (void)arg;
    cuCtxSetCurrent(g_ctx0);
    for (long k = 0; k < t_iter; k++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, t_bytes) == CUDA_SUCCESS && cuMemFree_v2(p) != CUDA_SUCCESS) die("free", 0, 0);
    }
    return NULL;
}
static void *racer(void *arg) {
    (void)arg;
    cuCtxSetCurrent(g_ctx0);
    CUdeviceptr p;
    pthread_barrier_wait(&t_bar);
    if (cuMemAlloc_v2(&p, t_bytes) == CUDA_SUCCESS) {
        pthread_mutex_lock(&t_mu);
        t_ok++;
        snprintf(objs[nobj].kind, sizeof objs[nobj].kind, "mem");
        objs[nobj++].h = p;
        pthread_mutex_unlock(&t_mu);
    }
    return NULL;
}
static void spawn(int n, void *(*fn)(void *)) {
    pthread_t th[64];
    if (n > 64) n = 64;
    pthread_barrier_init(&t_bar, NULL, (unsigned)n);
    cuCtxGetCurrent(&g_ctx0);
    for (int k = 0; k < n; k++) pthread_create(&th[k], NULL, fn, NULL);
    for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&t_bar);
}

static void set_dev(int n) {
    CUcontext c;
    CUresult r = cuDevicePrimaryCtxRetain(&c, n);
    if (r) die("primary ctx retain", r, 0);
    cuCtxSetCurrent(c);
}

#include "vgpat.h"
#include "vgfork.h"

static int run(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *c = argv[i];
        if (pat_cmd(argc, argv, &i)) {
        } else if (!strcmp(c, "init")) {
            CUresult r = cuInit(0);
            if (r) die("cuInit", r, 0);
            set_dev(0);
        } else if (!strcmp(c, "noctx")) {
            cuCtxSetCurrent(NULL);
        } else if (!strcmp(c, "dev")) {
            set_dev(atoi(argv[++i]));
        } else if (!strcmp(c, "alloc")) {
            const char *kind = argv[++i];
            size_t n = strtoull(argv[++i], NULL, 0);
            int want = atoi(argv[++i]);
            uint64_t h;
            CUresult r = do_alloc(kind, n, &h);
            printf("alloc %s %zu -> %d\n", kind, n, r);
            fflush(stdout);
            if (want != -1 && r != want) die("alloc result", r, want);
            if (r == CUDA_SUCCESS) {
                snprintf(objs[nobj].kind, sizeof objs[nobj].kind, "%s", kind);
                objs[nobj].va = 0;
                objs[nobj].size = n;
                objs[nobj++].h = h;
            }
        } else if (!strcmp(c, "free")) {
            if (!nobj) die("nothing to free", 0, 0);
            CUresult r = do_free(&objs[--nobj]);
            if (r) die("free", r, 0);
        } else if (!strcmp(c, "freeall")) {
            while (nobj) { CUresult r = do_free(&objs[--nobj]); if (r) die("free", r, 0); }
        } else if (!strcmp(c, "info")) {
            size_t f = 0, t = 0;
            CUresult r = cuMemGetInfo_v2(&f, &t);
            printf("info %zu %zu %d\n", f, t, r);
        } else if (!strcmp(c, "total")) {
            int d = atoi(argv[++i]);
            size_t t = 0;
            cuDeviceTotalMem_v2(&t, d);
            printf("total %d %zu\n", d, t);
        } else if (!strcmp(c, "nvml")) {
            unsigned d = (unsigned)atoi(argv[++i]);
            nvmlDevice_t h;
            nvmlMemory_t m;
            nvmlMemory_v2_t m2 = {.version = 2};
            if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(d, &h) || nvmlDeviceGetMemoryInfo(h, &m) ||
                nvmlDeviceGetMemoryInfo_v2(h, &m2))
                die("nvml", 0, 0);
            printf("nvml %u %llu %llu %llu\n", d, m.total, m.used, m.free);
            printf("nvml2 %u %llu %llu %llu\n", d, m2.total, m2.used, m2.free);
        } else if (!strcmp(c, "launch")) {
            long n = atol(argv[++i]);
            unsigned g = (unsigned)atoi(argv[++i]);
            for (long k = 0; k < n; k++) {
                CUresult r = cuLaunchKernel(NULL, g, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                if (r) die("launch", r, 0);
            }
            printf("launched %ld\n", n);
        } else if (!strcmp(c, "rate")) {
            double secs = atof(argv[++i]);
            unsigned g = (unsigned)atoi(argv[++i]);
            busy_t b;
            busy_start(&b);
            double t0 = now_s(), t, next = t0 + BUSY_SAMPLE_S;
            long n = 0;
            while ((t = now_s()) - t0 < secs) {
                cuLaunchKernel(NULL, g, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                n++;
                if (t >= next) { busy_sample(&b); next = t + BUSY_SAMPLE_S; }
            }
            busy_sample(&b);
            double w = b.ok && b.seen && b.window_us ? 100.0 / b.window_us : -1.0;
            printf("rate %.1f %.1f %.1f\n", n / (t - t0), w < 0 ? w : w * b.busy_us, w < 0 ? w : w * b.all_us);
        } else if (!strcmp(c, "threads")) {
            int n = atoi(argv[++i]);
            t_iter = atol(argv[++i]);
            t_bytes = strtoull(argv[++i], NULL, 0);
            spawn(n, churn);
            printf("threads done\n");
        } else if (!strcmp(c, "race")) {
            int n = atoi(argv[++i]);
            t_bytes = strtoull(argv[++i], NULL, 0);
            t_ok = 0;
            spawn(n, racer);
            printf("race %d\n", t_ok);
        } else if (!strcmp(c, "uid")) {
            printf("uid %d\n", (int)getuid());
        } else if (!strcmp(c, "echo")) {
            printf("%s\n", argv[++i]);
        } else if (!strcmp(c, "sleep")) {
            usleep((useconds_t)(atof(argv[++i]) * 1e6));
        } else if (!strcmp(c, "waitfile")) {
            const char *path = argv[++i];
            int waited_ms = 0;
            while (access(path, F_OK) != 0 && waited_ms < 120000) {
                usleep(10000);
                waited_ms += 10;
            }
            if (access(path, F_OK) != 0) printf("waitfile timeout\n");
        } else if (!strcmp(c, "hold")) {
            printf("holding\n");
            fflush(stdout);
            for (;;) pause();
        } else if (!strcmp(c, "fork") || !strcmp(c, "exec")) {
            int end = i + 1;
            while (end < argc && strcmp(argv[end], "--")) end++;
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0 && c[0] == 'f') exit(run(end - i - 1, argv + i + 1));
            if (pid == 0) {
                char **av = calloc((size_t)(end - i) + 1, sizeof *av);
                av[0] = (char *)"vgtest";
                for (int k = i + 1; k < end; k++) av[k - i] = argv[k];
                execv("/proc/self/exe", av);
                _exit(127);
            }
            int st;
            waitpid(pid, &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st)) die("child failed", st, 0);
            if (end >= argc) return 0;
            i = end;
        } else if (!strcmp(c, "tasks")) {
            print_tasks();
        } else if (!strcmp(c, "forkstorm")) {
            forkstorm(atoi(argv[++i]));
        } else if (!strcmp(c, "setenv")) {
            const char *name = argv[++i];
            setenv(name, argv[++i], 1);
        } else if (!strcmp(c, "procs")) {
            unsigned d = (unsigned)atoi(argv[++i]);
            nvmlDevice_t h;
            nvmlProcessInfo_v1_t pi[64];
            unsigned n = 64;
            if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(d, &h) || nvmlDeviceGetComputeRunningProcesses(h, &n, pi))
                die("nvml procs", 0, 0);
            unsigned long long sum = 0;
            for (unsigned k = 0; k < n; k++) sum += pi[k].usedGpuMemory;
            printf("procs %u %u %llu\n", d, n, sum);
            for (unsigned k = 0; k < n; k++) printf("proc %u %llu\n", pi[k].pid, pi[k].usedGpuMemory);
            /* _v3 (what pynvml calls): first the size query, then the list */
            nvmlProcessInfo_v2_t p3[64];
            unsigned n3 = 0;
            nvmlReturn_t q = nvmlDeviceGetComputeRunningProcesses_v3(h, &n3, NULL);
            unsigned need = n3;
            n3 = 64;
            if ((q != NVML_SUCCESS && q != NVML_ERROR_INSUFFICIENT_SIZE) ||
                nvmlDeviceGetComputeRunningProcesses_v3(h, &n3, p3))
                die("nvml procs v3", q, 0);
            unsigned long long sum3 = 0;
            for (unsigned k = 0; k < n3; k++) sum3 += p3[k].usedGpuMemory;
            printf("procs3 %u %u %llu %u\n", d, n3, sum3, need);
        } else {
            fprintf(stderr, "unknown command %s\n", c);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    return run(argc - 1, argv + 1);
}
