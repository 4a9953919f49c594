/* The monitor's feedback, from a file no container can write.
 *
 * HAMi-core takes the two feedback fields the monitor writes, utilization_switch
 * (is the card contended: limit launches to the SM share) and recent_kernel < 0
 * (the priority block), from the shared region. The region lives in the
 * container's cache directory, which is mounted read-write into the container,
 * so any process of the container can write 0 / 2 there and run unlimited or
 * unblocked while the monitor says otherwise.
 *
 * The device plugin therefore also mounts a small file read-only next to the
 * library, <dir of libvgpu.so>/feedback (host side:
 * <hook>/vgpu/containers/<podUID>_<ctr>.plugin/feedback, or the claim's
 * .plugin directory in DRA mode), which the monitor rewrites in place every
 * tick. Layout (little-endian, VG_FEEDBACK_SIZE bytes; vg_feedback_t):
 *   0  u32 magic    VG_FEEDBACK_MAGIC ("VGFB")
 *   4  u32 version  VG_FEEDBACK_VERSION (1)
 *   8  i32 utilization_switch  0 = uncontended (launch freely), else limited
 *  12  i32 blocked             0 = may launch, else blocked (priority)
 * When the file is present and valid, these two decisions come from it only;
 * the region's fields are ignored for them (libvgpu still writes
 * recent_kernel = 2 into the region at each launch: the monitor's activity
 * signal, cooperative by nature). A file that is present but not a valid
 * feedback file means "always limited" with the block taken from the region
 * (the safe reading: neither is looser than without the file). With no
 * file (HAMi's device plugin, pods started before it was mounted) the region's
 * fields apply as in HAMi-core. Like limits.env, the location is derived from
 * where the library itself was loaded, never from the environment. */
#include "vgpu.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

const volatile vg_feedback_t *vg_feedback;
int vg_feedback_state; /* VG_FB_ABSENT, VG_FB_VALID or VG_FB_INVALID */
static int g_done;

void vg_feedback_init(void) {
    if (g_done) return; /* a forked child keeps its parent's mapping */
    g_done = 1;
    vg_feedback_state = VG_FB_ABSENT;
    char path[4096];
    if (vg_lib_file(VG_FEEDBACK_FILE, path, sizeof path) != 0) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno != ENOENT && errno != ENOTDIR) {
            LOG_WARN("feedback file %s unreadable (%s): launches stay limited", path, strerror(errno));
            vg_feedback_state = VG_FB_INVALID;
        }
        return;
    }
    struct stat st;
    void *m = MAP_FAILED;
    /* only a regular file of exactly this size is mapped: the writers never
     * truncate it, so a read through the mapping cannot fault */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == (off_t)VG_FEEDBACK_SIZE)
        m = mmap(NULL, VG_FEEDBACK_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    const vg_feedback_t *f = m == MAP_FAILED ? NULL : m;
    if (!f || f->magic != VG_FEEDBACK_MAGIC || f->version != VG_FEEDBACK_VERSION) {
        if (f) munmap(m, VG_FEEDBACK_SIZE);
        LOG_WARN("feedback file %s is not a version %d feedback file: launches stay limited", path,
                 VG_FEEDBACK_VERSION);
        vg_feedback_state = VG_FB_INVALID;
        return;
    }
    vg_feedback = f;
    vg_feedback_state = VG_FB_VALID;
}
