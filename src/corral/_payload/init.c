/*
 * corral-init: the sandbox's init, in C because it is on every sandbox's
 * start-up path (a Python interpreter costs ~20 ms there; this costs ~1 ms).
 * It does exactly what init.py does, which remains the fallback when no C
 * compiler is available; the Landlock ruleset is decided on the host by
 * corral.sandbox.landlock.plan() and handed over as numbers:
 *
 *   corral-init STATUS_FD [--hold FD] [--seccomp-log FD]
 *               [--ll ABI HANDLED_FS HANDLED_NET SCOPED FLAGS]
 *               [--path MASK PATH]... [--port ACCESS PORT]... -- CMD [ARG...]
 *
 * 0. makes itself non-dumpable, so the command (same uid, no capabilities)
 *    cannot open /proc/<init>/mem, /proc/<init>/fd/N or ptrace it;
 * 1. applies Landlock (fail closed: any error -> exit 125, command never runs);
 * 1b. with --seccomp-log, loads bwrap's seccomp program a second time with
 *    SECCOMP_FILTER_FLAG_LOG (see log_seccomp);
 * 2. resolves CMD on PATH (127 when not found, like sh);
 * 3. forks; the child enters a nested Landlock domain (so it can neither
 *    ptrace nor, with ABI >= 6, signal the init, which stays in the parent
 *    domain) and execs CMD; the init forwards SIGTERM/SIGINT/SIGHUP;
 * 4. when CMD exits, writes {"event": "exit", ...} as one JSON line on
 *    STATUS_FD, then, with --hold, blocks until the host closes FD: the
 *    namespace (and every leftover process) stays in place while the host
 *    counts the leftovers in the cgroup; then exits with CMD's status, which
 *    bwrap's monitor, outside the sandbox, reports to the host.
 * 5. when the host's end of --hold closes, every process the init can signal
 *    is killed (before the command's end too: corral is gone, see end_all).
 * The report is advisory: the host takes the exit status from bwrap and the
 * leftovers from the cgroup (see namespace.py, "Where the exit report's
 * values come from").
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_REFUSED 125
#define EXIT_NOT_EXECUTABLE 126
#define EXIT_NOT_FOUND 127
#define MAX_RULES 256

#define SYS_LL_CREATE_RULESET 444
#define SYS_LL_ADD_RULE 445
#define SYS_LL_RESTRICT_SELF 446
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2
/* execute, write_file, read_file, truncate, ioctl_dev: the rights a file (not
 * a directory) may carry; the kernel rejects directory rights on a file. */
#define LL_FILE_RIGHTS ((1ULL << 0) | (1ULL << 1) | (1ULL << 2) | (1ULL << 14) | (1ULL << 15))

static int status_fd = -1;
static int hold_fd = -1;
static volatile pid_t child = 0;

struct path_rule { uint64_t mask; const char *path; };
struct port_rule { uint64_t access; uint64_t port; };

static void json_str(char *out, size_t cap, const char *s) {
    size_t n = 0;
    if (cap < 3) return;
    out[n++] = '"';
    for (; *s && n + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\' || c < 0x20 || c > 0x7e)
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        else
            out[n++] = (char)c;
    }
    out[n++] = '"';
    out[n] = 0;
}

/* Lines held back by report_later() until the next report(): each write wakes
 * the host, which may be waiting on this pipe, so the start-up's lines
 * (landlock, seccomp_log, started) go out as one write. */
static char pending[1024];
static size_t npending = 0;

static void vreport(int later, const char *fmt, va_list ap) {
    char buf[4096];
    if (status_fd < 0) return;
    size_t n = npending;
    memcpy(buf, pending, n);
    int k = vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
    if (k < 0) return;
    n += (size_t)k < sizeof buf - n - 2 ? (size_t)k : sizeof buf - n - 2;
    buf[n++] = '\n';
    if (later && n <= sizeof pending) {
        memcpy(pending, buf, n);
        npending = n;
        return;
    }
    npending = 0;
    ssize_t w = write(status_fd, buf, n);
    (void)w;
}

static void report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(0, fmt, ap);
    va_end(ap);
}

static void report_later(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(1, fmt, ap);
    va_end(ap);
}

static int refuse(const char *layer, int code, const char *fmt, ...) {
    char msg[1024], quoted[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_str(quoted, sizeof quoted, msg);
    if (layer)
        report("{\"event\": \"error\", \"layer\": \"%s\", \"code\": %d, \"message\": %s}", layer, code, quoted);
    else
        report("{\"event\": \"error\", \"code\": %d, \"message\": %s}", code, quoted);
    fprintf(stderr, "corral: %s\n", msg);
    return code;
}

static int apply_landlock(const uint64_t ll[5], struct path_rule *paths, int npaths,
                          struct port_rule *ports, int nports) {
    uint64_t attr[3] = {ll[1], ll[2], ll[3]};
    size_t size = ll[0] >= 6 ? 24 : ll[0] >= 4 ? 16 : 8;
    long fd = syscall(SYS_LL_CREATE_RULESET, attr, size, 0);
    if (fd < 0) return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: create_ruleset: %s", strerror(errno));
    for (int i = 0; i < npaths; i++) {
        int pfd = open(paths[i].path, O_PATH | O_CLOEXEC);
        if (pfd < 0) {
            if (errno == ENOENT || errno == ENOTDIR) continue;
            return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: cannot open %s: %s", paths[i].path, strerror(errno));
        }
        struct stat st;
        uint64_t mask = paths[i].mask;
        if (fstat(pfd, &st) == 0 && !S_ISDIR(st.st_mode)) mask &= LL_FILE_RIGHTS;
        if (mask) {
            struct __attribute__((packed)) { uint64_t allowed; int32_t parent_fd; } rule = {mask, pfd};
            if (syscall(SYS_LL_ADD_RULE, fd, LL_RULE_PATH_BENEATH, &rule, 0) < 0)
                return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: add_rule(%s): %s", paths[i].path, strerror(errno));
        }
        close(pfd);
    }
    for (int i = 0; i < nports; i++) {
        struct { uint64_t allowed; uint64_t port; } rule = {ports[i].access, ports[i].port};
        if (syscall(SYS_LL_ADD_RULE, fd, LL_RULE_NET_PORT, &rule, 0) < 0)
            return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: add_rule(port): %s", strerror(errno));
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: no_new_privs: %s", strerror(errno));
    if (syscall(SYS_LL_RESTRICT_SELF, fd, (uint32_t)ll[4]) != 0)
        return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: restrict_self: %s", strerror(errno));
    close((int)fd);
    report_later("{\"event\": \"landlock\", \"abi\": %llu}", (unsigned long long)ll[0]);
    return 0;
}

/* The command's own domain, nested in the init's: Landlock refuses ptrace-mode
 * access (ptrace, /proc/<pid>/mem, /proc/<pid>/fd) from a domain to a process
 * outside it or its descendants, and SCOPE_SIGNAL (ABI >= 6) refuses signals
 * the same way, so the init, left in the parent domain, is out of reach.
 * MAKE_BLOCK is handled with no rule (nothing in a sandbox creates block
 * devices) only because a ruleset must handle something below ABI 6. */
static int nest_landlock(const uint64_t ll[5]) {
    uint64_t attr[3] = {1ULL << 11, 0, ll[0] >= 6 ? ll[3] : 0};
    size_t size = ll[0] >= 6 ? 24 : 8;
    long fd = syscall(SYS_LL_CREATE_RULESET, attr, size, 0);
    if (fd < 0) return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: nested create_ruleset: %s", strerror(errno));
    if (syscall(SYS_LL_RESTRICT_SELF, fd, (uint32_t)ll[4]) != 0)
        return refuse("landlock", EXIT_REFUSED, "Landlock could not be applied: nested restrict_self: %s", strerror(errno));
    close((int)fd);
    return 0;
}

/* bwrap loads the filter with prctl(PR_SET_SECCOMP), which takes no flags, so
 * its SECCOMP_RET_ERRNO results are never audited. The same program loaded
 * again with SECCOMP_FILTER_FLAG_LOG returns the same action for every
 * syscall; of equal actions the kernel takes the most recently loaded
 * filter's, so a denial is now audited. It cannot loosen anything: stacked
 * filters only add restrictions. Logging is not a protection layer: when it
 * cannot be set up the command runs anyway and the host sees no "seccomp_log". */
static void log_seccomp(int fd) {
    static struct sock_filter insns[BPF_MAXINSNS + 1];
    size_t got = 0;
    while (got < sizeof insns) {
        ssize_t n = read(fd, (char *)insns + got, sizeof insns - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (got == 0 || got % sizeof insns[0] || got > BPF_MAXINSNS * sizeof insns[0]) return;
    struct sock_fprog prog = {(unsigned short)(got / sizeof insns[0]), insns};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_LOG, &prog) != 0) return;
    report_later("{\"event\": \"seccomp_log\"}");
}

static int which(const char *cmd, char *out, size_t cap) {
    if (strchr(cmd, '/')) {
        if (access(cmd, F_OK) != 0) return -1;
        snprintf(out, cap, "%s", cmd);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    const char *p = path;
    while (1) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        struct stat st;
        snprintf(out, cap, "%.*s/%s", (int)len, len ? p : ".", cmd);
        if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0) return 0;
        if (!end) return -1;
        p = end + 1;
    }
}

static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

static void on_chld(int sig) { (void)sig; }

/* The host keeps its end of --hold open until it has counted the leftovers;
 * its EOF before the command ends means corral died. bwrap's pid 1 arms
 * --die-with-parent only after its own setup, so a corral (and with it bwrap's
 * monitor) killed in that window leaves the namespace to nobody, and bwrap's
 * pid 1 reaps for as long as one process lives: a setsid'd daemon would run
 * on unsupervised. kill(-1) reaches every process of the namespace but bwrap's
 * pid 1 (immune inside its namespace) and this one; pid 1 then exits with its
 * last child. After the normal release the host has counted them and ends
 * the cgroup anyway: this only stops depending on it. */
static void end_all(void) { kill(-1, SIGKILL); }

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || end == s) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    static struct path_rule paths[MAX_RULES];
    static struct port_rule ports[MAX_RULES];
    uint64_t ll[5] = {0};
    int have_ll = 0, npaths = 0, nports = 0, i = 2, seccomp_log_fd = -1;

    if (argc < 3) {
        fprintf(stderr, "corral-init: usage: corral-init STATUS_FD [--ll ...] [--path MASK PATH]... -- CMD...\n");
        return EXIT_REFUSED;
    }
    status_fd = atoi(argv[1]);
    if (status_fd >= 0) fcntl(status_fd, F_SETFD, FD_CLOEXEC);
    /* Before anything else: while dumpable, a process of the same uid may
     * write this one's memory through /proc/<pid>/mem (FOLL_FORCE ignores
     * page protections) and reopen its descriptors through /proc/<pid>/fd. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        return refuse("init", EXIT_REFUSED, "corral-init: prctl(PR_SET_DUMPABLE): %s", strerror(errno));
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc) {
            hold_fd = atoi(argv[++i]);
            if (hold_fd < 0 || fcntl(hold_fd, F_SETFD, FD_CLOEXEC) != 0)
                return refuse(NULL, EXIT_REFUSED, "corral-init: bad --hold descriptor");
        } else if (strcmp(argv[i], "--seccomp-log") == 0 && i + 1 < argc) {
            seccomp_log_fd = atoi(argv[++i]);
            if (seccomp_log_fd < 0 || fcntl(seccomp_log_fd, F_SETFD, FD_CLOEXEC) != 0)
                return refuse(NULL, EXIT_REFUSED, "corral-init: bad --seccomp-log descriptor");
        } else if (strcmp(argv[i], "--ll") == 0 && i + 5 < argc) {
            for (int k = 0; k < 5; k++)
                if (parse_u64(argv[i + 1 + k], &ll[k])) return refuse("landlock", EXIT_REFUSED, "bad --ll value");
            have_ll = 1;
            i += 5;
        } else if (strcmp(argv[i], "--path") == 0 && i + 2 < argc && npaths < MAX_RULES) {
            if (parse_u64(argv[i + 1], &paths[npaths].mask)) return refuse("landlock", EXIT_REFUSED, "bad --path mask");
            paths[npaths++].path = argv[i + 2];
            i += 2;
        } else if (strcmp(argv[i], "--port") == 0 && i + 2 < argc && nports < MAX_RULES) {
            if (parse_u64(argv[i + 1], &ports[nports].access) || parse_u64(argv[i + 2], &ports[nports].port))
                return refuse("landlock", EXIT_REFUSED, "bad --port value");
            nports++;
            i += 2;
        } else {
            return refuse(NULL, EXIT_REFUSED, "corral-init: bad argument %s", argv[i]);
        }
    }
    if (i >= argc - 1) return refuse(NULL, EXIT_REFUSED, "corral-init: no command after --");
    char **cmd = argv + i + 1;

    if (have_ll) {
        int rc = apply_landlock(ll, paths, npaths, ports, nports);
        if (rc) return rc;
    }
    if (seccomp_log_fd >= 0) log_seccomp(seccomp_log_fd);
    char path[4096];
    if (which(cmd[0], path, sizeof path) != 0)
        return refuse(NULL, EXIT_NOT_FOUND, "%s: command not found in the sandbox", cmd[0]);

    /* The host may be gone (see end_all): a report to it must not kill the init. */
    struct sigaction pipe_was;
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &pipe_was);
    sigset_t fwd, old;
    sigemptyset(&fwd);
    sigaddset(&fwd, SIGTERM);
    sigaddset(&fwd, SIGINT);
    sigaddset(&fwd, SIGHUP);
    /* Blocked across fork so a signal arriving in between is not lost. */
    sigprocmask(SIG_BLOCK, &fwd, &old);
    pid_t pid = fork();
    if (pid < 0) return refuse(NULL, EXIT_REFUSED, "fork: %s", strerror(errno));
    if (pid == 0) {
        if (have_ll && nest_landlock(ll) != 0) _exit(EXIT_REFUSED);
        sigaction(SIGPIPE, &pipe_was, NULL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        execv(path, cmd);
        int err = errno;
        fprintf(stderr, "corral: %s: %s\n", cmd[0], strerror(err));
        _exit(err == EACCES || err == ENOEXEC ? EXIT_NOT_EXECUTABLE : EXIT_NOT_FOUND);
    }
    child = pid;
    report("{\"event\": \"started\", \"pid\": %d}", pid);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    struct sigaction sc;
    memset(&sc, 0, sizeof sc);
    sc.sa_handler = on_chld; /* a handler, not SIG_DFL: it must interrupt ppoll */
    sc.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sc, NULL);
    /* SIGCHLD stays blocked but inside ppoll/sigsuspend, so an exit between
     * the WNOHANG check and the wait is not missed. */
    sigset_t running = old, waiting = old;
    sigaddset(&running, SIGCHLD);
    sigdelset(&waiting, SIGCHLD);
    sigprocmask(SIG_SETMASK, &running, NULL);
    int status = 0, watch = hold_fd >= 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) { status = 0; break; }
        if (!watch) { sigsuspend(&waiting); continue; }
        struct pollfd p = { .fd = hold_fd, .events = POLLIN, .revents = 0 };
        int n = ppoll(&p, 1, NULL, &waiting);
        if (n > 0) {
            watch = 0;
            end_all();
        } else if (n < 0 && errno != EINTR) {
            /* Cannot watch (ENOMEM): wait as before rather than spin on the error. */
            watch = 0;
        }
    }
    child = 0; /* reaped: its pid may be reused by a leftover */
    int code, sig = 0;
    if (WIFSIGNALED(status)) {
        sig = WTERMSIG(status);
        code = 128 + sig;
    } else {
        code = WEXITSTATUS(status);
    }
    report("{\"event\": \"exit\", \"code\": %d, \"signal\": %d}", code, sig);
    if (hold_fd >= 0) {
        char b;
        /* Any byte or EOF releases; an error (EBADF) must not hang the init. */
        while (read(hold_fd, &b, 1) < 0 && errno == EINTR) {}
        end_all();
    }
    return code;
}
