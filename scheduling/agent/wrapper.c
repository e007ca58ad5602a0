/*
 * sluice-job-wrapper: the job wrapper of wrapper.py, compiled (``make native``).
 *
 * Same command line, same status line, same environment and exit files, same rights as
 * the Python wrapper, which stays the reference and the fallback where no C compiler is
 * found (see scheduling/agent/runner.py, ``wrapper_command``):
 *
 *   sluice-job-wrapper --exit-file F --env-file E --status-fd N [--cwd D]
 *                      [--uid U --gid G] [--cgroup C] -- argv...
 *
 * It joins the job's cgroup, reads the job's environment (``KEY=VALUE`` entries, each
 * ended by a NUL byte) and removes the file, starts the command as its child (same process
 * group) as the job's account, tells the agent ``ok <pid>`` or ``error <message>`` on the
 * status descriptor, waits for the command and writes {"exit_code", "signal",
 * "finished_at"} to the exit file atomically. It outlives SIGTERM, SIGINT and SIGHUP sent
 * to the group so that it can record the command's answer to them.
 *
 * Why: a job's wrapper starts for every job. The Python one costs 30 ms of CPU per job
 * (interpreter start and imports), which was two thirds of the node agent's cost per job
 * in bench/e2e.py; this one costs well under one millisecond.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CANNOT_START 127
#define USAGE 2
#define MAX_ENV_BYTES (16 * 1024 * 1024)
#define DEFAULT_PATH "/bin:/usr/bin" /* Python's os.defpath */

struct options {
    const char *exit_file, *env_file, *cwd, *cgroup;
    int status_fd;
    long uid, gid;
    char **command;
};

static void ignore(int signum) { (void)signum; }

static int usage(const char *message, const char *what) {
    fprintf(stderr, "sluice-job-wrapper: %s%s\n", message, what ? what : "");
    return USAGE;
}

static int parse_long(const char *text, long *out) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || end == text || *end) return -1;
    *out = value;
    return 0;
}

/* Options as wrapper.py takes them: ``--name value`` or ``--name=value``, then ``--``. */
static int parse(int argc, char **argv, struct options *o) {
    int i = 1;
    long fd = -1;
    o->uid = o->gid = -1;
    while (i < argc && strcmp(argv[i], "--") != 0) {
        const char *arg = argv[i], *value;
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (eq) {
            value = eq + 1;
            i += 1;
        } else if (i + 1 < argc) {
            value = argv[i + 1];
            i += 2;
        } else {
            return usage("an option needs a value: ", arg);
        }
#define IS(name) (name_len == strlen(name) && strncmp(arg, name, name_len) == 0)
        if (IS("--exit-file")) o->exit_file = value;
        else if (IS("--env-file")) o->env_file = value;
        else if (IS("--cwd")) o->cwd = value;
        else if (IS("--cgroup")) o->cgroup = value;
        else if (IS("--status-fd")) {
            if (parse_long(value, &fd) || fd < 0 || fd > INT_MAX)
                return usage("--status-fd: invalid value ", value);
        } else if (IS("--uid")) {
            if (parse_long(value, &o->uid) || o->uid < 0)
                return usage("--uid: invalid value ", value);
        } else if (IS("--gid")) {
            if (parse_long(value, &o->gid) || o->gid < 0)
                return usage("--gid: invalid value ", value);
        } else {
            return usage("unknown option ", arg);
        }
#undef IS
    }
    if (!o->exit_file || !o->env_file || fd < 0)
        return usage("missing --exit-file, --status-fd or --env-file", NULL);
    if (i + 1 >= argc) return usage("no command given", NULL);
    o->status_fd = (int)fd;
    o->command = &argv[i + 1];
    return 0;
}

/* ``s`` as a JSON string (quotes included) into ``out`` of ``size`` bytes. */
static void json_string(const char *s, char *out, size_t size) {
    size_t n = 0;
    if (size < 3) return;
    out[n++] = '"';
    for (; *s && n + 8 < size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(out + n, size - n, "\\u%04x", c);
        } else {
            out[n++] = (char)c;
        }
    }
    out[n++] = '"';
    out[n] = '\0';
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int write_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The exit file, written atomically (temporary file, fsync, rename), the agent's alone. */
static void write_exit_file(const char *path, const char *json) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return;
    fchmod(fd, 0600);
    int ok = write_all(fd, json, strlen(json)) == 0 && fsync(fd) == 0;
    close(fd);
    if (ok) rename(tmp, path);
}

static void tell_agent(int fd, const char *kind, const char *text) {
    char line[4096];
    int n = snprintf(line, sizeof line, "%s %s", kind, text);
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    for (int i = 0; i < n; i++)
        if (line[i] == '\n') line[i] = ' ';
    line[n++] = '\n';
    write_all(fd, line, (size_t)n); /* the agent may be gone: the exit file tells it all */
    close(fd);
}

static int fail(const struct options *o, const char *message) {
    char quoted[4096], json[4608];
    json_string(message, quoted, sizeof quoted);
    snprintf(json, sizeof json,
             "{\"exit_code\": null, \"signal\": null, \"error\": %s, \"finished_at\": %.6f}",
             quoted, now());
    write_exit_file(o->exit_file, json);
    tell_agent(o->status_fd, "error", message);
    return CANNOT_START;
}

/* The job's environment: NUL-ended ``KEY=VALUE`` entries; the file is removed once read
 * (it holds the user's secrets). Returns a NULL-terminated array, or NULL with ``why``. */
static char **read_env_file(const char *path, char *why, size_t why_size) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_size, "cannot read the job's environment: %s: %s", path,
                 strerror(errno));
        return NULL;
    }
    unlink(path);
    struct stat st;
    char *data = NULL;
    size_t size = 0;
    if (fstat(fd, &st) == 0 && st.st_size >= 0 && st.st_size <= MAX_ENV_BYTES) {
        size = (size_t)st.st_size;
        data = malloc(size + 1);
    }
    size_t got = 0;
    while (data && got < size) {
        ssize_t n = read(fd, data + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (!data || got != size || (size && data[size - 1] != '\0')) {
        free(data);
        snprintf(why, why_size, "cannot read the job's environment: %s is not a list of "
                 "NUL-ended KEY=VALUE entries", path);
        return NULL;
    }
    size_t count = 0;
    for (size_t i = 0; i < size; i++) count += data[i] == '\0';
    char **env = calloc(count + 1, sizeof *env);
    if (!env) {
        snprintf(why, why_size, "cannot read the job's environment: out of memory");
        return NULL;
    }
    size_t k = 0;
    for (char *entry = data; entry < data + size; entry += strlen(entry) + 1) {
        if (entry[0] == '=' || !strchr(entry, '=')) {
            snprintf(why, why_size, "cannot read the job's environment: an entry is not "
                     "KEY=VALUE");
            return NULL;
        }
        env[k++] = entry;
    }
    return env;
}

static int join_cgroup(const char *cgroup, char *why, size_t why_size) {
    char path[PATH_MAX], pid[32];
    if (snprintf(path, sizeof path, "%s/cgroup.procs", cgroup) >= (int)sizeof path) {
        snprintf(why, why_size, "cannot join the job's cgroup %s: path too long", cgroup);
        return -1;
    }
    /* As Python's open(path, "w"): a real cgroup has the file, a test's fake may not. */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (fd < 0 || write_all(fd, pid, (size_t)n) != 0) {
        snprintf(why, why_size, "cannot join the job's cgroup %s: %s", cgroup, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

/* ``PATH`` of the job's environment (Python's os.get_exec_path(env)). */
static const char *exec_path(char **env) {
    for (; *env; env++)
        if (strncmp(*env, "PATH=", 5) == 0) return *env + 5;
    return DEFAULT_PATH;
}

/* In the child: everything fds 3.. closed but ``keep`` (close_fds=True). */
static void close_fds(int keep) {
#ifdef SYS_close_range
    if (keep > 3) syscall(SYS_close_range, 3, keep - 1, 0);
    if (syscall(SYS_close_range, keep + 1, ~0U, 0) == 0) return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    for (int fd = 3; fd < (max > 0 ? max : 1024); fd++)
        if (fd != keep) close(fd);
}

/* In the child, as subprocess.Popen(..., cwd, env, stdin=DEVNULL, close_fds=True,
 * umask=0o077, user, group, extra_groups=[]) does, in its order; on failure the errno
 * and the step go up ``report`` and the child ends. */
static void child(const struct options *o, char **env, int report) {
    struct { int err; int step; } failure = {0, 0};
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
    int null = open("/dev/null", O_RDONLY);
    if (null < 0 || dup2(null, 0) < 0) { failure.step = 1; goto failed; }
    if (null != 0) close(null);
    close_fds(report);
    if (o->cwd && chdir(o->cwd) != 0) { failure.step = 2; goto failed; }
    umask(077);
    if (o->uid >= 0) {
        if (setgroups(0, NULL) != 0 || setregid((gid_t)o->gid, (gid_t)o->gid) != 0 ||
            setreuid((uid_t)o->uid, (uid_t)o->uid) != 0) {
            failure.step = 3;
            goto failed;
        }
    }
    const char *file = o->command[0];
    if (strchr(file, '/')) {
        execve(file, o->command, env);
        failure.err = errno;
    } else {
        /* The first error that is not "not found" wins, as in Python. */
        char *paths = strdup(exec_path(env)), *save = NULL, candidate[PATH_MAX];
        failure.err = ENOENT;
        for (char *dir = strtok_r(paths, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
            if (snprintf(candidate, sizeof candidate, "%s/%s", *dir ? dir : ".", file) >=
                (int)sizeof candidate)
                continue;
            execve(candidate, o->command, env);
            if (errno != ENOENT && errno != ENOTDIR && failure.err == ENOENT) failure.err = errno;
        }
    }
    failure.step = 4;
    if (write(report, &failure, sizeof failure) < 0) _exit(255);
    _exit(255);
failed:
    failure.err = errno;
    if (write(report, &failure, sizeof failure) < 0) _exit(255);
    _exit(255);
}

int main(int argc, char **argv) {
    struct options o = {0};
    int status = parse(argc, argv, &o);
    if (status) return status;

    /* A handler (unlike SIG_IGN) is reset to the default when the child execs. */
    struct sigaction sa = {0};
    sa.sa_handler = ignore;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* A closed status pipe (the agent went away) must not end the wrapper: as in Python,
     * the write fails instead; the command gets the default back (see child()). */
    signal(SIGPIPE, SIG_IGN);

    char why[2048];
    char **env = read_env_file(o.env_file, why, sizeof why);
    if (!env) return fail(&o, why);
    if (o.cgroup && join_cgroup(o.cgroup, why, sizeof why) != 0) return fail(&o, why);

    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) {
        snprintf(why, sizeof why, "cannot start '%s': %s", o.command[0], strerror(errno));
        return fail(&o, why);
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, sizeof why, "cannot start '%s': %s", o.command[0], strerror(errno));
        return fail(&o, why);
    }
    if (pid == 0) {
        close(report[0]);
        close(o.status_fd);
        child(&o, env, report[1]);
    }
    close(report[1]);
    struct { int err; int step; } failure = {0, 0};
    ssize_t n;
    do n = read(report[0], &failure, sizeof failure); while (n < 0 && errno == EINTR);
    close(report[0]);
    if (n == (ssize_t)sizeof failure) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        const char *what = failure.step == 2 ? o.cwd : o.command[0];
        const char *where = failure.step == 1   ? "cannot open /dev/null: "
                            : failure.step == 2 ? "cannot enter the directory "
                            : failure.step == 3 ? "cannot take the job's account: "
                                                : "";
        snprintf(why, sizeof why, "cannot start '%s': %s%s%s%s", o.command[0], where,
                 failure.step == 2 ? what : "", failure.step == 2 ? ": " : "",
                 strerror(failure.err));
        return fail(&o, why);
    }
    char ok[32];
    snprintf(ok, sizeof ok, "%d", (int)pid);
    tell_agent(o.status_fd, "ok", ok);

    int wstatus;
    while (waitpid(pid, &wstatus, 0) < 0)
        if (errno != EINTR) return CANNOT_START;
    char json[256];
    if (WIFSIGNALED(wstatus)) {
        int sig = WTERMSIG(wstatus);
        snprintf(json, sizeof json,
                 "{\"exit_code\": null, \"signal\": %d, \"finished_at\": %.6f}", sig, now());
        write_exit_file(o.exit_file, json);
        return 128 + sig;
    }
    int code = WEXITSTATUS(wstatus);
    snprintf(json, sizeof json, "{\"exit_code\": %d, \"signal\": null, \"finished_at\": %.6f}",
             code, now());
    write_exit_file(o.exit_file, json);
    return code;
}
