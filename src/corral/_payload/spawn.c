/* corral's sibling spawn (host code, loaded by a prepared sandbox child: sandbox/prefork.py).
 *
 * A process forked from the launcher's worker shares its ~40 MB of anonymous
 * memory copy-on-write; its execve() must unmap all of it before bwrap's
 * first instruction (~1.5 ms here, the largest single cost between the
 * request and bwrap). A vfork-style child (CLONE_VM) shares the memory
 * instead, so its execve() only drops a reference. CLONE_PARENT makes the
 * worker, not the prepared child, bwrap's parent: bwrap's --die-with-parent
 * and the worker's waitpid see the same process as before, and the prepared
 * child exits (and unmaps) off the request's path.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

struct spawn_args {
    const char *path;
    char *const *argv;
    char *const *envp;
    pid_t parent;
    sigset_t mask;
    volatile int err;
};

static int spawn_child(void *p) {
    struct spawn_args *a = p;
    struct sigaction sa;
    /* The handlers are the parent's (Python's): none may run here, on its memory. */
    for (int sig = 1; sig < NSIG; sig++) {
        if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler != SIG_IGN && sa.sa_handler != SIG_DFL) {
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = SIG_DFL;
            sigaction(sig, &sa, NULL);
        }
    }
    /* A fork clears the death signal: armed again for the new parent (the
     * worker), then checked, as the prepared child did before exec'ing itself. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != a->parent) {
        a->err = ESRCH;
        _exit(127);
    }
    sigprocmask(SIG_SETMASK, &a->mask, NULL);
    execve(a->path, a->argv, a->envp);
    a->err = errno ? errno : EINVAL;
    _exit(127);
}

/* The pid of a process running `path` whose parent is this process's parent,
 * or -errno when it could not be made. When execve failed, `*exec_err` is its
 * errno and the process has exited (its parent reaps it). */
int corral_spawn_sibling(const char *path, char *const argv[], char *const envp[], int *exec_err) {
    pid_t parent = getppid();
    const size_t size = 256 * 1024;
    *exec_err = 0;
    char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED)
        return -errno;
    struct spawn_args a = {.path = path, .argv = argv, .envp = envp, .parent = parent, .err = 0};
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &a.mask);
    /* CLONE_VFORK: back here only once the child has exec'd or exited. */
    int pid = clone(spawn_child, stack + size, CLONE_VM | CLONE_VFORK | CLONE_PARENT | SIGCHLD, &a);
    int err = errno;
    sigprocmask(SIG_SETMASK, &a.mask, NULL);
    munmap(stack, size);
    if (pid < 0)
        return -err;
    *exec_err = a.err;
    return pid;
}
