/*
 * Shared state of the test-only stub driver (libcuda.so.1 + libnvidia-ml.so.1).
 * Kept in the file named by VGPU_STUB_STATE (mmapped, shared by every process
 * of a test) or in anonymous memory when unset. Configuration (read by the
 * process that creates the state):
 *   VGPU_STUB_DEVICES      number of devices (default 2, max 16)
 *   VGPU_STUB_MEM_MB       physical memory per device in MiB (default 16384)
 *   VGPU_STUB_CTX_MB       memory a context occupies in MiB (default 0)
 *   VGPU_STUB_NS_PER_BLOCK busy time a launch costs per grid block (default 0)
 * Per process: VGPU_STUB_PID_OFFSET (NVML reports pid + offset, a PID namespace),
 *   VGPU_STUB_UNIQUE_HOST_PIDS (NVML reports a host PID unique in the state file, as
 *   the driver does for processes of different containers whose own PIDs are equal),
 *   VGPU_STUB_RUNTIME=nvidia (the stub also plays the NVIDIA container runtime: a
 *   process sees only the devices NVIDIA_VISIBLE_DEVICES names, by UUID or index, in
 *   that order, as ordinals 0..n-1; the shared state keeps physical indices),
 *   VGPU_STUB_RETAIN_DELAY_MS (a primary context takes that long to create, listed
 *   by NVML from its start), VGPU_STUB_NVML_REVERSE (process lists newest first),
 *   VGPU_STUB_SM_COUNTS (comma list, multiprocessors of each physical device; default 10
 *   each: a mixed node has cards of different speed).
 *   The device lists these build: stub_devices.h.
 *
 * A process record belongs to (pid, PID namespace). With a state file, the owner holds
 * a POSIX lock on one byte past the mapped state (offset = its record index) for its
 * lifetime: a record is live while that lock is held, which also works for processes
 * of other PID namespaces (containers sharing one state file on a node), where a pid
 * number says nothing. Without a state file, liveness is /proc/<pid>.
 */
#ifndef STUB_STATE_H
#define STUB_STATE_H
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STUB_MAGIC 0x53545544u
#define STUB_MAXDEV 16
#define STUB_MAXPROC 512
#define STUB_RING 2048
#define STUB_MAXOBJ 256

typedef struct {
    uint64_t start_ns, end_ns; /* CLOCK_REALTIME */
    int32_t dev, pad;
} stub_busy_t;

typedef struct {
    _Atomic int32_t pid;
    _Atomic int32_t hostpid;               /* what NVML reports */
    _Atomic uint64_t pidns;                /* inode of the owner's PID namespace */
    _Atomic uint64_t starttime;            /* the owner's start (/proc/self/stat field 22) */
    _Atomic int32_t ctx[STUB_MAXDEV];      /* live contexts on device */
    _Atomic uint64_t mem[STUB_MAXDEV];     /* bytes held on device */
    _Atomic uint64_t launches;
    _Atomic uint64_t ring_head;            /* launches recorded in rings[record] */
} stub_proc_t;

/* a virtual-memory allocation (cuMemCreate) that can be shared between processes
 * (stub_mem.h): alive while refs > 0; its bytes are charged to the creating process's
 * record, or to orphan_mem once the creator holds no reference any more */
typedef struct {
    _Atomic uint64_t id;     /* 0 = free entry */
    uint64_t size;
    int32_t phys, creator;   /* physical device, record index of the creator */
    _Atomic int32_t refs;    /* handles (created or imported) and mappings, all processes */
    _Atomic int32_t creator_refs; /* those of refs the creator holds: dropped when it dies */
    _Atomic int32_t orphan;
} stub_obj_t;

typedef struct {
    uint32_t magic;
    int32_t ndev;
    uint64_t mem_total;
    uint64_t ctx_bytes;
    uint64_t ns_per_block;
    _Atomic uint64_t launches;
    _Atomic uint64_t next_handle;
    _Atomic int32_t next_hostpid;
    int32_t pad_;
    stub_proc_t procs[STUB_MAXPROC];
    stub_obj_t objs[STUB_MAXOBJ];
    _Atomic uint64_t orphan_mem[STUB_MAXDEV];
    /* each record's recent launches, apart from the records: a scan of the records
     * (every process start, every usage sum) then touches a few pages, not one per
     * record, as the driver's own bookkeeping costs a process nothing */
    stub_busy_t rings[STUB_MAXPROC][STUB_RING];
} stub_state_t;

/* record idx belongs to a dead process: the driver drops that process's references to
 * shared VMM objects; one that others still reference stays on the device, its bytes
 * moved from the dead record (zeroed by the caller) to orphan_mem */
static void st_reap_objs(stub_state_t *s, int idx) {
    for (int j = 0; j < STUB_MAXOBJ; j++) {
        stub_obj_t *o = &s->objs[j];
        if (!atomic_load(&o->id) || o->creator != idx || atomic_load(&o->orphan)) continue;
        int32_t n = atomic_exchange(&o->creator_refs, 0);
        if (n <= 0) continue;
        atomic_fetch_add(&s->orphan_mem[o->phys], o->size);
        atomic_store(&o->orphan, 1);
        if (atomic_fetch_sub(&o->refs, n) == n) {
            atomic_fetch_sub(&s->orphan_mem[o->phys], o->size);
            atomic_store(&o->id, 0);
        }
    }
}

/* record p's launch ring */
#define ST_RING(s, p) ((s)->rings[(p) - (s)->procs])

static stub_state_t *g_st;
static stub_proc_t *g_me;
static int g_me_pid;
static int g_fd = -1; /* the state file, kept open for the record locks */

static uint64_t st_env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return strtoull(v, NULL, 10);
}

static uint64_t st_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int st_pid_alive(int pid) {
    char path[64], buf[256];
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X' || p[2] == 'x')) return 0;
    return 1;
}

static void st_init_fields(stub_state_t *s) {
    s->ndev = (int)st_env_u64("VGPU_STUB_DEVICES", 2);
    if (s->ndev < 1) s->ndev = 1;
    if (s->ndev > STUB_MAXDEV) s->ndev = STUB_MAXDEV;
    s->mem_total = st_env_u64("VGPU_STUB_MEM_MB", 16384) << 20;
    s->ctx_bytes = st_env_u64("VGPU_STUB_CTX_MB", 0) << 20;
    s->ns_per_block = st_env_u64("VGPU_STUB_NS_PER_BLOCK", 0);
    atomic_store(&s->next_handle, 0x1000);
    s->magic = STUB_MAGIC;
}

static stub_state_t *st_get(void) {
    if (g_st) return g_st;
    const char *path = getenv("VGPU_STUB_STATE");
    stub_state_t *s = MAP_FAILED;
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd >= 0) {
            flock(fd, LOCK_EX);
            struct stat sb;
            fstat(fd, &sb);
            if ((size_t)sb.st_size < sizeof(stub_state_t)) {
                if (ftruncate(fd, sizeof(stub_state_t)) != 0) perror("stub ftruncate");
            }
            s = mmap(NULL, sizeof(stub_state_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (s != MAP_FAILED && s->magic != STUB_MAGIC) st_init_fields(s);
            flock(fd, LOCK_UN);
            if (s != MAP_FAILED) g_fd = fd; else close(fd);
        }
    }
    if (s == MAP_FAILED) {
        s = mmap(NULL, sizeof(stub_state_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) abort();
        st_init_fields(s);
    }
    g_st = s;
    return s;
}

static void st_fork_child(void) { g_me = NULL; }

/* when this process started (clock ticks since boot, /proc/self/stat field 22; 0 when
 * /proc is not there): exec keeps it, a new process that got a dead one's PID in a
 * reused namespace has its own */
static uint64_t st_starttime(void) {
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* st_starttime() of this process, read once per process (a forked child rereads) */
static uint64_t st_my_start(void) {
    static uint64_t start;
    static int start_pid;
    int pid = getpid();
    if (start_pid != pid) { start = st_starttime(); start_pid = pid; }
    return start;
}

static uint64_t st_pidns(void) {
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

static int st_record_lock(int idx, short type, int cmd, struct flock *out) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)sizeof(stub_state_t) + idx;
    fl.l_len = 1;
    int r = fcntl(g_fd, cmd, &fl);
    if (out) *out = fl;
    return r;
}

/* is record idx owned by a live process? Our own record always is: POSIX locks do not
 * conflict within one process, so F_GETLK cannot show it (and each stub library has
 * its own g_me). */
static int st_slot_alive(stub_state_t *s, int idx) {
    stub_proc_t *p = &s->procs[idx];
    int pid = atomic_load(&p->pid);
    if (pid <= 0) return 0;
    if (p == g_me || (pid == getpid() && atomic_load(&p->pidns) == st_pidns() &&
                      atomic_load(&p->starttime) == st_my_start())) return 1;
    if (g_fd < 0) return st_pid_alive(pid);
    struct flock fl;
    if (st_record_lock(idx, F_WRLCK, F_GETLK, &fl) != 0) return st_pid_alive(pid);
    return fl.l_type != F_UNLCK;
}

/* this process's record; the cached pointer is dropped in a forked child */
__attribute__((unused)) static stub_proc_t *st_me(void) {
    if (g_me) return g_me;
    static int atfork;
    if (!atfork) { atfork = 1; pthread_atfork(NULL, NULL, st_fork_child); }
    int pid = getpid();
    uint64_t ns = st_pidns();
    stub_state_t *s = st_get();
    uint64_t started = st_my_start();
    /* ours already: exec keeps pid, namespace and start time. A record with our pid and
     * namespace but another start time is a dead process's (PIDs and namespace inodes
     * are reused): it is reaped as any dead one, never taken over with its memory */
    for (int i = 0; i < STUB_MAXPROC; i++)
        if (atomic_load(&s->procs[i].pid) == pid && atomic_load(&s->procs[i].pidns) == ns &&
            atomic_load(&s->procs[i].starttime) == started) {
            if (g_fd >= 0) st_record_lock(i, F_WRLCK, F_SETLK, NULL);
            g_me = &s->procs[i]; g_me_pid = pid; return g_me;
        }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < STUB_MAXPROC; i++) {
            stub_proc_t *p = &s->procs[i];
            int32_t cur = atomic_load(&p->pid);
            if (cur != 0 && (pass == 0 || cur < 0 || st_slot_alive(s, i))) continue;
            if (atomic_compare_exchange_strong(&p->pid, &cur, -1)) {
                if (g_fd >= 0) st_record_lock(i, F_WRLCK, F_SETLK, NULL);
                if (cur > 0) st_reap_objs(s, i);
                for (int d = 0; d < STUB_MAXDEV; d++) { p->ctx[d] = 0; p->mem[d] = 0; }
                p->launches = 0;
                p->ring_head = 0;
                atomic_store(&p->pidns, ns);
                atomic_store(&p->starttime, started);
                if (getenv("VGPU_STUB_UNIQUE_HOST_PIDS"))
                    atomic_store(&p->hostpid, 3000000 + atomic_fetch_add(&s->next_hostpid, 1));
                else
                    atomic_store(&p->hostpid, pid + (int)st_env_u64("VGPU_STUB_PID_OFFSET", 0));
                atomic_store(&p->pid, pid);
                g_me = p; g_me_pid = pid;
                return p;
            }
        }
    }
    fprintf(stderr, "stub: out of process records\n");
    abort();
}

/* bytes held on physical device dev by live processes; check_alive reaps dead
 * records (slow) */
static uint64_t st_dev_used(int dev, int check_alive) {
    stub_state_t *s = st_get();
    uint64_t used = 0;
    for (int i = 0; i < STUB_MAXPROC; i++) {
        int pid = atomic_load(&s->procs[i].pid);
        if (pid <= 0) continue;
        if (check_alive && !st_slot_alive(s, i)) {
            st_reap_objs(s, i);
            for (int d = 0; d < STUB_MAXDEV; d++) { s->procs[i].mem[d] = 0; s->procs[i].ctx[d] = 0; }
            continue;
        }
        used += atomic_load(&s->procs[i].mem[dev]);
    }
    return used + atomic_load(&s->orphan_mem[dev]);
}
#endif
