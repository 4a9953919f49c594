/* Stub driver, graphs and their nodes (included by stub_graph.h), modelled as the CUDA
 * driver API reference describes them.
 *
 * Nodes can be listed (cuGraphGetNodes, cuGraphNodeGetType: CU_GRAPH_NODE_TYPE_GRAPH 4,
 * EMPTY 5, MEM_ALLOC 10, MEM_FREE 11) and an allocation node's parameters read
 * (cuGraphMemAllocNodeGetParams). cuGraphInstantiateWithParams instantiates like
 * cuGraphInstantiateWithFlags.
 *
 * Child graph nodes: cuGraphAddChildGraphNode clones the child graph into the node and
 * fails (CUDA_ERROR_INVALID_VALUE) when the child holds allocation or free nodes (at any
 * depth). cuGraphAddNode (CUDA 12.x) adds empty, allocation and child graph nodes; a child
 * graph node with ownership CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE takes the child graph
 * itself, memory nodes included: the parent owns it and destroys it with itself, and it
 * can no longer be instantiated, destroyed, added to another parent or given memory
 * nodes. cuGraphChildGraphNodeGetGraph returns the node's graph without cloning it (nodes
 * added to it are part of the parent; allocation and free nodes cannot be). A graph
 * cannot be moved into itself or into one of its own child graphs. Instantiation copies
 * the memory nodes of every level; a launch runs them in order, child graphs in place.
 */
#ifndef STUB_GNODES_H
#define STUB_GNODES_H

typedef struct sg_graph sg_graph_t;
typedef struct { int type, dev; uint64_t size, dptr; sg_graph_t *child; } sg_node_t;
struct sg_graph {
    size_t n, cap;
    sg_node_t **nodes;   /* each node allocated alone: its handle stays valid */
    sg_graph_t *parent;  /* the graph holding the child node that owns this one; NULL: its own handle */
};

static sg_node_t *sg_add(sg_graph_t *g, int type) {
    if (g->n == g->cap) {
        size_t c = g->cap ? 2 * g->cap : 16;
        sg_node_t **p = realloc(g->nodes, c * sizeof *p);
        if (!p) return NULL;
        g->nodes = p;
        g->cap = c;
    }
    sg_node_t *n = calloc(1, sizeof *n);
    if (n) { n->type = type; g->nodes[g->n++] = n; }
    return n;
}
static void sg_free(sg_graph_t *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n; i++) { sg_free(g->nodes[i]->child); free(g->nodes[i]); }
    free(g->nodes);
    free(g);
}
static int sg_has_mem(const sg_graph_t *g) {
    for (size_t i = 0; i < g->n; i++)
        if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_FREE ||
            (g->nodes[i]->child && sg_has_mem(g->nodes[i]->child)))
            return 1;
    return 0;
}
static sg_graph_t *sg_clone(const sg_graph_t *g) {
    sg_graph_t *c = calloc(1, sizeof *c);
    for (size_t i = 0; c && i < g->n; i++) {
        sg_node_t *n = sg_add(c, g->nodes[i]->type);
        if (n) *n = *g->nodes[i];
        if (n && n->child && (n->child = sg_clone(n->child))) n->child->parent = c;
        if (!n || (g->nodes[i]->child && !n->child)) { if (n) n->child = NULL; sg_free(c); c = NULL; }
    }
    return c;
}

EXPORT CUresult cuGraphCreate(void **g, unsigned int f) {
    (void)f;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    *g = calloc(1, sizeof(sg_graph_t));
    return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuGraphDestroy(void *g) {
    if (g && ((sg_graph_t *)g)->parent) return CUDA_ERROR_INVALID_VALUE; /* owned by a child graph node */
    sg_free(g);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemAllocNode(void **node, void *graph, void *const *deps, size_t ndeps,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    (void)deps; (void)ndeps;
    sg_graph_t *g = graph;
    if (!node || !g || g->parent || !p || !p->bytesize || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->poolProps.location.id < 0 || p->poolProps.location.id >= st_ncvis()) return CUDA_ERROR_INVALID_DEVICE;
    sg_node_t *n = sg_add(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t a = atomic_fetch_add(&g_next_addr, (p->bytesize + 511) & ~511ull);
    n->dev = p->poolProps.location.id;
    n->size = p->bytesize;
    n->dptr = p->dptr = a;
    *node = n;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemFreeNode(void **node, void *graph, void *const *deps, size_t ndeps, CUdeviceptr dptr) {
    (void)deps; (void)ndeps;
    sg_graph_t *g = graph;
    if (!node || !g || g->parent || !dptr) return CUDA_ERROR_INVALID_VALUE;
    sg_node_t *n = sg_add(g, CU_GRAPH_NODE_TYPE_MEM_FREE);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->dptr = dptr;
    *node = n;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddEmptyNode(void **node, void *graph, void *const *deps, size_t ndeps) {
    (void)deps; (void)ndeps;
    if (!node || !graph) return CUDA_ERROR_INVALID_VALUE;
    return (*node = sg_add(graph, CU_GRAPH_NODE_TYPE_EMPTY)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
/* a child graph node of graph holding child (moved: child itself, else a clone) */
static CUresult sg_add_child(void **node, sg_graph_t *g, sg_graph_t *child, int move) {
    if (!node || !g || !child || child->parent) return CUDA_ERROR_INVALID_VALUE;
    if (!move && sg_has_mem(child)) return CUDA_ERROR_INVALID_VALUE;
    if (move && g->parent && sg_has_mem(child)) return CUDA_ERROR_INVALID_VALUE; /* no memory nodes into a child graph */
    for (sg_graph_t *a = g; a; a = a->parent) if (a == child) return CUDA_ERROR_INVALID_VALUE;
    sg_graph_t *c = move ? child : sg_clone(child);
    sg_node_t *n = c ? sg_add(g, CU_GRAPH_NODE_TYPE_GRAPH) : NULL;
    if (!n) { if (!move) sg_free(c); return CUDA_ERROR_OUT_OF_MEMORY; }
    n->child = c;
    c->parent = g;
    *node = n;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddChildGraphNode(void **node, void *graph, void *const *deps, size_t ndeps, void *child) {
    (void)deps; (void)ndeps;
    return sg_add_child(node, graph, child, 0);
}
EXPORT CUresult cuGraphAddNode(void **node, void *graph, void *const *deps, size_t ndeps, CUgraphNodeParams *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_EMPTY: return cuGraphAddEmptyNode(node, graph, deps, ndeps);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return cuGraphAddMemAllocNode(node, graph, deps, ndeps, &p->alloc);
    case CU_GRAPH_NODE_TYPE_GRAPH:
        if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE &&
            p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)
            return CUDA_ERROR_INVALID_VALUE;
        return sg_add_child(node, graph, p->graph.graph, p->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE);
    default: return CUDA_ERROR_INVALID_VALUE; /* not modelled */
    }
}
EXPORT CUresult cuGraphChildGraphNodeGetGraph(void *node, void **graph) {
    sg_node_t *n = node;
    if (!n || !graph || n->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *graph = n->child;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *num) {
    sg_graph_t *g = graph;
    if (!g || !num) return CUDA_ERROR_INVALID_VALUE;
    if (nodes) {
        size_t n = *num < g->n ? *num : g->n;
        for (size_t i = 0; i < n; i++) nodes[i] = g->nodes[i];
    }
    *num = g->n;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphNodeGetType(void *node, int *type) {
    if (!node || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = ((sg_node_t *)node)->type;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphMemAllocNodeGetParams(void *node, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    sg_node_t *n = node;
    if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->poolProps.allocType = 1;
    p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->poolProps.location.id = n->dev;
    p->bytesize = n->size;
    p->dptr = n->dptr;
    return CUDA_SUCCESS;
}

#endif
