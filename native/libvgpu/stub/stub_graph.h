/* Stub driver, part 4 (included by stub_cuda.c): CUDA graph memory nodes, modelled as
 * the CUDA driver API reference describes them.
 *
 * cuGraphAddMemAllocNode fixes the allocation's address at node creation and allocates
 * nothing; the memory is allocated when the graph runs, from the device's graph memory
 * pool, which reserves device memory as launches need it. A free node of the same graph
 * (cuGraphAddMemFreeNode), or cuMemFreeAsync / cuMemFree after the launch, gives the
 * block back to that pool, where it stays reserved for graphs; cuDeviceGraphMemTrim
 * gives the unused reserved memory back to the device. cuDeviceGetGraphMemAttribute
 * reports USED / RESERVED (current and high). A graph whose allocation from an earlier
 * launch is still live cannot be launched again (CUDA_ERROR_INVALID_VALUE).
 * Instantiation copies the graph's memory nodes; destroying a graph or an executable
 * graph leaves live allocations live. (Launches run to completion at once.)
 * Graphs and their nodes, child graph nodes included: stub_gnodes.h.
 *
 * Stream capture: cuStreamCreate gives a stream; between cuStreamBeginCapture(_v2) and
 * cuStreamEndCapture, cuMemAllocAsync / cuMemAllocFromPoolAsync on that stream add an
 * allocation node to the captured graph (with its address; nothing is allocated) and
 * cuMemFreeAsync a free node; cuStreamEndCapture returns the graph. The legacy NULL
 * stream cannot be captured (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
 */
#ifndef STUB_GRAPH_H
#define STUB_GRAPH_H

#include "stub_gnodes.h"

typedef struct { uint64_t reserved, used, reserved_hi, used_hi; } sg_pool_t;
static sg_pool_t g_gpool[STUB_MAXDEV];
typedef struct { uint64_t dptr, size; int dev; } sg_live_t;
static sg_live_t g_glive[SM_MAX];
static int g_nglive;

/* ------------------------------------------------------------- stream capture */
#define SG_STREAMS 64
static char g_streams[SG_STREAMS];                 /* stream i is &g_streams[i] */
static sg_graph_t *g_capturing[SG_STREAMS];
static int stream_index(CUstream s) {
    char *c = (char *)s;
    return c >= g_streams && c < g_streams + SG_STREAMS ? (int)(c - g_streams) : -1;
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    int i = 0;
    while (i < SG_STREAMS && g_streams[i]) i++;
    if (i < SG_STREAMS) g_streams[i] = 1;
    pthread_mutex_unlock(&g_mu);
    if (i == SG_STREAMS) return CUDA_ERROR_OUT_OF_MEMORY;
    *s = (CUstream)(void *)&g_streams[i];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    int i = stream_index(s);
    if (i < 0 || !g_streams[i]) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    g_streams[i] = 0;
    sg_free(g_capturing[i]);
    g_capturing[i] = NULL;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    (void)mode;
    int i = stream_index(s);
    if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (i < 0 || !g_streams[i]) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = g_capturing[i] ? CUDA_ERROR_ILLEGAL_STATE : CUDA_SUCCESS;
    if (!r && !(g_capturing[i] = calloc(1, sizeof(sg_graph_t)))) r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuStreamBeginCapture(CUstream s) { return cuStreamBeginCapture_v2(s, 0); }
EXPORT CUresult cuStreamEndCapture(CUstream s, void **graph) {
    int i = stream_index(s);
    if (!graph || i < 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    *graph = g_capturing[i];
    g_capturing[i] = NULL;
    pthread_mutex_unlock(&g_mu);
    return *graph ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    int i = stream_index(s);
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    *status = i >= 0 && g_capturing[i] ? 1 : 0; /* CU_STREAM_CAPTURE_STATUS_ACTIVE */
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
static int capture_alloc(CUresult *r, CUdeviceptr *p, size_t n, int dev, CUstream s) {
    int i = stream_index(s);
    if (i < 0) return 0;
    pthread_mutex_lock(&g_mu);
    sg_graph_t *g = g_capturing[i];
    pthread_mutex_unlock(&g_mu);
    if (!g) return 0;
    void *node;
    CUDA_MEM_ALLOC_NODE_PARAMS prm;
    memset(&prm, 0, sizeof prm);
    prm.poolProps.allocType = 1;
    prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prm.poolProps.location.id = dev;
    prm.bytesize = n;
    *r = p ? cuGraphAddMemAllocNode(&node, g, NULL, 0, &prm) : CUDA_ERROR_INVALID_VALUE;
    if (!*r) *p = prm.dptr;
    return 1;
}
static int capture_free(CUdeviceptr p, CUstream s) {
    int i = stream_index(s);
    if (i < 0) return 0;
    pthread_mutex_lock(&g_mu);
    sg_graph_t *g = g_capturing[i];
    pthread_mutex_unlock(&g_mu);
    void *node;
    return g && cuGraphAddMemFreeNode(&node, g, NULL, 0, p) == CUDA_SUCCESS;
}

/* an executable graph: a copy of the memory nodes of the graph and its child graphs, in
 * the order a launch runs them, tagged to be told from a graph */
#define SG_EXEC_MAGIC 0x67657865u
typedef struct { uint32_t magic; size_t n, cap; sg_node_t *mem; } sg_exec_t;
static int sg_flatten(const sg_graph_t *g, sg_exec_t *e) {
    for (size_t i = 0; i < g->n; i++) {
        const sg_node_t *n = g->nodes[i];
        if (n->child && !sg_flatten(n->child, e)) return 0;
        if (n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC && n->type != CU_GRAPH_NODE_TYPE_MEM_FREE) continue;
        if (e->n == e->cap) {
            size_t c = e->cap ? 2 * e->cap : 8;
            sg_node_t *m = realloc(e->mem, c * sizeof *m);
            if (!m) return 0;
            e->mem = m;
            e->cap = c;
        }
        e->mem[e->n++] = *n;
    }
    return 1;
}
EXPORT CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    (void)flags;
    if (!exec || !graph || ((sg_graph_t *)graph)->parent) return CUDA_ERROR_INVALID_VALUE;
    sg_exec_t *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!sg_flatten(graph, e)) { free(e->mem); free(e); return CUDA_ERROR_OUT_OF_MEMORY; }
    e->magic = SG_EXEC_MAGIC;
    *exec = e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphInstantiate_v2(void **exec, void *graph, void **err, char *log, size_t n) {
    (void)err; (void)log; (void)n;
    return cuGraphInstantiateWithFlags(exec, graph, 0);
}
EXPORT CUresult cuGraphInstantiateWithParams(void **exec, void *graph, void *params) {
    (void)params;
    return cuGraphInstantiateWithFlags(exec, graph, 0);
}
EXPORT CUresult cuGraphExecDestroy(void *exec) {
    sg_exec_t *e = exec;
    if (!e || e->magic != SG_EXEC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    e->magic = 0;
    free(e->mem);
    free(e);
    return CUDA_SUCCESS;
}
static int glive_find(uint64_t dptr) {
    for (int i = 0; i < g_nglive; i++) if (g_glive[i].dptr == dptr) return i;
    return -1;
}
/* give a graph allocation back to the graph pool; 1 if dptr was one; caller holds g_mu */
static int graph_free_locked(uint64_t dptr) {
    int i = glive_find(dptr);
    if (i < 0) return 0;
    g_gpool[st_cphys(g_glive[i].dev)].used -= g_glive[i].size;
    g_glive[i] = g_glive[--g_nglive];
    return 1;
}
static int graph_free(uint64_t dptr) {
    pthread_mutex_lock(&g_mu);
    int r = graph_free_locked(dptr);
    pthread_mutex_unlock(&g_mu);
    return r;
}
static CUresult graph_run(sg_exec_t *e) {
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < e->n; i++)
        if (e->mem[i].type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && glive_find(e->mem[i].dptr) >= 0) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_INVALID_VALUE; /* its allocation from an earlier launch is still live */
        }
    CUresult r = CUDA_SUCCESS;
    for (size_t i = 0; i < e->n && !r; i++) {
        sg_node_t *n = &e->mem[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) { graph_free_locked(n->dptr); continue; }
        sg_pool_t *p = &g_gpool[st_cphys(n->dev)];
        uint64_t spare = p->reserved - p->used;
        if (spare < n->size) {
            r = charge(n->dev, n->size - spare);
            if (r) break;
            p->reserved += n->size - spare;
        }
        if (g_nglive >= SM_MAX) { r = CUDA_ERROR_OUT_OF_MEMORY; break; }
        p->used += n->size;
        if (p->used > p->used_hi) p->used_hi = p->used;
        if (p->reserved > p->reserved_hi) p->reserved_hi = p->reserved;
        g_glive[g_nglive++] = (sg_live_t){n->dptr, n->size, n->dev};
    }
    if (r) /* a failed launch allocates nothing */
        for (size_t i = 0; i < e->n; i++)
            if (e->mem[i].type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) graph_free_locked(e->mem[i].dptr);
    pthread_mutex_unlock(&g_mu);
    return r;
}
EXPORT CUresult cuGraphLaunch(void *exec, CUstream s) {
    (void)s;
    sg_exec_t *e = exec;
    if (e && e->magic == SG_EXEC_MAGIC) {
        CUresult r = graph_run(e);
        if (r) return r;
    }
    return launch(1);
}
EXPORT CUresult cuGraphLaunch_ptsz(void *exec, CUstream s) { return cuGraphLaunch(exec, s); }
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    sg_pool_t *p = &g_gpool[st_cphys(dev)];
    if (p->reserved > p->used) { uncharge(dev, p->reserved - p->used); p->reserved = p->used; }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    sg_pool_t *p = &g_gpool[st_cphys(dev)];
    cuuint64_t v = attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT ? p->used
                 : attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH ? p->used_hi
                 : attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT ? p->reserved : p->reserved_hi;
    pthread_mutex_unlock(&g_mu);
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}
static void stub_graph_fork_child(void) {
    g_nglive = 0;
    memset(g_streams, 0, sizeof g_streams);
    memset(g_capturing, 0, sizeof g_capturing);
    memset(g_gpool, 0, sizeof g_gpool);
}
#endif
