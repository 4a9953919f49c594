/* A second preloaded interposer that finds the next getuid with
 * dlsym(RTLD_NEXT): with libvgpu's dlsym in front, RTLD_NEXT must still be
 * resolved relative to this library (else it finds itself and recurses). */
#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>
__attribute__((visibility("default"))) uid_t getuid(void) {
    static uid_t (*next)(void);
    static int depth;
    if (!next) next = (uid_t(*)(void))dlsym(RTLD_NEXT, "getuid");
    if (!next || depth) return (uid_t)-2;  /* resolved to ourselves: report it */
    depth++;
    uid_t u = next();
    depth--;
    return u;
}
