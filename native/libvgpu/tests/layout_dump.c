/* Prints the shared-region layout as the library compiles it (offsetof), one
 * "name offset" per line, for the Python reader cross-check. */
#include <stddef.h>
#include <stdio.h>
#include "vgpu.h"
#define R(f) printf("region.%s %zu\n", #f, offsetof(vg_region_t, f));
#define S(f) printf("slot.%s %zu\n", #f, offsetof(vg_slot_t, f));
#define M(f) printf("devmem.%s %zu\n", #f, offsetof(vg_devmem_t, f));
#define U(f) printf("devutil.%s %zu\n", #f, offsetof(vg_devutil_t, f));
int main(void) {
    R(initialized_flag) R(major_version) R(minor_version) R(sm_init_flag) R(owner_pid) R(sem) R(device_num)
    R(uuids) R(limit) R(sm_limit) R(procs) R(proc_num) R(utilization_switch) R(recent_kernel) R(priority)
    R(last_kernel_time) R(sem_postinit)
    S(pid) S(hostpid) S(used) S(monitorused) S(device_util) S(status) S(seqlock) S(unused)
    M(context_size) M(module_size) M(data_size) M(offset) M(total)
    U(dec_util) U(enc_util) U(sm_util)
    printf("sizeof.region %zu\nsizeof.slot %zu\nsizeof.devmem %zu\nsizeof.devutil %zu\n", sizeof(vg_region_t),
           sizeof(vg_slot_t), sizeof(vg_devmem_t), sizeof(vg_devutil_t));
    return 0;
}
