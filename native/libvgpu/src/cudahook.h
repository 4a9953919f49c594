/* Internal to the CUDA driver hooks (cuda.c: driver table, entry gate,
 * cuGetProcAddress; alloctab.c: the process-local allocation table; memory.c:
 * memory info and device allocations; contexts.c; launch.c): the entry gate
 * every hook passes, the table's interface and the reserve / settle / free
 * steps shared by every counted allocation path. Not for vmm.c, pools.c and
 * graphs.c, which enter through vg_cuda_enter() (vgpu.h). */
#ifndef VGPU_CUDAHOOK_H
#define VGPU_CUDAHOOK_H
#include "vgpu.h"

/* ---------------------------------------------------- entry gate (cuda.c) */
VG_HIDDEN extern volatile int vg_ready;   /* the driver is loaded and this process has its slot */
VG_HIDDEN int vg_enter_slow(void);        /* 0 ok */
VG_HIDDEN void vg_run_gate_wait(void);    /* blocks while the slot's status is 2 */

#define ENTER()                                                                      \
    do {                                                                             \
        if (UNLIKELY(!vg_ready) && vg_enter_slow() != 0) return CUDA_ERROR_NOT_INITIALIZED; \
        if (UNLIKELY(__atomic_load_n(&vg_slot->status, __ATOMIC_RELAXED) == 2)) vg_run_gate_wait(); \
    } while (0)
#define HAVE(n) (vg_cuda_real[VGC_##n] != NULL)
#define REAL_OR_MISSING(n) do { if (UNLIKELY(!HAVE(n))) return CUDA_ERROR_NOT_FOUND; } while (0)

/* ------------------------------ process-local allocation table (alloctab.c) */
enum { K_DPTR = 1, K_VMM, K_ARRAY, K_MIPMAP, K_CTX, K_VMMREL /* released while mapped (vmm.c) */ };
typedef struct { uint64_t key, size; uint32_t hash; uint8_t kind, cat; int16_t dev; } ent_t;
VG_HIDDEN void vg_tab_put(int kind, uint64_t key, uint64_t size, int dev, int cat);
VG_HIDDEN void vg_tab_restore(const ent_t *e);
/* remove (kind,key) into *out; 1 if it was there */
VG_HIDDEN int vg_tab_take(int kind, uint64_t key, ent_t *out);
/* the child of fork owns none of the parent's device objects */
VG_HIDDEN void vg_tab_fork_child(void);
VG_HIDDEN void vg_ctx_fork_child(void);   /* contexts.c */

/* after the real call: keep the reservation and remember the object, or undo */
static inline CUresult settle(CUresult r, int kind, uint64_t key, uint64_t size, int dev, int cat) {
    if (r != CUDA_SUCCESS) { vg_unreserve(dev, size, cat); return r; }
    vg_tab_put(kind, key, size, dev, cat);
    return r;
}
#define OOM(what, dev, size)                                                                     \
    do {                                                                                         \
        if (vg_deny) {                                                                           \
            LOG_WARN("%s: %llu bytes on device %d refused (fail closed, see the error above)",  \
                     what, (unsigned long long)(size), dev);                                     \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                     \
        }                                                                                        \
        LOG_WARN("%s: %llu bytes on device %d would exceed the limit %llu (in use %llu)", what,  \
                 (unsigned long long)(size), dev, (unsigned long long)vg_limit[dev],     \
                 (unsigned long long)vg_usage(dev));                                             \
        return CUDA_ERROR_OUT_OF_MEMORY;                                                         \
    } while (0)

/* free path: forget first, free, restore the entry if the driver refused */
#define FREE_TRACKED(kind, key, call)                                         \
    do {                                                                      \
        ent_t e_;                                                             \
        int had_ = vg_tab_take(kind, key, &e_);                               \
        CUresult r_ = call;                                                   \
        if (had_) {                                                           \
            if (r_ == CUDA_SUCCESS) vg_unreserve(e_.dev, e_.size, e_.cat);    \
            else vg_tab_restore(&e_);                                         \
        }                                                                     \
        return r_;                                                            \
    } while (0)

#endif
