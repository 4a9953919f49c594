/* Logging (LIBCUDA_LOG_LEVEL, HAMi levels) and environment parsing. */
#include "vgpu.h"
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

int vg_log_level = 2;

void vg_log_init(void) {
    const char *v = getenv("LIBCUDA_LOG_LEVEL");
    if (v && *v) vg_log_level = atoi(v);
}

void vg_log(int level, const char *tag, const char *file, int line, const char *fmt, ...) {
    char buf[1024];
    int n;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    long tid = syscall(SYS_gettid);
    if (level == VG_LOG_ERROR)
        n = snprintf(buf, sizeof buf, "[HAMI-core ERROR (pid:%d thread=%ld %s:%d)]: ", (int)getpid(), tid, base, line);
    else
        n = snprintf(buf, sizeof buf, "[HAMI-core %s(%d:%ld:%s:%d)]: ", tag, (int)getpid(), tid, base, line);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    n += m;
    if ((size_t)n > sizeof buf - 2) n = sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n); /* one write: lines from threads do not interleave */
    (void)w;
}

/*
 * Byte quantity: <number>[suffix], number decimal (optionally with a fraction)
 * or 0x-hex, suffix (case-insensitive) one of
 *   (none)|b  bytes, k|ki|kb|kib  2^10, m|mi|mb|mib  2^20, g|gi|gb|gib  2^30,
 *   t|ti|tb|tib  2^40.
 * HAMi's single letters and the Kubernetes binary forms (Mi, Gi) therefore
 * agree; "MB"/"GB" are read as binary units as HAMi does. Anything else,
 * overflow, or a negative number is an error (-1).
 */
int vg_parse_bytes(const char *s, uint64_t *out) {
    if (!s) return -1;
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return -1;
    uint64_t ip = 0, frac_num = 0, frac_den = 1;
    const char *p = s;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        p += 2;
        if (!isxdigit((unsigned char)*p)) return -1;
        while (isxdigit((unsigned char)*p)) {
            int d = isdigit((unsigned char)*p) ? *p - '0' : (tolower((unsigned char)*p) - 'a' + 10);
            if (ip > (UINT64_MAX - (uint64_t)d) / 16) return -1;
            ip = ip * 16 + (uint64_t)d;
            p++;
        }
    } else {
        if (!isdigit((unsigned char)*p)) return -1;
        while (isdigit((unsigned char)*p)) {
            uint64_t d = (uint64_t)(*p - '0');
            if (ip > (UINT64_MAX - d) / 10) return -1;
            ip = ip * 10 + d;
            p++;
        }
        if (*p == '.') {
            p++;
            if (!isdigit((unsigned char)*p)) return -1;
            while (isdigit((unsigned char)*p)) {
                if (frac_den < 1000000000ull) { frac_num = frac_num * 10 + (uint64_t)(*p - '0'); frac_den *= 10; }
                p++;
            }
        }
    }
    char suf[8] = {0};
    size_t n = 0;
    while (*p && !isspace((unsigned char)*p)) {
        if (n >= sizeof suf - 1) return -1;
        suf[n++] = (char)tolower((unsigned char)*p++);
    }
    while (isspace((unsigned char)*p)) p++;
    if (*p) return -1;
    unsigned shift;
    if (n == 0 || !strcmp(suf, "b")) shift = 0;
    else {
        static const char units[] = "kmgt";
        const char *u = strchr(units, suf[0]);
        if (!u || !suf[0]) return -1;
        shift = 10u * (unsigned)(u - units + 1);
        const char *rest = suf + 1;
        if (*rest && strcmp(rest, "i") && strcmp(rest, "b") && strcmp(rest, "ib")) return -1;
    }
    if (shift && ip > (UINT64_MAX >> shift)) return -1;
    uint64_t v = ip << shift;
    if (frac_num) {
        if (shift == 0) return -1; /* fractional bytes */
        uint64_t f = (frac_num << shift) / frac_den;
        if (v > UINT64_MAX - f) return -1;
        v += f;
    }
    *out = v;
    return 0;
}

/* SM percentage: integer 0..100, optional trailing '%'. */
int vg_parse_percent(const char *s, uint64_t *out) {
    if (!s) return -1;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == '%') end++;
    while (isspace((unsigned char)*end)) end++;
    if (*end || v > 100) return -1;
    *out = v;
    return 0;
}

/* value of NAME_<dev> if set and valid, else NAME if valid, else dflt; names are
 * looked up with get(ctx, name) (the environment or the limits file). An invalid
 * value is logged and ignored, and sets *bad when bad is not NULL. */
static uint64_t lookup(vg_getter_t get, void *ctx, const char *name, int dev, uint64_t dflt,
                       int (*parse)(const char *, uint64_t *), const char *what, int *bad) {
    char key[64];
    uint64_t v;
    snprintf(key, sizeof key, "%s_%d", name, dev);
    const char *s = get(ctx, key);
    if (s && *s) {
        if (parse(s, &v) == 0) {
            if (v > 0) return v;
        } else {
            if (bad) *bad = 1;
            LOG_ERROR("invalid %s=\"%s\" (%s); ignoring it", key, s, what);
        }
    }
    s = get(ctx, name);
    if (s && *s) {
        if (parse(s, &v) == 0) {
            if (v > 0) return v;
        } else {
            if (bad) *bad = 1;
            if (dev == 0) LOG_ERROR("invalid %s=\"%s\" (%s); ignoring it", name, s, what);
        }
    }
    return dflt;
}

static const char *env_get(void *ctx, const char *name) {
    (void)ctx;
    return getenv(name);
}

uint64_t vg_lookup_mem_limit(vg_getter_t get, void *ctx, int dev, int *bad) {
    return lookup(get, ctx, "CUDA_DEVICE_MEMORY_LIMIT", dev, 0, vg_parse_bytes,
                  "expected bytes with optional k/m/g/t, Ki/Mi/Gi/Ti suffix; no limit applied", bad);
}

uint64_t vg_lookup_sm_limit(vg_getter_t get, void *ctx, int dev, int *bad) {
    return lookup(get, ctx, "CUDA_DEVICE_SM_LIMIT", dev, 100, vg_parse_percent,
                  "expected a percentage 0..100; using 100", bad);
}

uint64_t vg_env_mem_limit(int dev) { return vg_lookup_mem_limit(env_get, NULL, dev, NULL); }

uint64_t vg_env_sm_limit(int dev) { return vg_lookup_sm_limit(env_get, NULL, dev, NULL); }

int vg_env_policy(void) { return vg_parse_policy(getenv("GPU_CORE_UTILIZATION_POLICY")); }

/* force / disable (any case) / default; NULL, empty or anything else is default */
int vg_parse_policy(const char *s) {
    if (!s || !*s) return VG_POLICY_DEFAULT;
    if (!strcasecmp(s, "force")) return VG_POLICY_FORCE;
    if (!strcasecmp(s, "disable")) return VG_POLICY_DISABLE;
    if (strcasecmp(s, "default")) LOG_WARN("unknown GPU_CORE_UTILIZATION_POLICY=\"%s\", using default", s);
    return VG_POLICY_DEFAULT;
}
