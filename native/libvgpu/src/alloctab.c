/* The process-local allocation table of the CUDA hooks: every counted device
 * object (pointer, VMM handle, array, mipmapped array, context) with its size,
 * container device and usage category, so that its free returns exactly what
 * its allocation reserved. Open addressing (stored hash, backward-shift delete)
 * under a spinlock: O(1) at any number of live allocations. Also the VMM and
 * pool helpers of vmm.c, pools.c and graphs.c that work on the table. */
#include "cudahook.h"
#include <sched.h>
#include <stdlib.h>
#include <string.h>

static ent_t *g_tab;
static uint32_t g_cap, g_cnt;
/* table lock: a test-and-test-and-set spinlock (critical sections are a few
 * dozen instructions; unlock is a plain release store) */
static int g_tab_lk;
static inline void tab_lock(void) {
    while (__atomic_exchange_n(&g_tab_lk, 1, __ATOMIC_ACQUIRE)) {
        for (int n = 0; __atomic_load_n(&g_tab_lk, __ATOMIC_RELAXED); n++) {
            if (n > 200) { sched_yield(); n = 0; }
#if defined(__x86_64__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ __volatile__("yield");
#endif
        }
    }
}
static inline void tab_unlock(void) { __atomic_store_n(&g_tab_lk, 0, __ATOMIC_RELEASE); }

/* data_size of the own slot mirrors the DATA entries of the table; only this
 * process writes its slot and only under the table lock */
static inline void data_cat(const ent_t *e, int sign) {
    if (e->cat != VG_CAT_DATA || e->dev < 0 || e->dev >= VG_MAXDEV || !vg_slot) return;
    uint64_t *f = &vg_slot->used[e->dev].data_size;
    uint64_t v = __atomic_load_n(f, __ATOMIC_RELAXED);
    __atomic_store_n(f, sign > 0 ? v + e->size : v - e->size, __ATOMIC_RELAXED);
}

static inline uint32_t hkey(uint64_t k, int kind) {
    /* splitmix64 finaliser: device pointers share their low bits (alignment),
     * so every input bit must reach the low bits used as the index */
    k ^= (uint64_t)kind * 0x9e3779b97f4a7c15ull;
    k ^= k >> 30; k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27; k *= 0x94d049bb133111ebull;
    k ^= k >> 31;
    return (uint32_t)k;
}
static void tab_put_nolock(const ent_t *e);
static int tab_grow(void) {
    uint32_t ncap = g_cap ? g_cap * 2 : 1024;
    ent_t *n = calloc(ncap, sizeof *n), *old = g_tab;
    if (!n) return -1;
    uint32_t ocap = g_cap;
    g_tab = n; g_cap = ncap; g_cnt = 0;
    for (uint32_t i = 0; i < ocap; i++) if (old[i].kind) tab_put_nolock(&old[i]);
    free(old);
    return 0;
}
static void tab_put_nolock(const ent_t *e) {
    if ((g_cnt + 1) * 2 > g_cap && tab_grow() != 0) return;
    uint32_t m = g_cap - 1;
    for (uint32_t i = e->hash & m;; i = (i + 1) & m) {
        if (!g_tab[i].kind || (g_tab[i].key == e->key && g_tab[i].kind == e->kind)) {
            if (!g_tab[i].kind) g_cnt++;
            g_tab[i] = *e;
            return;
        }
    }
}
void vg_tab_put(int kind, uint64_t key, uint64_t size, int dev, int cat) {
    ent_t e = {key, size, hkey(key, kind), (uint8_t)kind, (uint8_t)cat, (int16_t)dev};
    tab_lock();
    tab_put_nolock(&e);
    data_cat(&e, +1);
    tab_unlock();
}
void vg_tab_restore(const ent_t *e) {
    tab_lock();
    tab_put_nolock(e);
    data_cat(e, +1);
    tab_unlock();
}
/* backward-shift deletion keeps probes short */
int vg_tab_take(int kind, uint64_t key, ent_t *out) {
    uint32_t hv = hkey(key, kind);
    tab_lock();
    if (!g_cap) { tab_unlock(); return 0; }
    uint32_t m = g_cap - 1, i = hv & m;
    for (;; i = (i + 1) & m) {
        if (!g_tab[i].kind) { tab_unlock(); return 0; }
        if (g_tab[i].key == key && g_tab[i].kind == kind) break;
    }
    *out = g_tab[i];
    data_cat(out, -1);
    g_cnt--;
    uint32_t j = i;
    for (;;) {
        g_tab[i].kind = 0;
        for (;;) {
            j = (j + 1) & m;
            if (!g_tab[j].kind) goto done;
            uint32_t h = g_tab[j].hash & m;
            if (i <= j ? (i < h && h <= j) : (i < h || h <= j)) continue;
            break;
        }
        g_tab[i] = g_tab[j];
        i = j;
    }
done:
    tab_unlock();
    return 1;
}

void vg_tab_fork_child(void) {
    g_tab_lk = 0;
    if (g_tab) memset(g_tab, 0, (size_t)g_cap * sizeof *g_tab);
    g_cnt = 0;
}

/* a cuMemCreate allocation whose handle is released while mapped: its entry moves to
 * the private key k (the handle's value may come back from the next cuMemCreate);
 * 1 if there was one */
int vg_vmm_park(uint64_t handle, uint64_t k) {
    ent_t e;
    if (!vg_tab_take(K_VMM, handle, &e)) return 0;
    e.key = k; e.kind = K_VMMREL; e.hash = hkey(k, K_VMMREL);
    vg_tab_restore(&e);
    return 1;
}
void vg_vmm_unpark(uint64_t k, uint64_t handle) {
    ent_t e;
    if (!vg_tab_take(K_VMMREL, k, &e)) return;
    e.key = handle; e.kind = K_VMM; e.hash = hkey(handle, K_VMM);
    vg_tab_restore(&e);
}
/* the last mapping of a parked allocation is gone: uncount it (after an importer that
 * still holds it took the charge over) */
void vg_vmm_drop(uint64_t k) {
    ent_t e;
    vg_vmm_gone(k);
    if (vg_tab_take(K_VMMREL, k, &e)) vg_unreserve(e.dev, e.size, e.cat);
}
/* 1 with its size and device when handle is a live cuMemCreate allocation of this process */
int vg_vmm_created(uint64_t handle, uint64_t *size, int *dev) {
    uint32_t hv = hkey(handle, K_VMM);
    int found = 0;
    tab_lock();
    if (g_cap)
        for (uint32_t m = g_cap - 1, i = hv & m; g_tab[i].kind; i = (i + 1) & m)
            if (g_tab[i].key == handle && g_tab[i].kind == K_VMM) {
                *size = g_tab[i].size; *dev = g_tab[i].dev; found = 1;
                break;
            }
    tab_unlock();
    return found;
}
/* bytes a pool holds from the device, counted as data of this process whatever the
 * limit (the device already holds them); sign > 0 adds */
void vg_charge_data(int dev, uint64_t bytes, int sign) {
    if (dev < 0 || dev >= VG_MAXDEV || !bytes || !vg_slot) return;
    ent_t e = {0, bytes, 0, 0, VG_CAT_DATA, (int16_t)dev};
    tab_lock();
    if (sign > 0) __atomic_fetch_add(&vg_slot->used[dev].total, bytes, __ATOMIC_SEQ_CST);
    data_cat(&e, sign);
    tab_unlock();
    if (sign < 0) vg_unreserve(dev, bytes, VG_CAT_DATA);
}
