/* dlsym override. RTLD_NEXT lookups must be resolved relative to the
 * *caller*, which glibc derives from the return address, so the exported
 * dlsym is a tiny assembly trampoline that tail-jumps to the real dlsym for
 * RTLD_NEXT and to vg_dlsym_impl otherwise. Every other lookup is resolved by
 * the real dlsym first; when the answer is exactly the real driver (or NVML)
 * function we wrap, our wrapper is returned instead. */
#include "vgpu.h"
#include <dlfcn.h>
#include <string.h>

/* dlsym can be called by a sanitizer runtime before it has initialised
 * (e.g. ASan resolving its interceptors): keep this path uninstrumented. */
#define NO_SAN __attribute__((no_sanitize("address", "undefined")))

typedef void *(*dlsym_fn)(void *, const char *);
VG_HIDDEN dlsym_fn vg_real_dlsym;

NO_SAN static dlsym_fn resolve_real(void) {
    static const char *const vers[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.3", "GLIBC_2.4", NULL};
    dlsym_fn f = vg_real_dlsym;
    for (int i = 0; !f && vers[i]; i++) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", vers[i]);
    if (f) __atomic_store_n(&vg_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

NO_SAN dlsym_fn vg_get_real_dlsym(void) { return vg_real_dlsym ? vg_real_dlsym : resolve_real(); }

__attribute__((constructor)) static void dlsym_ctor(void) { resolve_real(); }

NO_SAN static int hook_index(const char *sym, const char *const *names, int n) {
    for (int i = 0; i < n; i++) if (!strcmp(sym, names[i])) return i;
    return -1;
}

NO_SAN VG_HIDDEN void *vg_dlsym_impl(void *handle, const char *sym) {
    dlsym_fn real = vg_get_real_dlsym();
    if (!real) return NULL;
    void *p = real(handle, sym);
    if (!p || !sym || handle == RTLD_NEXT) return p;
    if (sym[0] == 'c' && sym[1] == 'u') {
        int i = hook_index(sym, vg_cuda_names, VGC_NHOOKS);
        if (i >= 0 && vg_cuda_load() == 0 && vg_cuda_real[i] == p) return vg_cuda_hook[i];
    } else if (sym[0] == 'n' && sym[1] == 'v' && sym[2] == 'm' && sym[3] == 'l') {
        int i = hook_index(sym, vg_nvml_names, VGN_NHOOKS);
        if (i >= 0 && vg_nvml_load() == 0 && vg_nvml_real[i] == p) return vg_nvml_hook[i];
    }
    return p;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "  cmpq $-1, %rdi\n"
        "  jne 1f\n"
        "  movq vg_real_dlsym(%rip), %rax\n"
        "  testq %rax, %rax\n"
        "  je 1f\n"
        "  jmp *%rax\n"
        "1:\n"
        "  jmp vg_dlsym_impl\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,%function\n"
        "dlsym:\n"
        "  cmn x0, #1\n"
        "  b.ne 1f\n"
        "  adrp x16, vg_real_dlsym\n"
        "  ldr x16, [x16, :lo12:vg_real_dlsym]\n"
        "  cbz x16, 1f\n"
        "  br x16\n"
        "1:\n"
        "  b vg_dlsym_impl\n"
        ".size dlsym, .-dlsym\n");
#else
VG_EXPORT void *dlsym(void *handle, const char *sym) { return vg_dlsym_impl(handle, sym); }
#endif
