/* VMM allocations shared between processes of a container (cuMemExportToShareableHandle
 * in the creator, cuMemImportFromShareableHandle in another process): who pays.
 *
 * The creator pays from cuMemCreate until its last reference goes (vmm.c, memory.c). When
 * it goes while another process still holds an import of the allocation (the driver
 * frees the memory only at the last reference of any process), the charge moves to one
 * such importer, which pays until its own last reference goes and then passes it on to
 * the next importer or drops it. A creator killed with kill -9 runs no code: the process
 * that reclaims its slot (under the region lock, before zeroing it) moves the charge.
 *
 * Records: 32 per process slot, three 64-bit words each, in the slot's unused words of
 * HAMi's layout (used[i].unused[3] for records 0-15, device_util[i].unused[3] for 16-31;
 * neither HAMi's monitor nor ours reads them). Only the region lock's holder writes them.
 *   export  w0 = 1<<56 | dev<<48          w1 = bytes the creator pays   w2 = id<<32 | fd
 *   import  w0 = 2<<56 | dev<<48 | cpid   w1 = bytes this importer pays w2 = id<<32 | mapped 4 KiB pages
 * fd is the creator's own duplicate of the exported descriptor, held by the library while
 * the allocation lives; id names the allocation within its creator (cpid).
 *
 * Link: the importer compares its descriptor with every export record of the other live
 * processes with kcmp(KCMP_FILE) (the kernel's word that both name one open file, i.e.
 * one export of one allocation) and links only on exactly one match. No match (kcmp
 * refused by seccomp, a descriptor reopened through /proc, a creator without a shared
 * region or out of records) leaves the import unlinked: the importer then pays for what
 * it maps itself (vmm.c), counted twice while the creator also holds it.
 *
 * Trust: the records sit in the region next to the counters they move, so they are
 * exactly as writable by the container as the counters themselves (see docs/security.md:
 * the library is cooperative). Within that: a record never lowers a charge below what
 * the library's own process memory knows: an importer gives up at most what it took at
 * link time, the creator moves its own figure, and nothing is moved to a dead process. */
#include "vgpu.h"
#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NREC 32
enum { R_EXPORT = 1, R_IMPORT = 2 };

static uint64_t *rec(vg_slot_t *s, int r) { return r < 16 ? s->used[r].unused : s->device_util[r - 16].unused; }
static uint64_t ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static int kind_of(uint64_t w0) { return (int)(w0 >> 56); }
static int dev_of(uint64_t w0) { return (int)((w0 >> 48) & 0xff); }

static int usable(void) { return vg_slot && vg_region_is_shared() && vg_slot >= vg_region->procs &&
                                 vg_slot < vg_region->procs + VG_MAXPROC; }

static int free_rec(vg_slot_t *s) {
    for (int r = 0; r < NREC; r++) if (!kind_of(ld(&rec(s, r)[0]))) return r;
    return -1;
}

/* hand `bytes` on dev to one unpaid importer of (cpid, id) in a live slot other than
 * `skip`; 1 if one took it. Lock held. */
static int hand_on(int cpid, uint32_t id, int dev, uint64_t bytes, const vg_slot_t *skip) {
    vg_region_t *g = vg_region;
    int n = __atomic_load_n(&g->proc_num, __ATOMIC_ACQUIRE);
    if (n > VG_MAXPROC) n = VG_MAXPROC;
    for (int i = 0; i < n; i++) {
        vg_slot_t *s = &g->procs[i];
        int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        if (s == skip || pid <= 0 || (s != vg_slot && !vg_pid_alive(pid))) continue;
        for (int r = 0; r < NREC; r++) {
            uint64_t *w = rec(s, r), w0 = ld(&w[0]);
            if (kind_of(w0) != R_IMPORT || (int)(uint32_t)w0 != cpid || (uint32_t)(ld(&w[2]) >> 32) != id ||
                dev_of(w0) != dev || ld(&w[1]))
                continue;
            uint64_t floor = (ld(&w[2]) & 0xffffffffu) << 12; /* what the importer has mapped of it */
            if (bytes < floor) bytes = floor;
            __atomic_fetch_add(&s->used[dev].total, bytes, __ATOMIC_SEQ_CST); /* add first: never a dip */
            st(&w[1], bytes);
            LOG_DEBUG("VMM allocation %d/%u (%llu bytes on device %d) now paid by process %d", cpid, id,
                      (unsigned long long)bytes, dev, pid);
            return 1;
        }
    }
    return 0;
}

static uint32_t g_next_id;

int vg_share_export(int dev, uint64_t bytes, int fd, uint32_t *id, int *privfd) {
    if (!usable() || dev < 0 || dev >= VG_MAXDEV || !bytes) return -1;
    int pf = fcntl(fd, F_DUPFD_CLOEXEC, 256); /* above the numbers programs tend to pick */
    if (pf < 0) pf = fcntl(fd, F_DUPFD_CLOEXEC, 3); /* a descriptor limit under 256 */
    if (pf < 0) return -1;
    if (!g_next_id) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        g_next_id = (uint32_t)(ts.tv_nsec ^ (uint64_t)ts.tv_sec * 2654435761u) | 1;
    }
    vg_lock();
    int r = free_rec(vg_slot);
    if (r >= 0) {
        uint64_t *w = rec(vg_slot, r);
        if (!*id && !(*id = g_next_id++)) *id = g_next_id++; /* a new allocation: a new id (never 0) */
        st(&w[1], bytes);
        st(&w[2], (uint64_t)*id << 32 | (uint32_t)pf);
        st(&w[0], (uint64_t)R_EXPORT << 56 | (uint64_t)dev << 48);
    }
    vg_unlock();
    if (r < 0) {
        LOG_WARN("cuMemExportToShareableHandle: no record left for this export; importers will count it themselves");
        close(pf);
        return -1;
    }
    *privfd = pf;
    return r;
}

void vg_share_unexport(uint32_t id, int dev, uint64_t bytes) {
    if (!usable()) return;
    vg_lock();
    int had = 0;
    for (int r = 0; r < NREC; r++) {
        uint64_t *w = rec(vg_slot, r);
        if (kind_of(ld(&w[0])) != R_EXPORT || (uint32_t)(ld(&w[2]) >> 32) != id) continue;
        st(&w[0], 0);
        had = 1;
    }
    if (had) hand_on(vg_pid, id, dev, bytes, NULL); /* the caller then gives up its own charge */
    vg_unlock();
}

int vg_share_link(int fd, int *dev, uint64_t *bytes, uint32_t *id, int *cpid) {
    if (!usable()) return -1;
    static int warned;
    vg_lock();
    vg_region_t *g = vg_region;
    int n = __atomic_load_n(&g->proc_num, __ATOMIC_ACQUIRE), found = 0, me = getpid();
    if (n > VG_MAXPROC) n = VG_MAXPROC;
    for (int i = 0; i < n && found < 2; i++) {
        vg_slot_t *s = &g->procs[i];
        int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        if (pid <= 0 || (s != vg_slot && !vg_pid_alive(pid))) continue; /* its own exports too */
        for (int r = 0; r < NREC && found < 2; r++) {
            uint64_t *w = rec(s, r), w0 = ld(&w[0]), w2 = ld(&w[2]);
            if (kind_of(w0) != R_EXPORT) continue;
            long k = syscall(SYS_kcmp, me, pid, KCMP_FILE, fd, (int)(uint32_t)w2);
            if (k < 0 && (errno == EPERM || errno == ENOSYS) && !warned) {
                warned = 1;
                LOG_INFO("kcmp unavailable (%s): imported VMM memory is counted by the importer", strerror(errno));
            }
            if (k != 0) continue;
            if (found && (*cpid != pid || *id != (uint32_t)(w2 >> 32))) { found = 2; break; } /* ambiguous */
            found = 1;
            *cpid = pid; *id = (uint32_t)(w2 >> 32); *dev = dev_of(w0); *bytes = ld(&w[1]);
        }
    }
    int r = -1;
    if (found == 1 && *dev < VG_MAXDEV && (r = free_rec(vg_slot)) >= 0) {
        uint64_t *w = rec(vg_slot, r);
        st(&w[1], 0);
        st(&w[2], (uint64_t)*id << 32);
        st(&w[0], (uint64_t)R_IMPORT << 56 | (uint64_t)*dev << 48 | (uint32_t)*cpid);
    }
    vg_unlock();
    return r;
}

/* the importer mapped `bytes` of a linked import: what it pays once it pays is at least
 * that much, whatever the creator's record says */
void vg_share_floor(int r, uint64_t bytes) {
    if (!usable() || r < 0 || r >= NREC) return;
    uint64_t pages = (bytes + 4095) >> 12;
    if (pages > 0xffffffffu) pages = 0xffffffffu;
    vg_lock();
    uint64_t *w = rec(vg_slot, r), w2 = ld(&w[2]);
    if (kind_of(ld(&w[0])) == R_IMPORT && (w2 & 0xffffffffu) < pages) st(&w[2], (w2 & ~0xffffffffull) | pages);
    vg_unlock();
}

/* another live importer's record of (cpid, id) than `mine` is paid: only one is at a
 * time, so `mine` says so falsely. Lock held. */
static int other_paid(int cpid, uint32_t id, const uint64_t *mine) {
    vg_region_t *g = vg_region;
    int n = __atomic_load_n(&g->proc_num, __ATOMIC_ACQUIRE);
    if (n > VG_MAXPROC) n = VG_MAXPROC;
    for (int i = 0; i < n; i++) {
        vg_slot_t *s = &g->procs[i];
        int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        if (pid <= 0 || (s != vg_slot && !vg_pid_alive(pid))) continue;
        for (int r = 0; r < NREC; r++) {
            uint64_t *w = rec(s, r), w0 = ld(&w[0]);
            if (w != mine && kind_of(w0) == R_IMPORT && (int)(uint32_t)w0 == cpid &&
                (uint32_t)(ld(&w[2]) >> 32) == id && ld(&w[1]))
                return 1;
        }
    }
    return 0;
}

/* the creator cpid is alive and still has an export record of id: nobody can have
 * handed its charge on. Lock held. */
static int creator_pays(int cpid, uint32_t id) {
    vg_region_t *g = vg_region;
    int n = __atomic_load_n(&g->proc_num, __ATOMIC_ACQUIRE);
    if (n > VG_MAXPROC) n = VG_MAXPROC;
    for (int i = 0; i < n; i++) {
        vg_slot_t *s = &g->procs[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != cpid || (s != vg_slot && !vg_pid_alive(cpid))) continue;
        for (int r = 0; r < NREC; r++)
            if (kind_of(ld(&rec(s, r)[0])) == R_EXPORT && (uint32_t)(ld(&rec(s, r)[2]) >> 32) == id) return 1;
    }
    return 0;
}

void vg_share_unimport(int r, uint32_t id, int cpid, int dev, uint64_t cap) {
    if (!usable() || r < 0 || r >= NREC) return;
    vg_lock();
    uint64_t *w = rec(vg_slot, r), w0 = ld(&w[0]);
    if (kind_of(w0) == R_IMPORT && (int)(uint32_t)w0 == cpid && (uint32_t)(ld(&w[2]) >> 32) == id) {
        uint64_t paid = ld(&w[1]);
        if (paid > cap) paid = cap; /* never more than the creator's figure at link time or what was mapped */
        if (paid && (creator_pays(cpid, id) || other_paid(cpid, id, w)))
            paid = 0; /* not handed on to this record: written by someone else */
        st(&w[0], 0);
        st(&w[1], 0);
        if (paid) {
            hand_on(cpid, id, dev, paid, NULL); /* another importer, if one is left, pays on */
            vg_unreserve(dev, paid, VG_CAT_DATA);
        }
    }
    vg_unlock();
}

/* slot s (dead, or this process at exit) is about to be zeroed: its creator charges go
 * to an importer still alive, and so do the charges it paid as an importer. Lock held. */
void vg_share_reclaim_nolock(vg_slot_t *s) {
    int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    if (pid <= 0) return;
    for (int r = 0; r < NREC; r++) {
        uint64_t *w = rec(s, r), w0 = ld(&w[0]), w2 = ld(&w[2]);
        int dev = dev_of(w0);
        if (!kind_of(w0) || dev >= VG_MAXDEV) continue;
        st(&w[0], 0);
        if (kind_of(w0) == R_EXPORT) hand_on(pid, (uint32_t)(w2 >> 32), dev, ld(&w[1]), s);
        else if (kind_of(w0) == R_IMPORT && ld(&w[1]))
            hand_on((int)(uint32_t)w0, (uint32_t)(w2 >> 32), dev, ld(&w[1]), s);
    }
}

int vg_share_any(const vg_slot_t *s) {
    for (int r = 0; r < NREC; r++) if (kind_of(ld(&rec((vg_slot_t *)s, r)[0]))) return 1;
    return 0;
}
