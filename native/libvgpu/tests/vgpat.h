/* vgtest commands for the allocation patterns of real frameworks (included by vgtest.c):
 *   sync                 cuCtxSynchronize
 *   esync                cuEventSynchronize (of a completed event)
 *   pool                 print "pool RESERVED USED" of the current device's pool
 *   poolset BYTES        cuMemPoolSetAttribute(RELEASE_THRESHOLD) on that pool
 *   pooltrim BYTES       cuMemPoolTrimTo(pool, BYTES)
 *   poolmk / pooldestroy cuMemPoolCreate on the current device (allocation kind "cpool") /
 *                        cuMemPoolDestroy of it
 *   vmap                 reserve address space for the newest (vmm) object and map it
 *   vrelease             cuMemRelease the newest object's handle, keep its mapping
 *   vunmap               unmap the newest object (and free its address space); a
 *                        released one leaves the stack
 *   vexport              print "fd PID FD" (cuMemExportToShareableHandle, POSIX fd)
 *   vimport PID FD BYTES RC  cuMemImportFromShareableHandle of process PID's descriptor FD,
 *                        taken with pidfd_getfd (the same open file, as SCM_RIGHTS passes it;
 *                        kind vmm, BYTES its size for vmap)
 *   vimportfd FD BYTES RC  the same of this process's descriptor FD (inherited from the test)
 *   vimportproc PID FD BYTES RC  the same through open(/proc/PID/fd/FD): a new open file of
 *                        the stub's descriptor, which libvgpu cannot link to its creator
 *   reexec SCRIPT...     execv vgtest SCRIPT... in this process (same PID; no exit handler
 *                        runs, as with any exec)
 *   wait                 read one line from stdin (the test says when to go on)
 *   vexportfab           print "fab HEX" (cuMemExportToShareableHandle, fabric handle)
 *   vimportfab HEX BYTES RC  cuMemImportFromShareableHandle of that fabric handle (kind vmm)
 *   vprop                print "vprop TYPE ID" (cuMemGetAllocationPropertiesFromHandle location)
 *   ipcget               print "ipc HEX" (cuIpcGetMemHandle of the newest object)
 *   ipcopen HEX RC       cuIpcOpenMemHandle, kept as kind "ipc" (freed by cuIpcCloseMemHandle)
 *   memfree RC           cuMemFree the newest object's address, expect RC; popped on success
 *   phys N               print "phys N BYTES": what the stub's device N really holds
 *   graph BYTES FREE     a graph with one allocation node of BYTES on the current device
 *                        (FREE 1: and a free node of it), instantiated; kept as kind "gexec"
 *                        (freed by cuGraphExecDestroy), its allocation's address as va
 *   capture BYTES FREE   the same graph made by stream capture: cuMemAllocAsync of BYTES
 *                        (FREE 1: and cuMemFreeAsync) on a capturing stream, then
 *                        cuGraphInstantiateWithParams (nothing names the allocation to the
 *                        library but the graph itself)
 *   glaunch RC           cuGraphLaunch the newest graph, expect RC
 *   gfree                cuMemFreeAsync the newest graph's allocation
 *   gtree BYTES DEPTH WIDTH MODE RC  a graph WIDTH empty nodes and (BYTES > 0) one
 *                        allocation node of BYTES (cuGraphAddMemAllocNode) wide, put DEPTH
 *                        child graph levels down: each level is a new graph with one child
 *                        graph node holding the one below, by MODE "move" (cuGraphAddNode,
 *                        ownership MOVE) or "clone" (cuGraphAddChildGraphNode); the top is
 *                        instantiated, expecting RC; prints "gtree RC" (0: kept as
 *                        "gexec", as for graph). MODE "hold": moved, and the top graph is
 *                        neither instantiated nor destroyed (it lives until the exit)
 *   gchildrules          check the stub's child graph rules (clone refuses memory nodes,
 *                        a moved graph is the parent's), print "gchildrules ok"
 *   gtrim                cuDeviceGraphMemTrim of the current device
 *   gmem                 print "gmem RESERVED USED" (cuDeviceGetGraphMemAttribute)
 */
#include <fcntl.h>
#include <sys/syscall.h>

unsigned long long stubDeviceUsed(int dev); /* stub test helper */

static CUmemoryPool cur_pool(void) {
    CUdevice d = 0;
    CUmemoryPool p = NULL;
    cuCtxGetDevice(&d);
    if (cuDeviceGetMemPool(&p, d)) die("cuDeviceGetMemPool", 0, 0);
    return p;
}
static obj_t *top(void) {
    if (!nobj) die("no object", 0, 0);
    return &objs[nobj - 1];
}
/* a new object of KIND on top of the stack, all else zero */
static obj_t *push(const char *kind) {
    obj_t *o = &objs[nobj++];
    memset(o, 0, sizeof *o);
    snprintf(o->kind, sizeof o->kind, "%s", kind);
    return o;
}
/* print an import's result R, die unless it is WANT, keep the handle H (SIZE bytes) */
static void imported(CUresult r, int want, CUmemGenericAllocationHandle h, uint64_t size) {
    printf("import -> %d\n", r);
    if (r != want) die("import result", r, want);
    if (!r) {
        obj_t *o = push("vmm");
        o->h = h;
        o->size = size;
    }
}
/* the bytes of HEX (two hex digits each) into OUT, at most N of them */
static void unhex(const char *hex, unsigned char *out, size_t n) {
    for (size_t k = 0; k < n && hex[2 * k] && hex[2 * k + 1]; k++) {
        unsigned v;
        sscanf(hex + 2 * k, "%2x", &v);
        out[k] = (unsigned char)v;
    }
}

/* 1 when argv[*i] was one of these commands */
static int pat_cmd(int argc, char **argv, int *i) {
    const char *c = argv[*i];
    CUresult r;
    (void)argc;
    if (!strcmp(c, "sync")) {
        if ((r = cuCtxSynchronize())) die("cuCtxSynchronize", r, 0);
    } else if (!strcmp(c, "esync")) {
        if ((r = cuEventSynchronize(NULL))) die("cuEventSynchronize", r, 0);
    } else if (!strcmp(c, "pool")) {
        cuuint64_t res = 0, used = 0;
        CUmemoryPool p = cur_pool();
        if (cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res) ||
            cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used))
            die("cuMemPoolGetAttribute", 0, 0);
        printf("pool %llu %llu\n", res, used);
    } else if (!strcmp(c, "poolset")) {
        cuuint64_t v = strtoull(argv[++*i], NULL, 0);
        if ((r = cuMemPoolSetAttribute(cur_pool(), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v))) die("poolset", r, 0);
    } else if (!strcmp(c, "poolmk")) {
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = 1;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUdevice d = 0;
        cuCtxGetDevice(&d);
        pp.location.id = d;
        if ((r = cuMemPoolCreate(&g_cpool, &pp))) die("cuMemPoolCreate", r, 0);
    } else if (!strcmp(c, "pooldestroy")) {
        if ((r = cuMemPoolDestroy(g_cpool))) die("cuMemPoolDestroy", r, 0);
    } else if (!strcmp(c, "pooltrim")) {
        if ((r = cuMemPoolTrimTo(cur_pool(), strtoull(argv[++*i], NULL, 0)))) die("pooltrim", r, 0);
    } else if (!strcmp(c, "vmap")) {
        obj_t *o = top();
        CUdeviceptr va = 0;
        if ((r = cuMemAddressReserve(&va, o->size, 0, 0, 0))) die("cuMemAddressReserve", r, 0);
        o->va = va;
        if ((r = cuMemMap(o->va, o->size, 0, o->h, 0))) die("cuMemMap", r, 0);
    } else if (!strcmp(c, "vrelease")) {
        obj_t *o = top();
        if ((r = cuMemRelease(o->h))) die("cuMemRelease", r, 0);
        o->h = 0;
    } else if (!strcmp(c, "vunmap")) {
        obj_t *o = top();
        if ((r = cuMemUnmap(o->va, o->size))) die("cuMemUnmap", r, 0);
        if ((r = cuMemAddressFree(o->va, o->size))) die("cuMemAddressFree", r, 0);
        o->va = 0;
        if (!o->h) nobj--;
    } else if (!strcmp(c, "vexport")) {
        int fd = -1;
        if ((r = cuMemExportToShareableHandle(&fd, top()->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)))
            die("cuMemExportToShareableHandle", r, 0);
        printf("fd %d %d\n", (int)getpid(), fd);
    } else if (!strcmp(c, "vimport") || !strcmp(c, "vimportproc") || !strcmp(c, "vimportfd")) {
        char path[64];
        int byfd = !strcmp(c, "vimportfd");
        if (byfd) (*i)--; /* no PID */
        snprintf(path, sizeof path, "/proc/%s/fd/%s", argv[*i + 1], argv[*i + 2]);
        int pid = atoi(argv[*i + 1]), theirs = atoi(argv[*i + 2]);
        uint64_t size = strtoull(argv[*i + 3], NULL, 0);
        int want = atoi(argv[*i + 4]);
        *i += 4;
        int fd = -1;
        if (byfd) {
            fd = theirs;
        } else if (!strcmp(c, "vimportproc")) {
            fd = open(path, O_RDONLY | O_CLOEXEC);
        } else {
            int pfd = (int)syscall(434 /* pidfd_open */, pid, 0);
            if (pfd >= 0) fd = (int)syscall(438 /* pidfd_getfd */, pfd, theirs, 0);
            if (pfd >= 0) close(pfd);
        }
        if (fd < 0) die("take the exported fd", 0, 0);
        CUmemGenericAllocationHandle h = 0;
        r = cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        imported(r, want, h, size);
    } else if (!strcmp(c, "vexportfab")) {
        CUmemFabricHandle fh;
        if ((r = cuMemExportToShareableHandle(&fh, top()->h, CU_MEM_HANDLE_TYPE_FABRIC, 0)))
            die("cuMemExportToShareableHandle (fabric)", r, 0);
        printf("fab ");
        for (size_t k = 0; k < sizeof fh.data; k++) printf("%02x", fh.data[k]);
        printf("\n");
    } else if (!strcmp(c, "vimportfab")) {
        const char *hex = argv[++*i];
        uint64_t size = strtoull(argv[++*i], NULL, 0);
        int want = atoi(argv[++*i]);
        CUmemFabricHandle fh;
        memset(&fh, 0, sizeof fh);
        unhex(hex, fh.data, sizeof fh.data);
        CUmemGenericAllocationHandle h = 0;
        r = cuMemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
        imported(r, want, h, size);
    } else if (!strcmp(c, "reexec")) {
        char **av = calloc((size_t)(argc - *i) + 1, sizeof *av);
        if (!av) die("calloc", 0, 0);
        av[0] = (char *)"vgtest";
        for (int k = *i + 1; k < argc; k++) av[k - *i] = argv[k];
        fflush(stdout);
        execv("/proc/self/exe", av);
        die("execv", 0, 0);
    } else if (!strcmp(c, "wait")) {
        char line[64];
        if (!fgets(line, sizeof line, stdin)) die("wait: stdin closed", 0, 0);
    } else if (!strcmp(c, "vprop")) {
        CUmemAllocationProp p;
        if ((r = cuMemGetAllocationPropertiesFromHandle(&p, top()->h))) die("cuMemGetAllocationPropertiesFromHandle", r, 0);
        printf("vprop %d %d\n", p.location.type, p.location.id);
    } else if (!strcmp(c, "ipcget")) {
        CUipcMemHandle h;
        if ((r = cuIpcGetMemHandle(&h, top()->h))) die("cuIpcGetMemHandle", r, 0);
        printf("ipc ");
        for (size_t k = 0; k < sizeof h.reserved; k++) printf("%02x", (unsigned char)h.reserved[k]);
        printf("\n");
    } else if (!strcmp(c, "ipcopen")) {
        const char *hex = argv[++*i];
        int want = atoi(argv[++*i]);
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        unhex(hex, (unsigned char *)h.reserved, sizeof h.reserved);
        CUdeviceptr p = 0;
        r = cuIpcOpenMemHandle_v2(&p, h, 1);
        printf("ipcopen -> %d\n", r);
        if (r != want) die("ipcopen result", r, want);
        if (!r) push("ipc")->h = p;
    } else if (!strcmp(c, "phys")) {
        int d = atoi(argv[++*i]);
        printf("phys %d %llu\n", d, stubDeviceUsed(d));
    } else if (!strcmp(c, "graph")) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        int with_free = atoi(argv[++*i]);
        CUdevice d = 0;
        cuCtxGetDevice(&d);
        void *g = NULL, *node = NULL, *fnode = NULL, *exec = NULL;
        CUDA_MEM_ALLOC_NODE_PARAMS prm;
        memset(&prm, 0, sizeof prm);
        prm.poolProps.allocType = 1;
        prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prm.poolProps.location.id = d;
        prm.bytesize = n;
        if ((r = cuGraphCreate(&g, 0))) die("cuGraphCreate", r, 0);
        if ((r = cuGraphAddMemAllocNode(&node, g, NULL, 0, &prm))) die("cuGraphAddMemAllocNode", r, 0);
        if (with_free && (r = cuGraphAddMemFreeNode(&fnode, g, &node, 1, prm.dptr))) die("cuGraphAddMemFreeNode", r, 0);
        if ((r = cuGraphInstantiateWithFlags(&exec, g, 0))) die("cuGraphInstantiate", r, 0);
        if ((r = cuGraphDestroy(g))) die("cuGraphDestroy", r, 0);
        obj_t *o = push("gexec");
        o->h = (uint64_t)(uintptr_t)exec;
        o->va = prm.dptr;
        o->size = n;
    } else if (!strcmp(c, "capture")) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        int with_free = atoi(argv[++*i]);
        CUstream st = NULL;
        void *g = NULL, *exec = NULL;
        CUdeviceptr p = 0;
        if ((r = cuStreamCreate(&st, 0))) die("cuStreamCreate", r, 0);
        if ((r = cuStreamBeginCapture_v2(st, 0))) die("cuStreamBeginCapture", r, 0);
        if ((r = cuMemAllocAsync(&p, n, st))) die("cuMemAllocAsync (capturing)", r, 0);
        if (with_free && (r = cuMemFreeAsync(p, st))) die("cuMemFreeAsync (capturing)", r, 0);
        if ((r = cuStreamEndCapture(st, &g))) die("cuStreamEndCapture", r, 0);
        if ((r = cuGraphInstantiateWithParams(&exec, g, NULL))) die("cuGraphInstantiateWithParams", r, 0);
        if ((r = cuGraphDestroy(g))) die("cuGraphDestroy", r, 0);
        if ((r = cuStreamDestroy_v2(st))) die("cuStreamDestroy", r, 0);
        obj_t *o = push("gexec");
        o->h = (uint64_t)(uintptr_t)exec;
        o->va = p;
        o->size = n;
    } else if (!strcmp(c, "gtree")) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        int depth = atoi(argv[++*i]);
        size_t width = strtoull(argv[++*i], NULL, 0);
        const char *mode = argv[++*i];
        int hold = !strcmp(mode, "hold"), move = hold || !strcmp(mode, "move"), want = atoi(argv[++*i]);
        void *g = NULL, *node = NULL, *exec = NULL;
        CUDA_MEM_ALLOC_NODE_PARAMS prm;
        memset(&prm, 0, sizeof prm);
        prm.poolProps.allocType = 1;
        prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        cuCtxGetDevice(&prm.poolProps.location.id);
        prm.bytesize = n;
        if ((r = cuGraphCreate(&g, 0))) die("cuGraphCreate", r, 0);
        for (size_t k = 0; k < width; k++)
            if ((r = cuGraphAddEmptyNode(&node, g, NULL, 0))) die("cuGraphAddEmptyNode", r, 0);
        if (n && (r = cuGraphAddMemAllocNode(&node, g, NULL, 0, &prm))) die("cuGraphAddMemAllocNode", r, 0);
        for (int k = 0; k < depth; k++) {
            void *parent = NULL;
            CUgraphNodeParams cp;
            memset(&cp, 0, sizeof cp);
            cp.type = CU_GRAPH_NODE_TYPE_GRAPH;
            cp.graph.graph = g;
            cp.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
            if ((r = cuGraphCreate(&parent, 0))) die("cuGraphCreate", r, 0);
            if (move) r = cuGraphAddNode(&node, parent, NULL, 0, &cp);
            else if (!(r = cuGraphAddChildGraphNode(&node, parent, NULL, 0, g))) r = cuGraphDestroy(g);
            if (r) die("child graph node", r, 0);
            g = parent;
        }
        r = hold ? CUDA_SUCCESS : cuGraphInstantiateWithFlags(&exec, g, 0);
        printf("gtree %d\n", r);
        if (r != want) die("gtree instantiation", r, want);
        if (!hold && (r = cuGraphDestroy(g))) die("cuGraphDestroy", r, 0);
        if (exec) {
            obj_t *o = push("gexec");
            o->h = (uint64_t)(uintptr_t)exec;
            o->va = prm.dptr;
            o->size = n;
        }
    } else if (!strcmp(c, "gchildrules")) {
        void *a = NULL, *p = NULL, *q = NULL, *node = NULL, *cnode = NULL, *got = NULL, *exec = NULL;
        size_t na = 0, ng = 0;
        CUDA_MEM_ALLOC_NODE_PARAMS prm;
        memset(&prm, 0, sizeof prm);
        prm.poolProps.allocType = 1;
        prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prm.bytesize = 4096;
        CUgraphNodeParams cp;
        memset(&cp, 0, sizeof cp);
        cp.type = CU_GRAPH_NODE_TYPE_GRAPH;
        cp.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
        if (cuGraphCreate(&a, 0) || cuGraphCreate(&p, 0) || cuGraphCreate(&q, 0)) die("cuGraphCreate", 0, 0);
        if ((r = cuGraphAddMemAllocNode(&node, a, NULL, 0, &prm))) die("cuGraphAddMemAllocNode", r, 0);
        if ((r = cuGraphAddChildGraphNode(&cnode, p, NULL, 0, a)) != CUDA_ERROR_INVALID_VALUE)
            die("clone of a graph with an allocation node", r, CUDA_ERROR_INVALID_VALUE);
        cp.graph.graph = p;
        if ((r = cuGraphAddNode(&cnode, p, NULL, 0, &cp)) != CUDA_ERROR_INVALID_VALUE) die("move into itself", r, 1);
        cp.graph.graph = a;
        if ((r = cuGraphAddNode(&cnode, p, NULL, 0, &cp))) die("move", r, 0);
        if ((r = cuGraphChildGraphNodeGetGraph(cnode, &got)) || got != a) die("cuGraphChildGraphNodeGetGraph", r, 0);
        if ((r = cuGraphAddNode(&node, q, NULL, 0, &cp)) != CUDA_ERROR_INVALID_VALUE) die("second parent", r, 1);
        if ((r = cuGraphInstantiateWithFlags(&exec, a, 0)) != CUDA_ERROR_INVALID_VALUE) die("moved: instantiate", r, 1);
        if ((r = cuGraphDestroy(a)) != CUDA_ERROR_INVALID_VALUE) die("moved: destroy", r, 1);
        if ((r = cuGraphAddMemAllocNode(&node, a, NULL, 0, &prm)) != CUDA_ERROR_INVALID_VALUE) die("moved: alloc", r, 1);
        cp.graph.graph = p; /* p into its own child */
        if ((r = cuGraphAddNode(&node, a, NULL, 0, &cp)) != CUDA_ERROR_INVALID_VALUE) die("move into a child", r, 1);
        if ((r = cuGraphAddChildGraphNode(&cnode, q, NULL, 0, p)) != CUDA_ERROR_INVALID_VALUE)
            die("clone of a graph with a moved allocation node", r, CUDA_ERROR_INVALID_VALUE);
        if ((r = cuGraphAddEmptyNode(&node, a, NULL, 0)) || cuGraphGetNodes(a, NULL, &na) || na != 2)
            die("node added to the moved graph", r, 0);
        void *e = NULL;
        if (cuGraphCreate(&e, 0) || cuGraphAddEmptyNode(&node, e, NULL, 0)) die("cuGraphCreate", 0, 0);
        if ((r = cuGraphAddChildGraphNode(&cnode, q, NULL, 0, e)) || cuGraphChildGraphNodeGetGraph(cnode, &got) ||
            got == e || cuGraphGetNodes(got, NULL, &ng) || ng != 1)
            die("clone", r, 0);
        if ((r = cuGraphDestroy(e)) || (r = cuGraphDestroy(p)) || (r = cuGraphDestroy(q))) die("cuGraphDestroy", r, 0);
        printf("gchildrules ok\n");
    } else if (!strcmp(c, "glaunch")) {
        int want = atoi(argv[++*i]);
        r = cuGraphLaunch((void *)(uintptr_t)top()->h, NULL);
        printf("glaunch -> %d\n", r);
        if (r != want) die("glaunch result", r, want);
    } else if (!strcmp(c, "gfree")) {
        if ((r = cuMemFreeAsync(top()->va, NULL))) die("gfree", r, 0);
    } else if (!strcmp(c, "gtrim")) {
        CUdevice d = 0;
        cuCtxGetDevice(&d);
        if ((r = cuDeviceGraphMemTrim(d))) die("gtrim", r, 0);
    } else if (!strcmp(c, "gmem")) {
        CUdevice d = 0;
        cuuint64_t res = 0, used = 0;
        cuCtxGetDevice(&d);
        if (cuDeviceGetGraphMemAttribute(d, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res) ||
            cuDeviceGetGraphMemAttribute(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used))
            die("cuDeviceGetGraphMemAttribute", 0, 0);
        printf("gmem %llu %llu\n", res, used);
    } else if (!strcmp(c, "memfree")) {
        int want = atoi(argv[++*i]);
        r = cuMemFree_v2(top()->h);
        printf("memfree -> %d\n", r);
        if (r != want) die("memfree result", r, want);
        if (!r) nobj--;
    } else {
        return 0;
    }
    return 1;
}
