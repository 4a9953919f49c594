/* vgtest commands around fork and the library's watcher thread: "tasks" and
 * "forkstorm" (see vgtest.c's usage). Included by vgtest.c only. */
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>

static void print_tasks(void) {
    DIR *dir = opendir("/proc/self/task");
    if (!dir) die("opendir /proc/self/task", 0, 0);
    for (struct dirent *de; (de = readdir(dir));) {
        if (de->d_name[0] == '.') continue;
        char path[300], name[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0;
        if (f) fclose(f);
        printf("task %s\n", name);
    }
    closedir(dir);
}

/* one forkstorm round: the child forks while its new watcher thread starts;
 * it stores the grandchild's pid in *gpid (shared with the parent) */
static int storm_child(volatile pid_t *gpid) {
    if (cuInit(0)) return 3;
    pid_t g = fork();
    if (g < 0) return 4;
    if (g == 0) exit(0); /* exit handlers run (and LSan's check in the ASan build) */
    *gpid = g;
    int st;
    if (waitpid(g, &st, 0) != g) return 5;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 6;
}

static void forkstorm(int n) {
    int exited = 0, stuck = 0;
    volatile pid_t *gpid = mmap(NULL, sizeof *gpid, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (gpid == MAP_FAILED) die("mmap", 0, 0);
    for (int k = 0; k < n; k++) {
        fflush(stdout);
        *gpid = 0;
        pid_t pid = fork();
        if (pid < 0) die("fork", 0, 0);
        if (pid == 0) exit(storm_child(gpid));
        int st = 0;
        pid_t w = 0;
        for (int t = 0; t < 3000 && (w = waitpid(pid, &st, WNOHANG)) == 0; t++) usleep(10000);
        if (w == pid) {
            if (!WIFEXITED(st) || WEXITSTATUS(st)) die("forkstorm child failed", st, 0);
            exited++;
        } else {
            stuck++;
            if (*gpid > 0) kill(*gpid, SIGKILL); /* reaped by init once its parent is gone */
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
    munmap((void *)gpid, sizeof *gpid);
    printf("forkstorm %d %d\n", exited, stuck);
}

