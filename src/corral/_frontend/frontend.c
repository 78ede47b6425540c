/* corral's compiled front end: `corral exec ...` through the resident launcher.
 *
 * For `corral exec` with no terminal on stdin/stdout/stderr, connect to the
 * launcher (src/corral/exec/launcher.py, which documents the wire), hand it
 * argv, the environment, the umask, the working directory and stdio (as
 * descriptors), relay SIGINT/SIGTERM/SIGHUP as one byte each and exit with
 * the status it reports. Everything else (another subcommand, a terminal, no
 * launcher, a refusal) execs the Python CLI with the same argv, so there is
 * exactly one implementation of `corral exec`; only when the launcher was
 * absent or stale is the Python CLI asked to start one for next time.
 *
 * Built by corral/exec/frontend.py with the configuration below defined on
 * the command line (as C string literals):
 *   CORRAL_PYTHON  the interpreter,   CORRAL_SRC  the directory holding the package,
 *   CORRAL_BUILD_ID  "corral-launcher-2 <tag>",   CORRAL_TAG  the socket's name.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#if !defined(CORRAL_PYTHON) || !defined(CORRAL_SRC) || !defined(CORRAL_BUILD_ID) || !defined(CORRAL_TAG)
#error "build with -DCORRAL_PYTHON=... -DCORRAL_SRC=... -DCORRAL_BUILD_ID=... -DCORRAL_TAG=..."
#endif

#define MAX_BODY (2u << 20) /* launcher.MAX_BODY */
#define MAX_FIELDS 16384    /* launcher.MAX_FIELDS */

extern char **environ;

static const char BOOT[] =
    "import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'corral'; "
    "from corral.cli import entry; entry()";

static int conn = -1;
static volatile sig_atomic_t first_signal = 0;
static sigset_t caller_mask; /* the mask we were started with, which the Python CLI inherits */

static int required = 0; /* CORRAL_LAUNCHER=require: no fallback (tests, benchmarks) */

/* Run the Python CLI with the same arguments; never returns. */
static void fallback(int argc, char **argv, int start_launcher) {
    if (required) {
        fputs("corral exec: the launcher is not available (CORRAL_LAUNCHER=require)\n", stderr);
        _exit(125);
    }
    char **args = calloc((size_t)argc + 6, sizeof(char *));
    if (args == NULL) {
        fputs("corral: out of memory\n", stderr);
        _exit(125);
    }
    if (conn >= 0)
        close(conn);
    /* The relay's handlers must not outlive the exec into a process that has no connection. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &caller_mask, NULL);
    if (first_signal)
        _exit(128 + first_signal);
    size_t n = 0;
    args[n++] = (char *)CORRAL_PYTHON; /* sys.executable comes from it */
    /* -I: neither PYTHONPATH nor the working directory can swap in other code; the
     * package comes from CORRAL_SRC, the same tree the launcher runs. */
    args[n++] = (char *)"-I";
    args[n++] = (char *)"-c";
    args[n++] = (char *)BOOT;
    args[n++] = (char *)CORRAL_SRC;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    if (start_launcher)
        setenv("CORRAL_LAUNCHER_START", "1", 1);
    else
        unsetenv("CORRAL_LAUNCHER_START");
    execv(CORRAL_PYTHON, args);
    fprintf(stderr, "corral: cannot run %s: %s\n", CORRAL_PYTHON, strerror(errno));
    _exit(125);
}

static void relay(int signum) {
    if (!first_signal)
        first_signal = signum;
    if (conn >= 0) {
        unsigned char b = (unsigned char)signum;
        int saved = errno;
        (void)!write(conn, &b, 1);
        errno = saved;
    }
}

/* The launcher's socket path (launcher.launcher_socket); 0 when it does not fit. */
static int socket_path(char *out, size_t size) {
    const char *override = getenv("CORRAL_LAUNCHER_SOCKET");
    int n;
    if (override != NULL && override[0] == '/') {
        n = snprintf(out, size, "%s", override);
    } else {
        const char *base = "/tmp";
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        const char *tmp = getenv("TMPDIR");
        if (xdg != NULL && xdg[0] == '/')
            base = xdg;
        else if (tmp != NULL && tmp[0] == '/')
            base = tmp;
        n = snprintf(out, size, "%s/corral-%u/launcher/%s.sock", base, (unsigned)getuid(),
                     CORRAL_TAG);
    }
    return n > 0 && (size_t)n < size;
}

struct buf {
    char *data;
    size_t len, cap;
    size_t fields;
};

static int put(struct buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > MAX_BODY || b->fields + 1 > MAX_FIELDS)
        return 0;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (p == NULL)
            return 0;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->data[b->len + n] = '\0';
    b->len += n + 1;
    b->fields++;
    return 1;
}

static int puts0(struct buf *b, const char *s) { return put(b, s, strlen(s)); }

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return 0;
        }
        p += w;
        n -= (size_t)w;
    }
    return 1;
}

int main(int argc, char **argv) {
    sigprocmask(SIG_SETMASK, NULL, &caller_mask);
    if (argc < 2 || strcmp(argv[1], "exec") != 0)
        fallback(argc, argv, 0);
    const char *mode = getenv("CORRAL_LAUNCHER");
    if (mode != NULL && strcmp(mode, "off") == 0)
        fallback(argc, argv, 0);
    required = mode != NULL && strcmp(mode, "require") == 0;
    /* A terminal needs corral's pty relay in the foreground process group, which a
     * worker of the launcher is not part of: terminals take the Python path. */
    for (int fd = 0; fd < 3; fd++) {
        if (isatty(fd))
            fallback(argc, argv, 0);
        if (fcntl(fd, F_GETFD) < 0)
            fallback(argc, argv, 0); /* a closed standard stream: cannot be passed */
    }

    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (!socket_path(addr.sun_path, sizeof addr.sun_path))
        fallback(argc, argv, 0);
    conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (conn < 0)
        fallback(argc, argv, 0);
    if (connect(conn, (struct sockaddr *)&addr, sizeof addr) != 0)
        fallback(argc, argv, errno == ENOENT || errno == ECONNREFUSED);
    /* Our descriptors go only to a launcher of our own uid. */
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid())
        fallback(argc, argv, 0);

    int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0)
        fallback(argc, argv, 0);

    struct buf body = {0};
    char num[32];
    mode_t mask = umask(0);
    umask(mask);
    int ok = puts0(&body, CORRAL_BUILD_ID);
    snprintf(num, sizeof num, "%o", (unsigned)mask);
    ok = ok && puts0(&body, num);
    /* The caller's resource limits: `corral exec` would have inherited them. */
    static const int resources[] = {RLIMIT_CPU,     RLIMIT_FSIZE,   RLIMIT_DATA,    RLIMIT_STACK,
                                    RLIMIT_CORE,    RLIMIT_RSS,     RLIMIT_NPROC,   RLIMIT_NOFILE,
                                    RLIMIT_MEMLOCK, RLIMIT_AS,      RLIMIT_LOCKS,   RLIMIT_SIGPENDING,
                                    RLIMIT_MSGQUEUE, RLIMIT_NICE,   RLIMIT_RTPRIO,  RLIMIT_RTTIME};
    char limits[16 * 48] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof resources / sizeof resources[0]; i++) {
        struct rlimit rl;
        if (getrlimit(resources[i], &rl) != 0)
            fallback(argc, argv, 0);
        long long soft = rl.rlim_cur == RLIM_INFINITY ? -1 : (long long)rl.rlim_cur;
        long long hard = rl.rlim_max == RLIM_INFINITY ? -1 : (long long)rl.rlim_max;
        int n = snprintf(limits + used, sizeof limits - used, "%s%d:%lld:%lld", used ? "," : "",
                         resources[i], soft, hard);
        if (n < 0 || (size_t)n >= sizeof limits - used)
            fallback(argc, argv, 0);
        used += (size_t)n;
    }
    ok = ok && puts0(&body, limits);
    snprintf(num, sizeof num, "%d", argc - 1);
    ok = ok && puts0(&body, num);
    for (int i = 1; ok && i < argc; i++)
        ok = puts0(&body, argv[i]);
    for (char **e = environ; ok && *e != NULL; e++)
        ok = puts0(&body, *e);
    if (!ok) /* beyond the launcher's bounds: the Python CLI judges it */
        fallback(argc, argv, 0);

    /* Held until the whole request is written: a relayed byte must not land inside it. */
    sigset_t relayed;
    sigemptyset(&relayed);
    sigaddset(&relayed, SIGINT);
    sigaddset(&relayed, SIGTERM);
    sigaddset(&relayed, SIGHUP);
    sigprocmask(SIG_BLOCK, &relayed, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = relay;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    unsigned char head[8] = {'C', 'R', 'L', '1'};
    uint32_t len = (uint32_t)body.len;
    head[4] = (unsigned char)(len >> 24);
    head[5] = (unsigned char)(len >> 16);
    head[6] = (unsigned char)(len >> 8);
    head[7] = (unsigned char)len;
    int fds[4] = {0, 1, 2, cwd};
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    ssize_t sent;
    do
        sent = sendmsg(conn, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)sizeof head || !write_all(conn, body.data, body.len))
        fallback(argc, argv, 1);
    close(cwd);
    free(body.data);
    sigprocmask(SIG_SETMASK, &caller_mask, NULL);

    /* Replies: "R reason" (nothing ran: the Python CLI instead), "A", then "X status". */
    char line[256];
    size_t have = 0;
    int accepted = 0;
    for (;;) {
        ssize_t r = read(conn, line + have, sizeof line - 1 - have);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            r = 0;
        }
        if (r == 0) {
            if (!accepted)
                fallback(argc, argv, 1);
            fputs("corral exec: the launcher's worker died; its sandbox is torn down\n", stderr);
            return 125;
        }
        have += (size_t)r;
        line[have] = '\0';
        char *nl;
        while ((nl = memchr(line, '\n', have)) != NULL) {
            *nl = '\0';
            if (line[0] == 'R' && !accepted) {
                fallback(argc, argv, strncmp(line, "R stale", 7) == 0);
            } else if (line[0] == 'A' && line[1] == '\0') {
                accepted = 1;
            } else if (line[0] == 'X' && line[1] == ' ' && accepted) {
                char *end;
                long code = strtol(line + 2, &end, 10);
                if (*end == '\0' && code >= 0 && code <= 255)
                    return (int)code;
                fputs("corral exec: the launcher sent a bad status\n", stderr);
                return 125;
            } else {
                fputs("corral exec: the launcher sent a bad reply\n", stderr);
                return 125;
            }
            size_t used = (size_t)(nl - line) + 1;
            memmove(line, nl + 1, have - used);
            have -= used;
        }
        if (have >= sizeof line - 1) {
            fputs("corral exec: the launcher sent a bad reply\n", stderr);
            return 125;
        }
    }
}
