/* fake_runtime: reaches the driver the way cudart does - dlopen("libcuda.so.1"),
 * dlsym only for cuGetProcAddress(_v2), every other entry point by base name
 * + version through it. Checks which object each answer lives in (dladdr)
 * and that the limit applies through the obtained pointers.
 * usage: fake_runtime 12|11 LIMIT_BYTES */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vgpu_abi.h"

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t);
static int fails;
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL: " __VA_ARGS__); printf("\n"); fails++; } } while (0)

static const char *owner(void *p) {
    Dl_info i;
    if (!p || !dladdr(p, &i) || !i.dli_fname) return "?";
    const char *base = strrchr(i.dli_fname, '/');
    base = base ? base + 1 : i.dli_fname;
    if (!strncmp(base, "libvgpu", 7)) return "vgpu";
    if (!strncmp(base, "libcuda", 7)) return "driver";
    if (!strncmp(base, "libnvidia-ml", 12)) return "nvml";
    return i.dli_fname;
}

static gpa_v2_t gpa2;
static gpa_t gpa1;
static int mode, ver;

static void *get(const char *sym, cuuint64_t flags, CUresult *res, CUdriverProcAddressQueryResult *st) {
    void *fn = NULL;
    *st = (CUdriverProcAddressQueryResult)-1;
    if (mode == 12) *res = gpa2(sym, &fn, ver, flags, st);
    else *res = gpa1(sym, &fn, ver, flags);
    return fn;
}

int main(int argc, char **argv) {
    mode = argc > 1 ? atoi(argv[1]) : 12;
    unsigned long long limit = argc > 2 ? strtoull(argv[2], NULL, 0) : 0;
    ver = mode == 12 ? 12040 : 11050;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("FAIL dlopen %s\n", dlerror()); return 1; }
    CUresult r;
    CUdriverProcAddressQueryResult st;
    if (mode == 12) {
        gpa2 = (gpa_v2_t)dlsym(h, "cuGetProcAddress_v2");
        CHECK(!strcmp(owner((void *)gpa2), "vgpu"), "dlsym cuGetProcAddress_v2 -> %s", owner((void *)gpa2));
    } else {
        gpa1 = (gpa_t)dlsym(h, "cuGetProcAddress");
        CHECK(!strcmp(owner((void *)gpa1), "vgpu"), "dlsym cuGetProcAddress -> %s", owner((void *)gpa1));
    }
    /* self lookup returns a wrapper with the same signature */
    void *self = get("cuGetProcAddress", 0, &r, &st);
    CHECK(r == 0 && !strcmp(owner(self), "vgpu"), "self lookup r=%d owner=%s", r, owner(self));
    if (mode == 12) CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS, "self lookup status %d", st);
    if (mode == 12) gpa2 = (gpa_v2_t)self; else gpa1 = (gpa_t)self;

    const char *hooked[] = {"cuInit", "cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuMemAllocManaged",
                            "cuMemAllocPitch", "cuMemAllocAsync", "cuMemCreate", "cuMemRelease",
                            "cuLaunchKernel", "cuDevicePrimaryCtxRetain", "cuCtxCreate", "cuDeviceTotalMem",
                            "cuMemMap", "cuMemUnmap", "cuMemAllocFromPoolAsync", "cuMemPoolTrimTo",
                            "cuMemPoolSetAttribute", "cuMemPoolDestroy", "cuStreamSynchronize", "cuEventSynchronize",
                            "cuCtxSynchronize", "cuGraphAddMemAllocNode", "cuGraphInstantiate",
                            "cuGraphInstantiateWithFlags", "cuGraphExecDestroy", "cuGraphDestroy",
                            "cuDeviceGraphMemTrim", "cuGraphLaunch", NULL};
    for (int i = 0; hooked[i]; i++) {
        void *fn = get(hooked[i], 0, &r, &st);
        CHECK(r == 0 && !strcmp(owner(fn), "vgpu"), "%s -> r=%d %s", hooked[i], r, owner(fn));
        if (mode == 12) CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS, "%s status %d", hooked[i], st);
    }
    /* every ABI variant the driver hands out for a requested version is wrapped */
    int vers[] = {3020, 11040, 12050};
    for (int i = 0; i < 3; i++) {
        int save = ver;
        ver = vers[i];
        void *fn = get("cuCtxCreate", 0, &r, &st);
        CHECK(r == 0 && !strcmp(owner(fn), "vgpu"), "cuCtxCreate@%d -> %s", vers[i], owner(fn));
        ver = save;
    }
    {
        int save = ver;
        ver = 11000; /* older than the stream-ordered allocator: the driver's answer passes through */
        void *fn = get("cuMemAllocAsync", 0, &r, &st);
        CHECK(r == CUDA_ERROR_NOT_FOUND && fn == NULL, "cuMemAllocAsync@11000 r=%d", r);
        if (mode == 12) CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "version status %d", st);
        ver = save;
    }
    /* per-thread default stream variants are wrapped too */
    void *lk = get("cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &r, &st);
    CHECK(r == 0 && !strcmp(owner(lk), "vgpu"), "cuLaunchKernel ptds -> %s", owner(lk));
    /* unwrapped entry points are the driver's own */
    void *g = get("cuGraphCreate", 0, &r, &st);
    CHECK(r == 0 && !strcmp(owner(g), "driver"), "cuGraphCreate -> %s", owner(g));
    void *dv = get("cuDeviceGet", 0, &r, &st);
    CHECK(r == 0 && !strcmp(owner(dv), "driver"), "cuDeviceGet -> %s", owner(dv));
    void *nf = get("cuDoesNotExist", 0, &r, &st);
    CHECK(r == CUDA_ERROR_NOT_FOUND && nf == NULL, "missing symbol r=%d", r);
    if (mode == 12) CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "missing symbol status %d", st);

    /* use the entry points: the limit applies (field case B28: 10 MB counted) */
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))get("cuInit", 0, &r, &st);
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))get("cuDevicePrimaryCtxRetain", 0, &r, &st);
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))get("cuCtxSetCurrent", 0, &r, &st);
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))get("cuMemAlloc", 0, &r, &st);
    CUresult (*mfree)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))get("cuMemFree", 0, &r, &st);
    CUresult (*info)(size_t *, size_t *) = (CUresult(*)(size_t *, size_t *))get("cuMemGetInfo", 0, &r, &st);
    CHECK(init(0) == 0, "cuInit");
    CUcontext ctx;
    CHECK(retain(&ctx, 0) == 0, "retain");
    setcur(ctx);
    CUdeviceptr p10, p;
    CHECK(alloc(&p10, 10 << 20) == 0, "alloc 10MB");
    size_t fr = 0, tot = 0;
    info(&fr, &tot);
    printf("info %zu %zu\n", fr, tot);
    if (limit) {
        CHECK(tot == limit, "total %zu != limit %llu", tot, limit);
        CHECK(fr == limit - (10 << 20), "10 MB not counted: free %zu", fr);
        CHECK(alloc(&p, fr + 1) == CUDA_ERROR_OUT_OF_MEMORY, "one byte over the limit must fail");
        CHECK(alloc(&p, fr) == 0, "exact fit must succeed");
        CHECK(mfree(p) == 0, "free");
    }
    CHECK(mfree(p10) == 0, "free 10MB");
    /* NVML reached like nvidia-smi does it: dlopen + dlsym */
    void *nh = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(nh != NULL, "dlopen libnvidia-ml.so.1");
    if (nh) {
        void *mi = dlsym(nh, "nvmlDeviceGetMemoryInfo"), *mi2 = dlsym(nh, "nvmlDeviceGetMemoryInfo_v2");
        void *cnt = dlsym(nh, "nvmlDeviceGetCount_v2");
        CHECK(!strcmp(owner(mi), "vgpu") && !strcmp(owner(mi2), "vgpu"), "nvml memory info -> %s", owner(mi));
        CHECK(!strcmp(owner(cnt), "nvml"), "nvmlDeviceGetCount_v2 -> %s", owner(cnt));
    }
    printf(fails ? "fake_runtime FAILED\n" : "fake_runtime ok\n");
    return fails != 0;
}
