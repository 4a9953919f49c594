/* Unit test of the limit parsers (links src/util.c only). */
#include <stdio.h>
#include <stdlib.h>
#include "vgpu.h"

static int fails;
static void bytes(const char *s, int ok, uint64_t want) {
    uint64_t v = 0;
    int r = vg_parse_bytes(s, &v);
    if ((r == 0) != ok || (ok && v != want)) {
        printf("FAIL bytes \"%s\": r=%d v=%llu want ok=%d %llu\n", s, r, (unsigned long long)v, ok,
               (unsigned long long)want);
        fails++;
    }
}
static void pct(const char *s, int ok, uint64_t want) {
    uint64_t v = 0;
    int r = vg_parse_percent(s, &v);
    if ((r == 0) != ok || (ok && v != want)) { printf("FAIL pct \"%s\"\n", s); fails++; }
}
int main(void) {
    const uint64_t K = 1024, M = K * K, G = M * K;
    bytes("1024", 1, 1024); bytes("0", 1, 0); bytes("0x1000", 1, 4096);
    bytes("100m", 1, 100 * M); bytes("100M", 1, 100 * M); bytes("100Mi", 1, 100 * M); bytes("100MiB", 1, 100 * M);
    bytes("100mb", 1, 100 * M); bytes("2g", 1, 2 * G); bytes("2Gi", 1, 2 * G); bytes("2GB", 1, 2 * G);
    bytes("4k", 1, 4 * K); bytes("4Ki", 1, 4 * K); bytes("1t", 1, G * K); bytes("1.5g", 1, G + G / 2);
    bytes(" 24576m ", 1, 24576 * M); bytes("15000m", 1, 15000 * M); bytes("7b", 1, 7);
    bytes("", 0, 0); bytes("abc", 0, 0); bytes("-1", 0, 0); bytes("2gbx", 0, 0); bytes("2 g", 0, 0);
    bytes("1.5", 0, 0); bytes("12q", 0, 0); bytes("99999999999999999999", 0, 0); bytes("17179869184g", 0, 0);
    bytes("0x", 0, 0); bytes("1e9", 0, 0); bytes("m", 0, 0);
    pct("30", 1, 30); pct("100", 1, 100); pct("0", 1, 0); pct("50%", 1, 50);
    pct("101", 0, 0); pct("-5", 0, 0); pct("abc", 0, 0); pct("50k", 0, 0);
    printf(fails ? "parse tests FAILED\n" : "parse tests ok\n");
    return fails != 0;
}
