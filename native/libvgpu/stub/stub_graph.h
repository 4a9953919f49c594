/* Stub driver, part 3 (included by stub_cuda.c): CUDA graph memory nodes, modelled as
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
 */
#ifndef STUB_GRAPH_H
#define STUB_GRAPH_H

#define SG_NODES 64
typedef struct { int alloc; int dev; uint64_t size, dptr; } sg_node_t;
typedef struct { int nnodes; sg_node_t nodes[SG_NODES]; } sg_graph_t;
typedef struct { uint64_t reserved, used, reserved_hi, used_hi; } sg_pool_t;
static sg_pool_t g_gpool[STUB_MAXDEV];
typedef struct { uint64_t dptr, size; int dev; } sg_live_t;
static sg_live_t g_glive[SM_MAX];
static int g_nglive;

EXPORT CUresult cuGraphCreate(void **g, unsigned int f) {
    (void)f;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    *g = calloc(1, sizeof(sg_graph_t));
    return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuGraphDestroy(void *g) { free(g); return CUDA_SUCCESS; }
EXPORT CUresult cuGraphAddMemAllocNode(void **node, void *graph, void *const *deps, size_t ndeps,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    (void)deps; (void)ndeps;
    sg_graph_t *g = graph;
    if (!node || !g || !p || !p->bytesize || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->poolProps.location.id < 0 || p->poolProps.location.id >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    if (g->nnodes >= SG_NODES) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t a = atomic_fetch_add(&g_next_addr, (p->bytesize + 511) & ~511ull);
    g->nodes[g->nnodes] = (sg_node_t){1, p->poolProps.location.id, p->bytesize, a};
    *node = &g->nodes[g->nnodes++];
    p->dptr = a;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemFreeNode(void **node, void *graph, void *const *deps, size_t ndeps, CUdeviceptr dptr) {
    (void)deps; (void)ndeps;
    sg_graph_t *g = graph;
    if (!node || !g || !dptr) return CUDA_ERROR_INVALID_VALUE;
    if (g->nnodes >= SG_NODES) return CUDA_ERROR_OUT_OF_MEMORY;
    g->nodes[g->nnodes] = (sg_node_t){0, 0, 0, dptr};
    *node = &g->nodes[g->nnodes++];
    return CUDA_SUCCESS;
}
/* an executable graph: a copy of the graph's nodes, tagged to be told from a graph */
#define SG_EXEC_MAGIC 0x67657865u
typedef struct { uint32_t magic; sg_graph_t g; } sg_exec_t;
EXPORT CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    (void)flags;
    if (!exec || !graph) return CUDA_ERROR_INVALID_VALUE;
    sg_exec_t *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = SG_EXEC_MAGIC;
    e->g = *(sg_graph_t *)graph;
    *exec = e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphInstantiate_v2(void **exec, void *graph, void **err, char *log, size_t n) {
    (void)err; (void)log; (void)n;
    return cuGraphInstantiateWithFlags(exec, graph, 0);
}
EXPORT CUresult cuGraphExecDestroy(void *exec) {
    sg_exec_t *e = exec;
    if (!e || e->magic != SG_EXEC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    e->magic = 0;
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
    for (int i = 0; i < e->g.nnodes; i++)
        if (e->g.nodes[i].alloc && glive_find(e->g.nodes[i].dptr) >= 0) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_INVALID_VALUE; /* its allocation from an earlier launch is still live */
        }
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < e->g.nnodes && !r; i++) {
        sg_node_t *n = &e->g.nodes[i];
        if (!n->alloc) { graph_free_locked(n->dptr); continue; }
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
        for (int i = 0; i < e->g.nnodes; i++) if (e->g.nodes[i].alloc) graph_free_locked(e->g.nodes[i].dptr);
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
    memset(g_gpool, 0, sizeof g_gpool);
}
#endif
