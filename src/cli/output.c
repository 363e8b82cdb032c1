/* Output files are written atomically: into a temporary file beside the
 * target, then renamed over it. A failed or interrupted run leaves the
 * previous file intact, or none; never a partial one. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

/* The temporary file's name, for the signal handler. This is the CLI's only
 * static state: a handler cannot be given a context. */
static char pending[4096];

static void on_signal(int sig)
{
    if (pending[0])
        unlink(pending); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

int ml_out_open(ml_out *o, const char *path)
{
    memset(o, 0, sizeof *o);
    if (!path || !strcmp(path, "-")) {
        o->f = stdout;
        return 0;
    }
    /* a device, pipe or socket (/dev/null, /dev/full, a FIFO) is written in
     * place: renaming a temporary over it would replace the node itself */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        if (S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "memledger: error: %s: is a directory\n", path);
            return ML_EXIT_FAILURE;
        }
        snprintf(o->path, sizeof o->path, "%s", path);
        o->f = fopen(path, "w");
        o->direct = true;
        if (!o->f) {
            fprintf(stderr, "memledger: error: %s: %s\n", path, strerror(errno));
            return ML_EXIT_FAILURE;
        }
        return 0;
    }
    int n = snprintf(o->tmp, sizeof o->tmp, "%s.tmp.XXXXXX", path);
    if (n < 0 || (size_t)n >= sizeof o->tmp) {
        fprintf(stderr, "memledger: error: %s: path too long\n", path);
        return ML_EXIT_BAD_INPUT;
    }
    snprintf(o->path, sizeof o->path, "%s", path);
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        fprintf(stderr, "memledger: error: %s: cannot create the output file: %s\n", path,
                strerror(errno));
        return ML_EXIT_FAILURE;
    }
    fchmod(fd, 0644);
    memcpy(pending, o->tmp, sizeof pending);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    o->f = fdopen(fd, "w");
    if (!o->f) {
        close(fd);
        unlink(o->tmp);
        pending[0] = '\0';
        fprintf(stderr, "memledger: error: %s: %s\n", path, strerror(errno));
        return ML_EXIT_FAILURE;
    }
    return 0;
}

int ml_out_close(ml_out *o, bool ok)
{
    if (o->f == stdout) {
        if (fflush(stdout) != 0 || ferror(stdout) || !ok) {
            if (ok)
                fprintf(stderr, "memledger: error: cannot write the report to standard output\n");
            return ML_EXIT_FAILURE;
        }
        return 0;
    }
    int rc = 0;
    if (o->direct) {
        if (fflush(o->f) != 0 || ferror(o->f) || !ok) {
            if (ok)
                fprintf(stderr, "memledger: error: %s: write failed: %s\n", o->path,
                        strerror(errno));
            rc = ML_EXIT_FAILURE;
        }
        if (fclose(o->f) != 0 && !rc) {
            fprintf(stderr, "memledger: error: %s: write failed\n", o->path);
            rc = ML_EXIT_FAILURE;
        }
        return rc;
    }
    if (!ok || fflush(o->f) != 0 || ferror(o->f) || fsync(fileno(o->f)) != 0) {
        if (ok)
            fprintf(stderr, "memledger: error: %s: write failed: %s\n", o->path, strerror(errno));
        rc = ML_EXIT_FAILURE;
    }
    if (fclose(o->f) != 0 && !rc) {
        fprintf(stderr, "memledger: error: %s: write failed: %s\n", o->path, strerror(errno));
        rc = ML_EXIT_FAILURE;
    }
    if (!rc && rename(o->tmp, o->path) != 0) {
        fprintf(stderr, "memledger: error: %s: cannot replace the file: %s\n", o->path,
                strerror(errno));
        rc = ML_EXIT_FAILURE;
    }
    if (rc)
        unlink(o->tmp);
    pending[0] = '\0';
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    return rc;
}
