/* Process limits, failing closed.
 *
 * HAMi-core takes the limits from the environment only, and the first process
 * writes them into the shared region where later processes take them from. A
 * process that lost its environment (sudo, cron, `env -i` with the preload
 * kept) therefore runs unlimited, in a region of its own.
 *
 * Here every process computes its own limits:
 *   - the environment (CUDA_DEVICE_MEMORY_LIMIT[_i], CUDA_DEVICE_SM_LIMIT[_i]);
 *   - capped by the limits file the device plugin bind-mounts read-only next to
 *     the library (<dir of libvgpu.so>/limits.env, KEY=VALUE lines with the same
 *     names): per device the lower non-zero memory limit and the lower SM
 *     share apply, so the environment can lower but never raise or remove them;
 *     the file's CUDA_DEVICE_MEMORY_SHARED_CACHE names the region, so an
 *     env-less process still shares the container's accounting;
 *   - the shared region may lower them further (region.c), never raise them;
 *   - GPU_CORE_UTILIZATION_POLICY likewise: with a limits file, the file's policy
 *     (absent = default) applies unless the environment names a stricter one, in the
 *     order disable < default < force, so the environment can force the limiter on but
 *     never switch it off (the plugin writes "disable" into the file when the operator
 *     or the webhook's gpuCorePolicy turns it off).
 * Nothing else in the environment can loosen a limit: CUDA_OVERSUBSCRIBE is not read
 * (device memory is never oversubscribed by this library), CUDA_TASK_PRIORITY only
 * seeds the region field the monitor does not trust (it reads the pod spec), and
 * CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER only rename devices (devmap.c).
 * The file's location is not configurable through the environment: the
 * environment is what a tenant controls. A file that exists but cannot be read
 * or holds a malformed limit makes every device allocation fail (vg_deny). */
#include "vgpu.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t vg_limit[VG_MAXDEV];
uint64_t vg_sm_limit[VG_MAXDEV];
int vg_deny;

#define KV_MAX 64
typedef struct {
    int n;
    const char *key[KV_MAX];
    const char *val[KV_MAX];
    char buf[8192];
} kv_t;

static kv_t g_file;      /* the limits file's pairs, kept for the cache path */
static int g_have_file;

static const char *kv_get(void *ctx, const char *name) {
    const kv_t *kv = ctx;
    const char *v = NULL;
    for (int i = 0; i < kv->n; i++)
        if (!strcmp(kv->key[i], name)) v = kv->val[i]; /* the last one wins */
    return v;
}

/* <directory of this library>/<name>; -1 when it cannot be known */
int vg_lib_file(const char *name, char *out, size_t n) {
    Dl_info info;
    if (!dladdr((void *)&vg_limits_init, &info) || !info.dli_fname) return -1;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return -1;
    int len = snprintf(out, n, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, name);
    return (len < 0 || (size_t)len >= n) ? -1 : 0;
}

/* 1 read, 0 absent, -1 present but unreadable or malformed */
static int read_kv(const char *path, kv_t *kv) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return (errno == ENOENT || errno == ENOTDIR) ? 0 : -1;
    struct stat st;
    ssize_t len = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size < sizeof kv->buf)
        len = read(fd, kv->buf, sizeof kv->buf - 1);
    close(fd);
    if (len < 0 || (len > 0 && (size_t)len != (size_t)st.st_size)) return -1;
    kv->buf[len] = 0;
    kv->n = 0;
    for (char *line = kv->buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!*line || *line == '#') continue;
        char *eq = strchr(line, '=');
        if (!eq || eq == line || kv->n >= KV_MAX) return -1;
        *eq = 0;
        kv->key[kv->n] = line;
        kv->val[kv->n++] = eq + 1;
    }
    return kv->n ? 1 : -1; /* the plugin always writes some: an empty file is damaged */
}

void vg_fail_closed(const char *why) {
    if (!vg_deny) LOG_ERROR("%s: refusing every device allocation", why);
    vg_deny = 1;
}

int vg_has_limit(void) {
    for (int i = 0; i < VG_MAXDEV; i++)
        if (vg_limit[i] || vg_sm_limit[i] < 100) return 1;
    return 0;
}

/* strictness of a policy: disable < default < force */
static int policy_rank(int p) { return p == VG_POLICY_DISABLE ? 0 : p == VG_POLICY_FORCE ? 2 : 1; }
static const char *policy_name(int p) {
    return p == VG_POLICY_DISABLE ? "disable" : p == VG_POLICY_FORCE ? "force" : "default";
}

void vg_limits_init(void) {
    char path[4096];
    int bad = 0;
    g_have_file = 0;
    if (vg_lib_file(VG_LIMITS_FILE, path, sizeof path) == 0) {
        int r = read_kv(path, &g_file);
        if (r < 0) bad = 1;
        g_have_file = r > 0;
    }
    vg_policy = vg_env_policy();
    if (g_have_file) {
        int fp = vg_parse_policy(kv_get(&g_file, "GPU_CORE_UTILIZATION_POLICY"));
        const char *ev = getenv("GPU_CORE_UTILIZATION_POLICY");
        if (!ev || !*ev) {
            vg_policy = fp; /* a process that lost its environment keeps the container's policy */
        } else if (policy_rank(vg_policy) < policy_rank(fp)) {
            LOG_WARN("GPU_CORE_UTILIZATION_POLICY=%s in the environment would loosen the mounted policy %s; "
                     "the mounted one applies", policy_name(vg_policy), policy_name(fp));
            vg_policy = fp;
        }
    }
    for (int i = 0; i < VG_MAXDEV; i++) {
        uint64_t mem = vg_env_mem_limit(i), sm = vg_env_sm_limit(i);
        if (g_have_file) {
            uint64_t fmem = vg_lookup_mem_limit(kv_get, &g_file, i, &bad);
            uint64_t fsm = vg_lookup_sm_limit(kv_get, &g_file, i, &bad);
            if (fmem && (!mem || mem > fmem)) {
                if (mem) LOG_WARN("device %d: environment limit %llu is above the mounted limit %llu; the mounted one applies",
                                  i, (unsigned long long)mem, (unsigned long long)fmem);
                mem = fmem;
            }
            if (fsm < sm) sm = fsm;
        }
        vg_limit[i] = mem;
        vg_sm_limit[i] = sm;
    }
    if (bad && g_have_file) vg_fail_closed("the mounted limits file holds an invalid limit");
    else if (bad) vg_fail_closed("the mounted limits file cannot be read");
}

const char *vg_cache_path(void) {
    const char *p = g_have_file ? kv_get(&g_file, "CUDA_DEVICE_MEMORY_SHARED_CACHE") : NULL;
    if (!p || !*p) p = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (!p || !*p) p = "/tmp/cudevshr.cache";
    return p;
}
