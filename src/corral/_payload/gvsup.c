/*
 * corral-gvsup: the gVisor sandbox's pid 1 when nothing is attached before the
 * command runs (corral.sandbox.gvisor.bundle.supervisor). Static, because on
 * gVisor's ptrace platform every program the dynamic loader maps costs
 * 0.03-0.04 s; it replaces a shell, setpriv and a shell loop reading /proc.
 *
 *   corral-gvsup REPORT UID GID -- CMD [ARG...]
 *   corral-gvsup --request REPORT     (pre-booted: the rest comes on stdin)
 *
 * It runs as uid 0 with CAP_SETUID, CAP_SETGID and CAP_SETPCAP only, under
 * no_new_privs, with the spec's environment and cwd (runsc sets them):
 * 1. opens REPORT for writing (a file in a host directory only root opens:
 *    the command's uid cannot), close-on-exec, as descriptor 3;
 * 2. forks; the child empties the bounding, ambient and inheritable sets,
 *    drops the supplementary groups, becomes UID:GID (which clears the rest
 *    of its capabilities) and execs CMD on the environment's PATH (127 when
 *    not found, 126 when not executable, like sh);
 * 3. reaps every process until CMD's own exits (orphans reparent to pid 1);
 * 4. counts what CMD left: live, non-zombie processes of UID whose parent is
 *    inside (not 0), from the sentry's /proc, skipping itself;
 * 5. writes "exit S left N\n" (S = 128 + signal when killed) to REPORT and
 *    exits; gVisor then ends the sandbox and everything left in it.
 *
 * Why the command cannot forge the count: it runs as another uid without
 * capabilities, so it can neither signal, ptrace nor open the descriptors or
 * memory of pid 1 (uid 0), nor open REPORT's directory (0700, root's); the
 * host reads only REPORT and accepts only one exact "exit S left N" line.
 * The one text of the command's in a status file is its name (15 bytes, it
 * may hold newlines), which comes first: the last State, PPid and Uid lines
 * are the sentry's own.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/capability.h>

#define REPORT_FD 3

static void die(const char *what) {
    char msg[256];
    int n = snprintf(msg, sizeof msg, "corral-gvsup: %s: %s\n", what, strerror(errno));
    if (n > 0) {
        ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    _exit(125);
}

static int parse_id(const char *s, unsigned long *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v > 0xfffffffeUL) return -1;
    *out = v;
    return 0;
}

/* The child: no capabilities of any kind left, then CMD. Never returns. */
static void run_command(uid_t uid, gid_t gid, const char *cwd, char **argv) {
    sigset_t none;
    if (sigemptyset(&none) != 0 || sigprocmask(SIG_SETMASK, &none, NULL) != 0) die("sigprocmask");
    for (int cap = 0; cap <= 63; cap++) {
        if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0) {
            if (errno == EINVAL) break; /* past the last capability this kernel knows */
            die("PR_CAPBSET_READ");
        }
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) die("PR_CAPBSET_DROP");
    }
    /* EINVAL: a kernel without ambient capabilities (gVisor 2022): none to clear. */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        die("ambient");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs");
    if (setgroups(0, NULL) != 0) die("setgroups");
    if (setresgid(gid, gid, gid) != 0) die("setresgid");
    if (setresuid(uid, uid, uid) != 0) die("setresuid");
    /* Leaving uid 0 cleared the permitted and effective sets (no KEEP_CAPS);
     * inheritable survives it, so it is emptied explicitly. */
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &hdr, data) != 0) die("capset");
    /* As the command's uid: it may enter only what it could enter itself. */
    if (cwd != NULL && chdir(cwd) != 0) die("chdir");
    execvp(argv[0], argv);
    int err = errno;
    char msg[512];
    int n = snprintf(msg, sizeof msg, "corral-gvsup: %s: %s\n", argv[0], strerror(err));
    if (n > 0) {
        ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

/* The value after the last "\n<key>" in buf, or NULL. */
static const char *last_field(const char *buf, size_t len, const char *key) {
    const char *found = NULL;
    size_t klen = strlen(key);
    const char *p = buf, *end = buf + len;
    while (p < end) {
        const char *hit = memmem(p, (size_t)(end - p), key, klen);
        if (hit == NULL) break;
        found = hit + klen;
        p = hit + 1;
    }
    return found;
}

static int counted(int dirfd, const char *name, unsigned long uid) {
    char path[64];
    if (snprintf(path, sizeof path, "%s/status", name) >= (int)sizeof path) return 0;
    int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0; /* gone since the listing */
    static char buf[65536];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
        if (len == sizeof buf - 1) break;
    }
    close(fd);
    buf[len] = 0;
    const char *st = last_field(buf, len, "\nState:\t");
    const char *pp = last_field(buf, len, "\nPPid:\t");
    const char *u = last_field(buf, len, "\nUid:\t");
    if (st == NULL || pp == NULL || u == NULL) return 0;
    char *end;
    unsigned long ruid = strtoul(u, &end, 10);
    if (end == u || (*end != '\t' && *end != '\n')) return 0;
    unsigned long ppid = strtoul(pp, &end, 10);
    if (end == pp || *end != '\n') return 0;
    return ruid == uid && ppid != 0 && *st != 'Z';
}

static long count_left(unsigned long uid) {
    DIR *d = opendir("/proc");
    if (d == NULL) return -1;
    long n = 0;
    struct dirent *e;
    pid_t self = getpid();
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end || pid <= 0 || pid == self) continue;
        n += counted(dirfd(d), e->d_name, uid);
        errno = 0;
    }
    int err = errno;
    closedir(d);
    return err ? -1 : n;
}

/* Exactly len bytes from fd 0 (never more: the rest of stdin is the command's). */
static int read_exact(char *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(0, buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    return 0;
}

#define MAX_REQUEST (4u << 20)
#define MAX_FIELDS 65536

/* The request a pre-booted sandbox gets from the host on stdin (written by
 * the host before anything but this process runs inside): a 4-byte
 * little-endian length, then NUL-terminated fields: UID GID NPROC CWD ARGC
 * ARGV... ENV... (NPROC "-" for none). Fills the out-parameters; -1 if malformed. */
static int read_request(unsigned long *uid, unsigned long *gid, long *nproc, char **cwd,
                        char ***cmd, char ***env) {
    unsigned char hdr[4];
    if (read_exact((char *)hdr, 4) != 0) return -1;
    size_t len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
    if (len == 0 || len > MAX_REQUEST) return -1;
    char *buf = malloc(len + 1);
    char **fields = calloc(MAX_FIELDS + 1, sizeof *fields);
    if (buf == NULL || fields == NULL || read_exact(buf, len) != 0 || buf[len - 1] != 0) return -1;
    buf[len] = 0;
    size_t n = 0;
    for (char *p = buf; p < buf + len; p += strlen(p) + 1) {
        if (n == MAX_FIELDS) return -1;
        fields[n++] = p;
    }
    unsigned long argc;
    if (n < 6 || parse_id(fields[0], uid) || parse_id(fields[1], gid) || parse_id(fields[4], &argc))
        return -1;
    if (argc == 0 || argc > n - 5) return -1;
    unsigned long lim;
    if (strcmp(fields[2], "-") == 0) *nproc = -1;
    else if (parse_id(fields[2], &lim) == 0) *nproc = (long)lim;
    else return -1;
    *cwd = fields[3];
    /* argv and env are each NULL-terminated views into fields (shifted by one
     * slot so argv's terminator does not overwrite env's first entry). */
    char **av = calloc(argc + 1, sizeof *av);
    if (av == NULL) return -1;
    memcpy(av, fields + 5, argc * sizeof *av);
    *cmd = av;
    *env = fields + 5 + argc; /* fields[n] is NULL (calloc) */
    return 0;
}

int main(int argc, char **argv) {
    unsigned long uid, gid;
    long nproc = -1;
    char *cwd = NULL;
    char **cmd, **env = NULL;
    int requested = argc == 3 && strcmp(argv[1], "--request") == 0;
    const char *report = requested ? argv[2] : argv[1];
    if (!requested &&
        (argc < 6 || strcmp(argv[4], "--") != 0 || parse_id(argv[2], &uid) || parse_id(argv[3], &gid))) {
        static const char usage[] =
            "usage: corral-gvsup REPORT UID GID -- CMD [ARG...] | corral-gvsup --request REPORT\n";
        ssize_t w = write(2, usage, sizeof usage - 1);
        (void)w;
        return 125;
    }
    cmd = argv + 5;
    int fd = open(report, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) die("open report");
    if (fd != REPORT_FD) {
        if (dup3(fd, REPORT_FD, O_CLOEXEC) < 0) die("dup3");
        close(fd);
    }
    if (requested) {
        /* Booted ahead of the request: say so on stdout (the host reads it
         * before it relays the command's output), then wait for the request. */
        static const char ready[] = "ready\n";
        if (write(1, ready, sizeof ready - 1) != (ssize_t)(sizeof ready - 1)) die("write ready");
        if (read_request(&uid, &gid, &nproc, &cwd, &cmd, &env) != 0) {
            errno = EINVAL;
            die("request");
        }
    }
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        if (nproc >= 0) {
            struct rlimit rl = {(rlim_t)nproc, (rlim_t)nproc};
            if (setrlimit(RLIMIT_NPROC, &rl) != 0) die("RLIMIT_NPROC");
        }
        if (env != NULL) environ = env; /* execvp searches the command's own PATH */
        run_command((uid_t)uid, (gid_t)gid, cwd, cmd);
    }
    int status = 0;
    for (;;) {
        int st;
        pid_t got = waitpid(-1, &st, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            die("waitpid");
        }
        if (got == child) {
            status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
    }
    long left = count_left(uid);
    if (left < 0) die("count /proc");
    char line[64];
    int n = snprintf(line, sizeof line, "exit %d left %ld\n", status, left);
    if (n <= 0 || write(REPORT_FD, line, (size_t)n) != n) die("write report");
    return 0;
}
