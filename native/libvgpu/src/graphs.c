/* CUDA graph memory nodes: an allocation node (cuGraphAddMemAllocNode) allocates
 * nothing when it is added; its memory is taken from the device's graph memory pool
 * when the graph runs, and the pool keeps it reserved for graphs after the graph or the
 * program frees the block, until cuDeviceGraphMemTrim. The library counts what the graph
 * pool of each device really holds (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), and before
 * a launch reserves against the limit what the executable graph's allocation nodes need
 * beyond the pool's unused memory, so a launch that would pass the limit is refused with
 * CUDA_ERROR_OUT_OF_MEMORY. What a graph's allocation nodes need is read from the graph
 * at instantiation (cuGraphGetNodes), so graphs made by stream capture or cuGraphAddNode
 * are checked too, and through child graph nodes (cuGraphChildGraphNodeGetGraph: CUDA 12.x
 * moves graphs with memory nodes into a parent) down to WALK_DEPTH levels and WALK_NODES
 * nodes in all; a graph past either bound, or whose nodes cannot be read, is refused at
 * instantiation. A driver that cannot list the nodes leaves only those added with
 * cuGraphAddMemAllocNode checked (recorded per graph, up to GMAP graphs). */
#include <stdlib.h>
#include <string.h>
#include "vgpu.h"

#define GMAP 256
#define WALK_DEPTH 16       /* child graph levels read below the instantiated graph */
#define WALK_NODES 1048576  /* nodes read, all levels together (2^20) */
#define STR_(x) #x
#define STR(x) STR_(x)
typedef struct { void *obj; uint64_t bytes[VG_MAXDEV]; } gent_t; /* bytes per CUDA ordinal */
static gent_t g_graphs[GMAP], g_execs[GMAP];
static int g_ngraphs, g_nexecs;
static uint64_t g_charged[VG_MAXDEV]; /* per CUDA ordinal, on its container device */
static uint32_t g_ords;               /* ordinals that had allocation nodes */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

#define HAVE(n) (vg_cuda_real[VGC_##n] != NULL)
#define REAL_OR_MISSING(n) do { if (UNLIKELY(!HAVE(n))) return CUDA_ERROR_NOT_FOUND; } while (0)
/* the driver lists a graph's nodes: instantiation reads them, nothing is recorded before */
#define LISTS_NODES() (HAVE(cuGraphGetNodes) && HAVE(cuGraphNodeGetType) && HAVE(cuGraphMemAllocNodeGetParams))

static gent_t *find(gent_t *t, int n, void *obj) {
    for (int i = 0; i < n; i++) if (t[i].obj == obj) return &t[i];
    return NULL;
}
static void drop(gent_t *t, int *n, void *obj) {
    gent_t *e = find(t, *n, obj);
    if (e) *e = t[--*n];
}
static uint64_t gattr(int ord, int attr, int *ok) {
    cuuint64_t v = 0;
    *ok = HAVE(cuDeviceGetGraphMemAttribute) && CU_REAL(cuDeviceGetGraphMemAttribute)(ord, attr, &v) == CUDA_SUCCESS;
    return v;
}
/* count what ordinal ord's graph pool holds now; caller holds g_mu */
static void gsync(int ord) {
    int ok;
    uint64_t held = gattr(ord, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &ok);
    if (!ok || held == g_charged[ord]) return;
    int dev = vg_dev(ord);
    if (held > g_charged[ord]) vg_charge_data(dev, held - g_charged[ord], +1);
    else vg_charge_data(dev, g_charged[ord] - held, -1);
    g_charged[ord] = held;
}
void vg_graphs_sync_all(void) {
    if (!__atomic_load_n(&g_ords, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&g_mu);
    for (int o = 0; o < VG_MAXDEV; o++) if (g_ords & (1u << o)) gsync(o);
    pthread_mutex_unlock(&g_mu);
}
void vg_graphs_fork_child(void) {
    pthread_mutex_init(&g_mu, NULL);
    g_ngraphs = g_nexecs = 0;
    g_ords = 0;
    memset(g_charged, 0, sizeof g_charged);
}

VG_EXPORT CUresult cuGraphAddMemAllocNode(void **node, void *graph, void *const *deps, size_t ndeps,
                                          CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    VG_ENTER();
    REAL_OR_MISSING(cuGraphAddMemAllocNode);
    /* read at instantiation; a graph moved into a parent (CUDA 12.x) is destroyed with it,
     * never through cuGraphDestroy, so a record of it would never go */
    if (LISTS_NODES()) return CU_REAL(cuGraphAddMemAllocNode)(node, graph, deps, ndeps, p);
    pthread_mutex_lock(&g_mu);
    int full = !find(g_graphs, g_ngraphs, graph) && g_ngraphs >= GMAP;
    pthread_mutex_unlock(&g_mu);
    if (full) { /* its launches could not be checked: refuse rather than let them pass */
        LOG_WARN("cuGraphAddMemAllocNode: more than %d graphs with allocation nodes; refused", GMAP);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = CU_REAL(cuGraphAddMemAllocNode)(node, graph, deps, ndeps, p);
    if (r != CUDA_SUCCESS || !p || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return r;
    int ord = p->poolProps.location.id;
    if (ord < 0 || ord >= VG_MAXDEV) return r;
    pthread_mutex_lock(&g_mu);
    gent_t *e = find(g_graphs, g_ngraphs, graph);
    if (!e && g_ngraphs < GMAP) { e = &g_graphs[g_ngraphs++]; memset(e, 0, sizeof *e); e->obj = graph; }
    if (e) e->bytes[ord] += p->bytesize; /* else another thread filled the table meanwhile: checked after the launch */
    __atomic_or_fetch(&g_ords, 1u << ord, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_mu);
    return r;
}
/* add to bytes (per CUDA ordinal) what the graph's allocation nodes take when it runs,
 * read from the graph itself, so nodes made any way count (cuGraphAddMemAllocNode,
 * cuGraphAddNode, stream capture of cuMemAllocAsync), and from its child graphs, depth
 * levels below the instantiated graph; *left: nodes that may still be read. 1 read,
 * 0 not (*why says why) */
static int walk(void *graph, uint64_t bytes[VG_MAXDEV], int depth, size_t *left, const char **why) {
    size_t n = 0;
    *why = "its nodes could not be read";
    if (CU_REAL(cuGraphGetNodes)(graph, NULL, &n) != CUDA_SUCCESS) return 0;
    if (n > *left) { *why = "more than " STR(WALK_NODES) " nodes"; return 0; }
    *left -= n;
    if (!n) return 1;
    void **nodes = malloc(n * sizeof *nodes); /* n <= WALK_NODES */
    size_t got = n;
    int ok = nodes && CU_REAL(cuGraphGetNodes)(graph, nodes, &got) == CUDA_SUCCESS;
    for (size_t i = 0; ok && i < got && i < n; i++) {
        int type = 0;
        void *child = NULL;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        if (CU_REAL(cuGraphNodeGetType)(nodes[i], &type) != CUDA_SUCCESS) ok = 0;
        else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
            if (depth >= WALK_DEPTH) { *why = "more than " STR(WALK_DEPTH) " levels of child graphs"; ok = 0; }
            else ok = HAVE(cuGraphChildGraphNodeGetGraph) && CU_REAL(cuGraphChildGraphNodeGetGraph)(nodes[i], &child) ==
                      CUDA_SUCCESS && child && walk(child, bytes, depth + 1, left, why);
        } else if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            memset(&p, 0, sizeof p);
            if (CU_REAL(cuGraphMemAllocNodeGetParams)(nodes[i], &p) != CUDA_SUCCESS) ok = 0;
            else if (p.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE && p.poolProps.location.id >= 0 &&
                     p.poolProps.location.id < VG_MAXDEV)
                bytes[p.poolProps.location.id] += p.bytesize;
        }
    }
    free(nodes);
    return ok;
}
/* before instantiating: what its launches will need (the graph's nodes, else what
 * cuGraphAddMemAllocNode recorded); refused when they cannot be read or an executable
 * graph with allocation nodes would find no table entry for its launch checks */
static int pre_instantiate(void *graph, uint64_t bytes[VG_MAXDEV]) {
    int any = 0;
    if (LISTS_NODES() && graph) { /* a NULL graph: the driver's own error */
        size_t left = WALK_NODES;
        const char *why = "";
        if (!walk(graph, bytes, 0, &left, &why)) {
            LOG_WARN("cuGraphInstantiate: the graph's allocation nodes cannot be checked: %s; refused", why);
            return 0;
        }
    }
    pthread_mutex_lock(&g_mu);
    gent_t *g = LISTS_NODES() ? NULL : find(g_graphs, g_ngraphs, graph);
    if (g) memcpy(bytes, g->bytes, sizeof g->bytes);
    for (int o = 0; o < VG_MAXDEV; o++) any |= bytes[o] != 0;
    int ok = !any || g_nexecs < GMAP;
    pthread_mutex_unlock(&g_mu);
    if (!ok) LOG_WARN("cuGraphInstantiate: more than %d executable graphs with allocation nodes; refused", GMAP);
    return ok;
}
static void instantiated(void *exec, const uint64_t bytes[VG_MAXDEV]) {
    pthread_mutex_lock(&g_mu);
    drop(g_execs, &g_nexecs, exec);
    uint32_t ords = 0;
    for (int o = 0; o < VG_MAXDEV; o++) if (bytes[o]) ords |= 1u << o;
    if (ords && g_nexecs < GMAP) {
        g_execs[g_nexecs].obj = exec;
        memcpy(g_execs[g_nexecs++].bytes, bytes, sizeof g_execs[0].bytes);
        __atomic_or_fetch(&g_ords, ords, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&g_mu);
}
#define INSTANTIATE(call)                                                   \
    do {                                                                    \
        uint64_t b_[VG_MAXDEV] = {0};                                       \
        if (!pre_instantiate(graph, b_)) return CUDA_ERROR_OUT_OF_MEMORY;   \
        CUresult r_ = call;                                                 \
        if (r_ == CUDA_SUCCESS && exec) instantiated(*exec, b_);            \
        return r_;                                                          \
    } while (0)
VG_EXPORT CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    VG_ENTER();
    REAL_OR_MISSING(cuGraphInstantiateWithFlags);
    INSTANTIATE(CU_REAL(cuGraphInstantiateWithFlags)(exec, graph, flags));
}
VG_EXPORT CUresult cuGraphInstantiate_v2(void **exec, void *graph, void **err, char *log, size_t n) {
    VG_ENTER();
    REAL_OR_MISSING(cuGraphInstantiate_v2);
    INSTANTIATE(CU_REAL(cuGraphInstantiate_v2)(exec, graph, err, log, n));
}
VG_EXPORT CUresult cuGraphInstantiateWithParams(void **exec, void *graph, void *params) {
    VG_ENTER();
    REAL_OR_MISSING(cuGraphInstantiateWithParams);
    INSTANTIATE(CU_REAL(cuGraphInstantiateWithParams)(exec, graph, params));
}
VG_EXPORT CUresult cuGraphExecDestroy(void *exec) {
    VG_ENTER();
    REAL_OR_MISSING(cuGraphExecDestroy);
    CUresult r = CU_REAL(cuGraphExecDestroy)(exec);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        drop(g_execs, &g_nexecs, exec);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}
VG_EXPORT CUresult cuGraphDestroy(void *graph) {
    VG_ENTER();
    REAL_OR_MISSING(cuGraphDestroy);
    CUresult r = CU_REAL(cuGraphDestroy)(graph);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        drop(g_graphs, &g_ngraphs, graph);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}
VG_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    VG_ENTER();
    REAL_OR_MISSING(cuDeviceGraphMemTrim);
    CUresult r = CU_REAL(cuDeviceGraphMemTrim)(dev);
    if (dev >= 0 && dev < VG_MAXDEV) {
        pthread_mutex_lock(&g_mu);
        gsync(dev);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

/* cuGraphLaunch(_ptsz) after the launch gate (launch.c) */
CUresult vg_graph_launch(void *exec, CUstream s, int ptsz) {
    CUresult (*fn)(void *, CUstream) = ptsz ? CU_REAL(cuGraphLaunch_ptsz) : CU_REAL(cuGraphLaunch);
    if (!__atomic_load_n(&g_ords, __ATOMIC_RELAXED)) return fn(exec, s);
    pthread_mutex_lock(&g_mu);
    gent_t *e = find(g_execs, g_nexecs, exec);
    uint64_t need[VG_MAXDEV] = {0};
    for (int o = 0; e && o < VG_MAXDEV; o++) {
        if (!e->bytes[o]) continue;
        gsync(o);
        int ok1, ok2;
        uint64_t res = gattr(o, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &ok1);
        uint64_t used = gattr(o, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &ok2);
        uint64_t spare = ok1 && ok2 && res > used ? res - used : 0;
        need[o] = e->bytes[o] > spare ? e->bytes[o] - spare : 0;
        int dev = vg_dev(o);
        if (need[o] && vg_reserve(dev, need[o], VG_CAT_DATA) != 0) {
            LOG_WARN("cuGraphLaunch: the graph's allocations need %llu more bytes on device %d, over the limit "
                     "%llu (in use %llu)", (unsigned long long)need[o], dev, (unsigned long long)vg_limit[dev],
                     (unsigned long long)vg_usage(dev));
            for (int k = 0; k < o; k++) if (need[k]) vg_unreserve(vg_dev(k), need[k], VG_CAT_DATA);
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    CUresult r = fn(exec, s);
    for (int o = 0; o < VG_MAXDEV; o++) if (need[o]) vg_unreserve(vg_dev(o), need[o], VG_CAT_DATA);
    for (int o = 0; o < VG_MAXDEV; o++) if (g_ords & (1u << o)) gsync(o);
    pthread_mutex_unlock(&g_mu);
    return r;
}
