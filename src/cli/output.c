/* Output files are written atomically: into a temporary file beside the
 * target, then renamed over it. A failed or interrupted run leaves the
 * previous file intact, or none; never a partial one. Devices and FIFOs are
 * written in place, and a symbolic link keeps pointing at the file it
 * names: its target is what gets replaced. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/error.h"

/* The temporary file's name, for the signal handler, and the dispositions
 * it replaced. The CLI's only static state: a handler cannot be given a
 * context. */
static char pending[4096];

/* Signals whose default action ends the process (SIGXFSZ aside, below):
 * each would otherwise leave the temporary behind. */
static const int fatal_signals[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM, SIGPIPE,  SIGALRM,
                                    SIGUSR1, SIGUSR2, SIGXCPU, SIGPROF, SIGVTALRM};
enum { N_FATAL = sizeof fatal_signals / sizeof fatal_signals[0] };
static struct sigaction saved[N_FATAL], saved_xfsz;
static bool caught[N_FATAL], xfsz_ignored;

static void on_signal(int sig)
{
    if (pending[0])
        unlink(pending); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when the handler returns: the process ends by sig */
}

static void fatal_set(sigset_t *set)
{
    sigemptyset(set);
    for (size_t i = 0; i < N_FATAL; i++)
        sigaddset(set, fatal_signals[i]);
}

/* Installs the handler for each fatal signal, except one ignored when the
 * temporary was made (nohup, a scheduler's SIG_IGN: the caller asked for the
 * run to survive it). A file over RLIMIT_FSIZE would kill the process with
 * SIGXFSZ, the temporary left behind: ignored, the write fails with EFBIG
 * and the ordinary error path removes it. Called with the signals blocked. */
static void arm(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    fatal_set(&sa.sa_mask);
    for (size_t i = 0; i < N_FATAL; i++) {
        caught[i] = false;
        if (sigaction(fatal_signals[i], NULL, &saved[i]) != 0 || saved[i].sa_handler == SIG_IGN)
            continue;
        caught[i] = sigaction(fatal_signals[i], &sa, NULL) == 0;
    }
    xfsz_ignored = false;
    if (sigaction(SIGXFSZ, NULL, &saved_xfsz) == 0 && saved_xfsz.sa_handler == SIG_DFL) {
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigemptyset(&ign.sa_mask);
        xfsz_ignored = sigaction(SIGXFSZ, &ign, NULL) == 0;
    }
}

/* The dispositions arm() found, back. */
static void disarm(void)
{
    sigset_t block, old;
    fatal_set(&block);
    sigprocmask(SIG_BLOCK, &block, &old);
    pending[0] = '\0';
    for (size_t i = 0; i < N_FATAL; i++)
        if (caught[i])
            sigaction(fatal_signals[i], &saved[i], NULL);
    if (xfsz_ignored)
        sigaction(SIGXFSZ, &saved_xfsz, NULL);
    memset(caught, 0, sizeof caught);
    xfsz_ignored = false;
    sigprocmask(SIG_SETMASK, &old, NULL);
}

void ml_cli_put_safe(FILE *f, const char *s, size_t len, bool lines)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        /* C1 controls (U+0080..U+009F, CSI among them) in UTF-8: C2 80..C2 9F */
        if (c == 0xc2 && i + 1 < len && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f) {
            fprintf(f, "\\x%02x\\x%02x", c, p[i + 1]);
            i++;
        } else if ((c < 0x20 && !(c == '\n' && lines) && c != '\t') || c == 0x7f) {
            fprintf(f, "\\x%02x", c);
        } else {
            fputc(c, f);
        }
    }
}

void ml_cli_errorf(const char *fmt, ...)
{
    char msg[3 * 4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    fputs("memledger: error: ", stderr);
    ml_cli_put_safe(stderr, msg, len, false);
    fputc('\n', stderr);
}

int ml_out_refuse_input(const char *out, const char *in)
{
    struct stat so, si;
    if (!out || !in || !strcmp(out, "-") || !strcmp(in, "-"))
        return 0;
    /* a model's folder (--hf FOLDER) is read as its config.json */
    char cfg[4096];
    in = ml__hf_config_in(in, cfg, sizeof cfg);
    if (stat(out, &so) != 0 || stat(in, &si) != 0)
        return 0;
    if (so.st_dev != si.st_dev || so.st_ino != si.st_ino)
        return 0;
    ml_cli_errorf("-o %s is the input file %s: choose another output file", out, in);
    return ML_EXIT_BAD_INPUT;
}

/* The file a chain of symbolic links ends at, into out (path itself when
 * it is no link; the end need not exist). 0 or an errno value. */
static int resolve_links(const char *path, char *out, size_t cap)
{
    if ((size_t)snprintf(out, cap, "%s", path) >= cap)
        return ENAMETOOLONG;
    for (int hops = 0; hops < 40; hops++) {
        struct stat lb;
        if (lstat(out, &lb) != 0 || !S_ISLNK(lb.st_mode))
            return 0;
        char link[4096];
        ssize_t n = readlink(out, link, sizeof link - 1);
        if (n < 0)
            return errno;
        link[n] = '\0';
        /* a relative target is relative to the link's folder */
        const char *slash = strrchr(out, '/');
        size_t dl = link[0] == '/' || !slash ? 0 : (size_t)(slash - out) + 1;
        if (dl + (size_t)n + 1 > cap)
            return ENAMETOOLONG;
        memcpy(out + dl, link, (size_t)n + 1);
    }
    return ELOOP;
}

/* The mode the finished file gets: the replaced file's permissions, or
 * what open(2) would give a new file (0666 less the umask). mkstemp makes
 * 0600 whatever the umask. */
static mode_t final_mode(const struct stat *old)
{
    if (old)
        return old->st_mode & 0777;
    mode_t mask = umask(0);
    umask(mask);
    return 0666 & ~mask;
}

/* A device, pipe or socket (/dev/null, /dev/full, a FIFO), also through a
 * link, is written in place: renaming a temporary over it would replace the
 * node itself. sb: path's stat. */
static int open_in_place(ml_out *o, const char *path, const struct stat *sb)
{
    if (S_ISDIR(sb->st_mode)) {
        ml_cli_errorf("%s: is a directory", path);
        return ML_EXIT_FAILURE;
    }
    snprintf(o->path, sizeof o->path, "%s", path);
    o->f = fopen(path, "w");
    o->direct = true;
    if (!o->f) {
        ml_cli_errorf("%s: %s", path, strerror(errno));
        return ML_EXIT_FAILURE;
    }
    errno = 0;
    return 0;
}

/* o->tmp: the temporary next to o->path. Its name fits the folder's name
 * limit (NAME_MAX, 255 bytes on Linux file systems) whatever the output's:
 * the name is cut short. */
static int temp_name(ml_out *o, const char *path)
{
    static const char suffix[] = ".tmp.XXXXXX";
    const char *slash = strrchr(o->path, '/');
    size_t dl = slash ? (size_t)(slash - o->path) + 1 : 0;
    size_t bl = strlen(o->path + dl);
    long name_max = 255;
    {
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", dl ? (int)dl : 1, dl ? o->path : ".");
        long pc = pathconf(dir, _PC_NAME_MAX);
        if (pc > (long)sizeof suffix && pc < name_max)
            name_max = pc;
    }
    if (bl > (size_t)name_max - (sizeof suffix - 1))
        bl = (size_t)name_max - (sizeof suffix - 1);
    int n = snprintf(o->tmp, sizeof o->tmp, "%.*s%.*s%s", (int)dl, o->path, (int)bl,
                     o->path + dl, suffix);
    if (n < 0 || (size_t)n >= sizeof o->tmp) {
        ml_cli_errorf("%s: path too long", path);
        return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

/* The temporary o->tmp created (removed on a fatal signal until closed),
 * with the mode and group of the file it replaces, opened as o->f. */
static int open_temp(ml_out *o, const char *path)
{
    struct stat tb;
    bool replacing = stat(o->path, &tb) == 0 && S_ISREG(tb.st_mode);
    mode_t mode = final_mode(replacing ? &tb : NULL);
    /* no signal between making the temporary and arming its removal */
    sigset_t block, old;
    fatal_set(&block);
    sigprocmask(SIG_BLOCK, &block, &old);
    int fd = mkstemp(o->tmp);
    int err = errno;
    if (fd >= 0) {
        memcpy(pending, o->tmp, sizeof pending);
        arm();
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd < 0) {
        /* the file is written beside its place, then renamed: say so, as
         * the error is the temporary's (a directory such as /proc takes
         * no new file) */
        ml_cli_errorf("%s: cannot create the output file (written as a temporary file beside "
                      "it, then renamed): %s",
                      path, strerror(err));
        return ML_EXIT_FAILURE;
    }
    /* the group too, where the owner may; if not, the group bits would
     * apply to another group: dropped */
    if (replacing && fchown(fd, (uid_t)-1, tb.st_gid) != 0)
        mode &= ~(mode_t)070;
    fchmod(fd, mode);
    o->f = fdopen(fd, "w");
    if (!o->f) {
        err = errno;
        close(fd);
        unlink(o->tmp);
        disarm();
        ml_cli_errorf("%s: %s", path, strerror(err));
        return ML_EXIT_FAILURE;
    }
    errno = 0;
    return 0;
}

int ml_out_open(ml_out *o, const char *path)
{
    memset(o, 0, sizeof *o);
    if (!path || !strcmp(path, "-")) {
        o->f = stdout;
        return 0;
    }
    /* the path names standard output's file (/dev/stdout, /dev/fd/1, or the
     * file stdout is redirected to): write to stdout itself, where the
     * shell's > or >> put it */
    struct stat sb, so;
    bool exists = stat(path, &sb) == 0;
    if (exists && fstat(STDOUT_FILENO, &so) == 0 && sb.st_dev == so.st_dev &&
        sb.st_ino == so.st_ino) {
        o->f = stdout;
        return 0;
    }
    if (exists && !S_ISREG(sb.st_mode))
        return open_in_place(o, path, &sb);
    /* a symbolic link keeps pointing at its file: replace the target */
    int why = resolve_links(path, o->path, sizeof o->path);
    if (why) {
        ml_cli_errorf("%s: cannot create the output file: %s", path, strerror(why));
        return ML_EXIT_FAILURE;
    }
    int rc = temp_name(o, path);
    return rc ? rc : open_temp(o, path);
}

/* Whether s holds a byte that ml_cli_put_safe would escape (or the lead of
 * a C1 control): only such a name needs its occurrences found. */
static bool needs_escape(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f || *p == 0xc2)
            return true;
    return false;
}

/* The buffered prose: escaped, and each occurrence of a name on one line. */
static void put_text(FILE *f, const char *text, size_t len, const char *const *names, size_t nn)
{
    size_t from = 0;
    for (size_t i = 0; i < len; i++)
        for (size_t k = 0; k < nn; k++) {
            size_t nl = strlen(names[k]);
            if (nl && nl <= len - i && !memcmp(text + i, names[k], nl)) {
                ml_cli_put_safe(f, text + from, i - from, true);
                ml_cli_put_safe(f, names[k], nl, false);
                i += nl - 1;
                from = i + 1;
                break;
            }
        }
    ml_cli_put_safe(f, text + from, len - from, true);
}

int ml_out_text(ml_out *o, const char *name)
{
    memset(o->names, 0, sizeof o->names);
    if (name && needs_escape(name))
        o->names[0] = name;
    o->text = NULL;
    o->text_len = 0;
    FILE *m = open_memstream(&o->text, &o->text_len);
    if (!m) {
        ml_out_close(o, false);
        return ML_EXIT_FAILURE;
    }
    o->raw = o->f;
    o->f = m;
    errno = 0;
    return 0;
}

int ml_out_open_report(ml_out *o, const char *path, bool text, const ml_model *m,
                       const ml_config *cfg)
{
    int rc = ml_out_open(o, path);
    return !rc && text ? ml_out_text_model(o, m, cfg) : rc;
}

int ml_out_text_model(ml_out *o, const ml_model *m, const ml_config *cfg)
{
    int rc = ml_out_text(o, ml_model_name(m));
    if (rc || !cfg->calib)
        return rc;
    static const char *const keys[] = {"name", "device", "precision"};
    size_t n = o->names[0] ? 1 : 0;
    for (size_t k = 0; k < 3; k++) {
        const char *v = ml_profile_get(cfg->calib, keys[k]);
        if (v && needs_escape(v))
            o->names[n++] = v;
    }
    return 0;
}

int ml_out_close(ml_out *o, bool ok)
{
    int err = errno; /* a writer that failed left its last failed write's cause */
    if (o->raw) {
        /* the text, made safe, to the real stream */
        FILE *mem = o->f;
        bool mem_failed = ferror(mem) != 0;
        o->f = o->raw;
        o->raw = NULL;
        if (fclose(mem) != 0 || mem_failed || !o->text) {
            ok = false;
            err = ENOMEM;
        } else if (ok) {
            errno = 0;
            size_t nn = 0;
            while (nn < sizeof o->names / sizeof o->names[0] && o->names[nn])
                nn++;
            put_text(o->f, o->text, o->text_len, o->names, nn);
            err = errno;
        }
        free(o->text);
        o->text = NULL;
    }
    bool to_stdout = o->f == stdout, atomic = !to_stdout && !o->direct;
    int rc = ok ? 0 : ML_EXIT_FAILURE;
    if (fflush(o->f) != 0) {
        err = errno;
        rc = ML_EXIT_FAILURE;
    }
    if (ferror(o->f))
        rc = ML_EXIT_FAILURE;
    if (!rc && atomic && fsync(fileno(o->f)) != 0) {
        err = errno;
        rc = ML_EXIT_FAILURE;
    }
    if (!to_stdout && fclose(o->f) != 0 && !rc) {
        err = errno;
        rc = ML_EXIT_FAILURE;
    }
    o->f = NULL;
    if (rc) {
        /* every failure says why: a full disk is "No space left on device" */
        const char *why = err ? strerror(err) : "the report writer failed";
        if (to_stdout)
            ml_cli_errorf("cannot write the report to standard output: %s", why);
        else
            ml_cli_errorf("%s: write failed: %s", o->path, why);
    } else if (atomic && rename(o->tmp, o->path) != 0) {
        ml_cli_errorf("%s: cannot replace the file: %s", o->path, strerror(errno));
        rc = ML_EXIT_FAILURE;
    }
    if (atomic) {
        if (rc)
            unlink(o->tmp);
        disarm();
    }
    return rc;
}

/* The offending line is shown only from a regular file: a FIFO, a pipe or
 * a terminal cannot be read twice, and opening one may block. stat first,
 * then open without blocking and check what was opened. */
static FILE *open_regular(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return NULL;
    FILE *f = NULL;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode))
        f = fdopen(fd, "rb");
    if (!f)
        close(fd);
    return f;
}

void ml_cli_print_error(const ml_error *e)
{
    if (e->line)
        ml_cli_errorf("%s:%u:%u: %s", e->path, e->line, e->col, e->msg);
    else if (e->path[0])
        ml_cli_errorf("%s: %s", e->path, e->msg);
    else
        ml_cli_errorf("%s", e->msg);
    if (!e->line || !e->path[0])
        return;
    FILE *f = open_regular(e->path);
    if (!f)
        return;
    char buf[512];
    unsigned line = 1;
    while (fgets(buf, sizeof buf, f)) {
        size_t len = strlen(buf);
        bool whole = len && buf[len - 1] == '\n';
        if (line == e->line) {
            while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
                buf[--len] = '\0';
            fputs("  ", stderr);
            ml_cli_put_safe(stderr, buf, len, false);
            fputs("\n  ", stderr);
            /* the caret under column col (characters, as the YAML parser
             * counts them): a tab stays a tab, an escaped byte takes the
             * width of its \xNN */
            unsigned ch = 1;
            for (size_t i = 0; i < len && ch < e->col; i++) {
                unsigned char c = (unsigned char)buf[i];
                if ((c & 0xc0) == 0x80)
                    continue; /* a UTF-8 continuation byte */
                if (c == '\t')
                    fputc('\t', stderr);
                else if (c < 0x20 || c == 0x7f)
                    fputs("    ", stderr);
                else if (c == 0xc2 && i + 1 < len && (unsigned char)buf[i + 1] <= 0x9f &&
                         (unsigned char)buf[i + 1] >= 0x80)
                    fputs("        ", stderr);
                else
                    fputc(' ', stderr);
                ch++;
            }
            fputs("^\n", stderr);
            break;
        }
        if (whole)
            line++;
    }
    fclose(f);
}
