/* Test-only preload: every thread created through pthread_create sleeps
 * SLOWSTART_MS (default 300) milliseconds before its start routine runs, as
 * a thread that is preempted during its start-up (where glibc and the
 * sanitizers allocate). libvgpu must not return from the call that started
 * its watcher, nor let a fork through, while the watcher is in that window. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

typedef struct { void *(*fn)(void *); void *arg; } tramp_t;

static void *tramp(void *p) {
    tramp_t t = *(tramp_t *)p;
    free(p);
    const char *v = getenv("SLOWSTART_MS");
    long ms = v && *v ? atol(v) : 300;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) { }
    return t.fn(t.arg);
}

__attribute__((visibility("default"))) int pthread_create(pthread_t *th, const pthread_attr_t *a,
                                                          void *(*fn)(void *), void *arg) {
    static int (*next)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!next) next = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))dlsym(RTLD_NEXT, "pthread_create");
    if (!next) return 11; /* EAGAIN */
    tramp_t *t = malloc(sizeof *t);
    if (!t) return 11;
    t->fn = fn;
    t->arg = arg;
    int r = next(th, a, tramp, t);
    if (r) free(t);
    return r;
}
