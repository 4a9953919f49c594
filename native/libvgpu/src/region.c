/* Shared region (spec A.6): attach/create, slot registration, dead-slot
 * reclaim, the region semaphore, and the lock-free limit check. */
#include "vgpu.h"
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(vg_devmem_t) == 64, "devmem");
_Static_assert(sizeof(vg_devutil_t) == 48, "devutil");
_Static_assert(sizeof(vg_slot_t) == 1960, "slot");
_Static_assert(offsetof(vg_slot_t, status) == 1928, "slot.status");
_Static_assert(offsetof(vg_slot_t, seqlock) == 1936, "slot.seqlock");
_Static_assert(offsetof(vg_region_t, sem) == 24, "sem");
_Static_assert(offsetof(vg_region_t, limit) == 1600, "limit");
_Static_assert(offsetof(vg_region_t, procs) == 1856, "procs");
_Static_assert(offsetof(vg_region_t, proc_num) == 2008896, "proc_num");
_Static_assert(offsetof(vg_region_t, last_kernel_time) == 2008912, "lkt");
_Static_assert(sizeof(vg_region_t) == 2008952, "region size");

vg_region_t *vg_region;
vg_slot_t *vg_slot;
int vg_pid;
int vg_policy;
static int g_shared;             /* region is the shared file (not a private fallback) */
static vg_slot_t g_private_slot; /* used when the region has no free slot */
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_atexit_done;

#define A_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define A_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

int vg_pid_alive(int pid) {
    char path[64], buf[512];
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1; /* unknown: keep */
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X' || p[2] == 'x')) return 0;
    return 1;
}

static void region_init_fields(vg_region_t *r) {
    r->major_version = VG_MAJOR;
    r->minor_version = VG_MINOR;
    r->sm_init_flag = 0;
    r->owner_pid = 0;
    for (int i = 0; i < VG_MAXDEV; i++) {
        r->limit[i] = vg_limit[i];
        r->sm_limit[i] = vg_sm_limit[i];
    }
    sem_init(&r->sem, 1, 1);
    sem_init(&r->sem_postinit, 1, 1);
    r->utilization_switch = 1;
    r->recent_kernel = 2;
    r->proc_num = 0;
    const char *p = getenv("CUDA_TASK_PRIORITY");
    r->priority = (p && *p) ? atoi(p) : 1;
    __atomic_store_n(&r->initialized_flag, VG_MAGIC, __ATOMIC_RELEASE);
}

static vg_region_t *region_private(void) {
    vg_region_t *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    region_init_fields(r);
    return r;
}

static void exit_handler(void) {
    if (!vg_region || !g_shared) return;
    vg_record_kernel_time(); /* flush a pending last-kernel timestamp */
    int me = getpid();
    uint64_t owner = me;
    if (__atomic_compare_exchange_n(&vg_region->owner_pid, &owner, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        sem_post(&vg_region->sem);
    vg_slot_t *s = vg_slot;
    if (s && s != &g_private_slot && s->pid == me && vg_share_any(s)) {
        vg_lock(); /* shared VMM memory this process paid for: to an importer still alive */
        vg_share_reclaim_nolock(s);
        vg_unlock();
    }
    if (s && s != &g_private_slot && s->pid == me) {
        /* zero usage and release the slot; the process is gone */
        A_STORE(&s->status, 0);
        memset(s->used, 0, sizeof s->used);
        memset(s->monitorused, 0, sizeof s->monitorused);
        memset(s->device_util, 0, sizeof s->device_util);
        s->hostpid = 0;
        A_STORE(&s->pid, 0);
    }
}

/* An existing region may lower this process's limits (the first process of the
 * container fixed them, as in HAMi), never raise or remove them: its bytes are
 * writable by every process of the container. */
static void adopt_lower_limits(const vg_region_t *r, const char *path) {
    for (int i = 0; i < VG_MAXDEV; i++) {
        uint64_t reg = r->limit[i], own = vg_limit[i];
        if (reg && (!own || reg < own)) {
            if (own) LOG_WARN("device %d: region limit %llu differs from environment %llu; the region wins", i,
                              (unsigned long long)reg, (unsigned long long)own);
            vg_limit[i] = reg;
        } else if (own && reg != own) {
            LOG_WARN("device %d: region %s has limit %llu, this process %llu; the lower one applies", i, path,
                     (unsigned long long)reg, (unsigned long long)own);
        }
        uint64_t sm = r->sm_limit[i];
        if (sm > 0 && sm < vg_sm_limit[i]) vg_sm_limit[i] = sm;
    }
}

static int region_attach_file(void) {
    const char *path = vg_cache_path();
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        LOG_ERROR("cannot open shared region %s: %s", path, strerror(errno));
        return -1;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = sizeof(vg_region_t)};
    while (fcntl(fd, F_SETLKW, &fl) < 0 && errno == EINTR) { }
    struct stat st;
    if (fstat(fd, &st) < 0) goto fail;
    if (st.st_size == 0) (void)fchmod(fd, 0666); /* creator: readable by every process of the container */
    if ((size_t)st.st_size < sizeof(vg_region_t) + 1) {
        char z = 0;
        if (pwrite(fd, &z, 1, sizeof(vg_region_t)) != 1) goto fail;
    }
    vg_region_t *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) goto fail;
    if (A_LOAD(&r->initialized_flag) != VG_MAGIC) {
        region_init_fields(r);
        LOG_INFO("created shared region %s", path);
    } else if (r->major_version != VG_MAJOR) {
        LOG_ERROR("shared region %s has version %u.%u, expected %d.%d", path, r->major_version, r->minor_version,
                  VG_MAJOR, VG_MINOR);
        munmap(r, sizeof *r);
        goto fail;
    } else {
        adopt_lower_limits(r, path);
    }
    __atomic_store_n(&r->last_kernel_time, (uint64_t)time(NULL), __ATOMIC_RELAXED);
    fl.l_type = F_UNLCK;
    fcntl(fd, F_SETLK, &fl);
    close(fd);
    vg_region = r;
    g_shared = 1;
    return 0;
fail:
    LOG_ERROR("shared region %s unusable (%s)", path, strerror(errno));
    fl.l_type = F_UNLCK;
    fcntl(fd, F_SETLK, &fl);
    close(fd);
    return -1;
}

int vg_region_ensure(void) {
    if (LIKELY(A_LOAD(&vg_region) != NULL)) return 0;
    pthread_mutex_lock(&g_init_mu);
    if (!vg_region) {
        vg_log_init();
        vg_limits_init(); /* also sets vg_policy */
        vg_feedback_init();
        if (region_attach_file() != 0) {
            /* without the shared region every process would get the whole limit */
            if (vg_has_limit()) vg_fail_closed("no usable shared region for a limited container");
            else LOG_WARN("no shared region: this process is not counted with the others (no limit is set)");
            vg_region_t *r = region_private();
            if (!r) { pthread_mutex_unlock(&g_init_mu); return -1; }
            g_shared = 0;
            A_STORE(&vg_region, r);
        }
        if (!g_atexit_done) { g_atexit_done = 1; atexit(exit_handler); }
    }
    pthread_mutex_unlock(&g_init_mu);
    return 0;
}

/* ------------------------------------------------------------------ lock */
void vg_lock(void) {
    vg_region_t *r = vg_region;
    int timeouts = 0;
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 10;
        if (sem_timedwait(&r->sem, &ts) == 0) break;
        if (errno == EINTR) continue;
        if (errno != ETIMEDOUT) continue;
        uint64_t owner = A_LOAD(&r->owner_pid);
        if (owner && !vg_pid_alive((int)owner)) {
            if (__atomic_compare_exchange_n(&r->owner_pid, &owner, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                LOG_WARN("region lock owner %llu died; releasing its lock", (unsigned long long)owner);
                sem_post(&r->sem);
            }
            usleep(10000);
            continue;
        }
        if (!owner && ++timeouts > 30) {
            LOG_ERROR("region lock unavailable for 5 minutes; resetting it");
            sem_post(&r->sem);
            timeouts = 0;
        }
    }
    A_STORE(&r->owner_pid, (uint64_t)getpid());
}

void vg_unlock(void) {
    A_STORE(&vg_region->owner_pid, 0);
    sem_post(&vg_region->sem);
}

static void slot_zero(vg_slot_t *s) {
    A_STORE(&s->status, 0);
    memset(s->used, 0, sizeof s->used);
    memset(s->monitorused, 0, sizeof s->monitorused);
    memset(s->device_util, 0, sizeof s->device_util);
    s->hostpid = 0;
    s->seqlock = 0;
    A_STORE(&s->pid, 0);
}

/* Reclaim slots of processes that died without their exit handler (kill -9)
 * and leftovers of exited HAMi-core processes (pid 0 with counters).
 * Slots are freed in place, never moved, so live processes keep their
 * cached slot pointer; proc_num shrinks past free trailing slots. Lock held. */
static int reclaim_nolock(void) {
    vg_region_t *r = vg_region;
    int n = A_LOAD(&r->proc_num), freed = 0;
    if (n > VG_MAXPROC) n = VG_MAXPROC;
    for (int i = 0; i < n; i++) {
        vg_slot_t *s = &r->procs[i];
        int pid = A_LOAD(&s->pid);
        if (s == vg_slot) continue;
        if (pid == 0) {
            if (s->status != 0 || s->used[0].total || s->hostpid) { slot_zero(s); freed++; }
            continue;
        }
        if (!vg_pid_alive(pid)) {
            LOG_INFO("reclaiming slot %d of dead process %d", i, pid);
            vg_share_reclaim_nolock(s); /* shared VMM memory it paid for: to an importer still alive */
            slot_zero(s);
            freed++;
        }
    }
    while (n > 0 && A_LOAD(&r->procs[n - 1].pid) == 0 && r->procs[n - 1].status == 0 && &r->procs[n - 1] != vg_slot) n--;
    A_STORE(&r->proc_num, n);
    return freed;
}

int vg_region_is_shared(void) { return g_shared; }

int vg_reclaim_dead(void) {
    if (!g_shared) return 0;
    vg_lock();
    int n = reclaim_nolock();
    vg_unlock();
    return n;
}

static pthread_mutex_t g_slot_mu = PTHREAD_MUTEX_INITIALIZER;

/* a forked child must not inherit a lock held by another parent thread */
void vg_region_fork_child(void) {
    pthread_mutex_init(&g_slot_mu, NULL);
    pthread_mutex_init(&g_init_mu, NULL);
}

int vg_slot_ensure(void) {
    if (vg_region_ensure() != 0) return -1;
    pthread_mutex_lock(&g_slot_mu);
    if (vg_slot && vg_pid == getpid()) { pthread_mutex_unlock(&g_slot_mu); return 0; }
    vg_pid = getpid();
    if (!g_shared) {
        memset(&g_private_slot, 0, sizeof g_private_slot);
        g_private_slot.pid = vg_pid;
        g_private_slot.status = 1;
        vg_region->procs[0] = g_private_slot;
        vg_region->proc_num = 1;
        A_STORE(&vg_slot, &vg_region->procs[0]);
        pthread_mutex_unlock(&g_slot_mu);
        return 0;
    }
    vg_region_t *r = vg_region;
    vg_slot = NULL;
    vg_lock();
    reclaim_nolock();
    int n = A_LOAD(&r->proc_num), idx = -1;
    for (int i = 0; i < n; i++)
        if (A_LOAD(&r->procs[i].pid) == vg_pid) { idx = i; break; } /* PID reuse */
    if (idx < 0)
        for (int i = 0; i < n; i++)
            if (A_LOAD(&r->procs[i].pid) == 0 && r->procs[i].status == 0) { idx = i; break; }
    if (idx < 0 && n < VG_MAXPROC) idx = n;
    vg_slot_t *s;
    if (idx < 0) {
        LOG_ERROR("shared region full (%d process slots); this process is not counted", VG_MAXPROC);
        /* an uncounted process would see only the others' usage: never unlimited */
        if (vg_has_limit()) vg_fail_closed("no process slot in the shared region for a limited container");
        s = &g_private_slot;
        memset(s, 0, sizeof *s);
    } else {
        s = &r->procs[idx];
        if (A_LOAD(&s->pid) == vg_pid) vg_share_reclaim_nolock(s); /* an earlier process with our PID */
        slot_zero(s);
    }
    s->status = 1;
    A_STORE(&s->pid, vg_pid);
    if (idx >= n) A_STORE(&r->proc_num, idx + 1);
    vg_unlock();
    A_STORE(&vg_slot, s);
    LOG_DEBUG("registered slot %d", idx);
    pthread_mutex_unlock(&g_slot_mu);
    return 0;
}

/* -------------------------------------------------------------- accounting */
/* vg_usage / vg_reserve / vg_unreserve are inline in vgpu.h (hot path) */
int vg_reserve_slow(int dev, uint64_t bytes) {
    /* over the limit: reclaim slots of dead processes once and re-check */
    vg_devmem_t *m = &vg_slot->used[dev];
    if (vg_reclaim_dead() > 0 && vg_usage(dev) <= vg_limit[dev]) return 0;
    __atomic_fetch_sub(&m->total, bytes, __ATOMIC_SEQ_CST);
    return -1;
}
