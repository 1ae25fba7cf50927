/*
 * NVML test library: libnvidia-ml.so.1 serving a recorded trace (docs/trace-format.md).
 *
 * A test aid, loaded instead of NVIDIA's library through LD_LIBRARY_PATH. Environment:
 *   NVML_TESTLIB_TRACE        path of the trace (unset: nvmlInit* -> NVML_ERROR_DRIVER_NOT_LOADED)
 *   NVML_TESTLIB_SAMPLE_FILE  optional file holding the current sample index (re-read on each call)
 *   NVML_TESTLIB_SPEED        trace seconds per wall-clock second (default 1.0, wall-clock mode)
 *   NVML_TESTLIB_FAULTS       optional "fn=NVMLError_X[@N],...": errors no trace sample can say
 * GPM (nvmlGpm*): at the end of the file; the trace's per-GPU "gpm" object.
 * See tests/nvml/README.md. One mutex guards all state; nvmlEventSetWait_v2 waits on a
 * condition variable in short slices so that it sees the trace move.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nvml_subset.h"

#define MAX_GPUS 64
#define MAX_MIG 16
#define MAX_SETS 64
#define SET_QUEUE 256
#define SAMPLE_RING 100
#define POLL_MS 20

/* Handles: static storage, so the same pointer for the same device for the whole process. */
struct nvmlDevice_st {
    int gpu;  /* parent GPU index */
    int mig;  /* MIG slot, -1 for a whole GPU */
};

struct event_rec {
    int gpu;
    unsigned long long xid;
};

struct nvmlEventSet_st {
    int in_use;
    unsigned long long generation;
    long long cursor; /* absolute sample position up to which events were considered */
    unsigned long long types[MAX_GPUS];
    struct event_rec queue[SET_QUEUE];
    int head, len;
};

static struct nvmlDevice_st g_gpu_handles[MAX_GPUS];
static struct nvmlDevice_st g_mig_handles[MAX_GPUS][MAX_MIG];
static struct nvmlEventSet_st g_sets[MAX_SETS];

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int g_refcount;
static unsigned long long g_init_generation; /* bumped when the refcount drops to 0 */
static cJSON *g_root;
static char *g_trace_path;
static const cJSON *g_samples;
static int g_nsamples;
static double *g_t; /* samples[i].t */
static double g_period;
static int g_clock_started;
static struct timespec g_mono_base;
static unsigned long long g_base_us; /* CLOCK_REALTIME at the first nvmlInit, in µs */
static long long g_file_pos;         /* last index read from the sample file */

static void init_once(void)
{
    pthread_condattr_t attr;
    int i, j;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cond, &attr);
    pthread_condattr_destroy(&attr);
    for (i = 0; i < MAX_GPUS; i++) {
        g_gpu_handles[i].gpu = i;
        g_gpu_handles[i].mig = -1;
        for (j = 0; j < MAX_MIG; j++) {
            g_mig_handles[i][j].gpu = i;
            g_mig_handles[i][j].mig = j;
        }
    }
}

static void lock(void)
{
    pthread_once(&g_once, init_once);
    pthread_mutex_lock(&g_lock);
}

static void unlock(void) { pthread_mutex_unlock(&g_lock); }

/* ---------------------------------------------------------------- errors */

struct err_entry {
    nvmlReturn_t code;
    const char *name;   /* pynvml's exception class name */
    const char *string; /* nvmlErrorString */
};

static const struct err_entry g_errors[] = {
    {NVML_SUCCESS, "NVMLError_Success", "Success"},
    {NVML_ERROR_UNINITIALIZED, "NVMLError_Uninitialized", "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "NVMLError_InvalidArgument", "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "NVMLError_NotSupported", "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "NVMLError_NoPermission", "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "NVMLError_AlreadyInitialized", "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "NVMLError_NotFound", "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "NVMLError_InsufficientSize", "Insufficient Size"},
    {NVML_ERROR_INSUFFICIENT_POWER, "NVMLError_InsufficientPower", "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded", "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "NVMLError_Timeout", "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "NVMLError_IrqIssue", "Interrupt Request Issue"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound", "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "NVMLError_FunctionNotFound", "Function Not Found"},
    {NVML_ERROR_CORRUPTED_INFOROM, "NVMLError_CorruptedInforom", "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost", "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "NVMLError_ResetRequired", "GPU requires restart"},
    {NVML_ERROR_OPERATING_SYSTEM, "NVMLError_OperatingSystem",
     "The operating system has blocked the request."},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "NVMLError_LibRmVersionMismatch",
     "RM has detected an NVML/RM version mismatch."},
    {NVML_ERROR_IN_USE, "NVMLError_InUse", "In use by another client"},
    {NVML_ERROR_MEMORY, "NVMLError_Memory", "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "NVMLError_NoData", "No data"},
    {NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "NVMLError_VgpuEccNotSupported",
     "The requested vgpu operation is not available on target device, becasue ECC is enabled"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "NVMLError_InsufficientResources", "Insufficient resources"},
    {NVML_ERROR_FREQ_NOT_SUPPORTED, "NVMLError_FreqNotSupported", "Frequency not supported"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "NVMLError_ArgumentVersionMismatch",
     "Argument version mismatch"},
    {NVML_ERROR_DEPRECATED, "NVMLError_Deprecated", "Deprecated"},
    {NVML_ERROR_NOT_READY, "NVMLError_NotReady", "Not ready"},
    {NVML_ERROR_GPU_NOT_FOUND, "NVMLError_GpuNotFound", "GPU not found"},
    {NVML_ERROR_INVALID_STATE, "NVMLError_InvalidState", "Invalid state"},
    {NVML_ERROR_RESET_TYPE_NOT_SUPPORTED, "NVMLError_ResetTypeNotSupported", "Reset type not supported"},
    {NVML_ERROR_UNKNOWN, "NVMLError_Unknown", "Unknown Error"},
};

#define N_ERRORS (sizeof(g_errors) / sizeof(g_errors[0]))

DECLDIR const char *nvmlErrorString(nvmlReturn_t result)
{
    size_t i;
    for (i = 0; i < N_ERRORS; i++)
        if (g_errors[i].code == result)
            return g_errors[i].string;
    return "Unknown Error";
}

static nvmlReturn_t code_of_name(const char *name)
{
    size_t i;
    if (name == NULL)
        return NVML_ERROR_UNKNOWN;
    for (i = 1; i < N_ERRORS; i++)
        if (strcmp(g_errors[i].name, name) == 0)
            return g_errors[i].code;
    return NVML_ERROR_UNKNOWN;
}

/* {"nvml_error": "NVMLError_X", ...} -> its code; anything else -> NVML_SUCCESS */
static nvmlReturn_t recorded_error(const cJSON *item)
{
    const cJSON *err;
    if (!cJSON_IsObject(item))
        return NVML_SUCCESS;
    err = cJSON_GetObjectItemCaseSensitive(item, "nvml_error");
    if (err == NULL)
        return NVML_SUCCESS;
    return code_of_name(cJSON_IsString(err) ? err->valuestring : NULL);
}

/* ---------------------------------------------------------------- injected faults */

/*
 * NVML_TESTLIB_FAULTS="fn=NVMLError_X[@N],...": the exported function fn answers X, doing
 * nothing else, from its (N+1)-th call on (N = 0: every call). For what no trace sample can
 * say: a failing nvmlShutdown, event set, event wait or UUID. Parsed at the first call.
 */
#define MAX_FAULTS 16
struct fault {
    char fn[64];
    nvmlReturn_t code;
    long after, calls;
};
static struct fault g_faults[MAX_FAULTS];
static int g_nfaults = -1;

static void parse_faults(void)
{
    const char *env = getenv("NVML_TESTLIB_FAULTS");
    char *copy, *tok, *save = NULL, *eq, *at;
    g_nfaults = 0;
    if (env == NULL || (copy = strdup(env)) == NULL)
        return;
    for (tok = strtok_r(copy, ",", &save); tok && g_nfaults < MAX_FAULTS; tok = strtok_r(NULL, ",", &save)) {
        struct fault *f = &g_faults[g_nfaults];
        if ((eq = strchr(tok, '=')) == NULL) {
            fprintf(stderr, "nvml-testlib: NVML_TESTLIB_FAULTS: %s is not fn=NVMLError_X[@N]\n", tok);
            continue;
        }
        *eq = '\0';
        if ((at = strchr(eq + 1, '@')) != NULL)
            *at = '\0';
        snprintf(f->fn, sizeof(f->fn), "%s", tok);
        f->code = code_of_name(eq + 1);
        f->after = at ? atol(at + 1) : 0;
        f->calls = 0;
        g_nfaults++;
    }
    free(copy);
}

/* Under the lock: the error injected into this call of fn, or NVML_SUCCESS. */
static nvmlReturn_t injected(const char *fn)
{
    int i;
    if (g_nfaults < 0)
        parse_faults();
    for (i = 0; i < g_nfaults; i++)
        if (strcmp(g_faults[i].fn, fn) == 0)
            return g_faults[i].calls++ >= g_faults[i].after ? g_faults[i].code : NVML_SUCCESS;
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- trace */

static const cJSON *get(const cJSON *obj, const char *key)
{
    return obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

static double num(const cJSON *obj, const char *key, double dflt)
{
    const cJSON *v = get(obj, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static unsigned long long to_ull(const cJSON *v)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return 0;
    return (unsigned long long)llround(v->valuedouble);
}

static void free_trace(void)
{
    cJSON_Delete(g_root);
    g_root = NULL;
    free(g_t);
    g_t = NULL;
    free(g_trace_path);
    g_trace_path = NULL;
    g_samples = NULL;
    g_nsamples = 0;
}

static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, len = 0, n;
    if (f == NULL)
        return NULL;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            char *nb;
            cap = cap ? cap * 2 : 1 << 20;
            nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    *size = len;
    return buf;
}

/*
 * cJSON keeps a number as a double, which holds integers exactly only up to 2^53; a CPU mask
 * word (devices[].cpu_affinity, 64 CPUs a word) needs all 64 bits. Before parsing, the numbers
 * of every "cpu_affinity": [...] array are put in quotes, so that they reach the library as
 * strings and are read with strtoull. A new buffer (NUL-terminated, *size updated); NULL when
 * out of memory.
 */
static char *quote_affinity_words(const char *text, size_t *size)
{
    static const char key[] = "\"cpu_affinity\"";
    const size_t klen = sizeof(key) - 1;
    size_t n = *size, i = 0, o = 0, count = 0;
    const char *p;
    char *out;
    for (p = text; (p = strstr(p, key)) != NULL; p += klen)
        count++;
    out = malloc(n + 1 + count * 2 * 64 + 1); /* at most 64 numbers a key are quoted */
    if (out == NULL)
        return NULL;
    while (i < n) {
        size_t quoted = 0;
        if (text[i] != '"' || n - i < klen || memcmp(text + i, key, klen) != 0) {
            out[o++] = text[i++];
            continue;
        }
        memcpy(out + o, key, klen);
        o += klen;
        i += klen;
#define COPY_SPACE                                                                                 \
    while (i < n && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))      \
        out[o++] = text[i++];
        COPY_SPACE
        if (i >= n || text[i] != ':')
            continue;
        out[o++] = text[i++];
        COPY_SPACE
        if (i >= n || text[i] != '[')
            continue;
        out[o++] = text[i++];
        for (;;) {
            COPY_SPACE
            if (i < n && (text[i] == '-' || (text[i] >= '0' && text[i] <= '9')) && quoted < 64) {
                out[o++] = '"';
                while (i < n && strchr("0123456789+-.eE", text[i]) != NULL)
                    out[o++] = text[i++];
                out[o++] = '"';
                quoted++;
                COPY_SPACE
            }
            if (i < n && text[i] == ',') {
                out[o++] = text[i++];
                continue;
            }
            break; /* ']' or anything else: copied as it is by the outer loop */
        }
#undef COPY_SPACE
    }
    out[o] = '\0';
    *size = o;
    return out;
}

/* Load the trace named by NVML_TESTLIB_TRACE (once; again if the path changed while down). */
static nvmlReturn_t load_trace(void)
{
    const char *path = getenv("NVML_TESTLIB_TRACE");
    char *text, *quoted;
    size_t size = 0;
    cJSON *root;
    const cJSON *samples, *s;
    int i;

    if (path == NULL || path[0] == '\0')
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (g_root != NULL && g_trace_path != NULL && strcmp(g_trace_path, path) == 0)
        return NVML_SUCCESS;
    if (g_root != NULL && g_refcount > 0)
        return NVML_SUCCESS; /* never swap the trace under a live session */
    text = read_file(path, &size);
    if (text == NULL) {
        fprintf(stderr, "nvml-testlib: cannot read trace %s: %s\n", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    quoted = quote_affinity_words(text, &size);
    free(text);
    root = quoted ? cJSON_ParseWithLength(quoted, size) : NULL;
    free(quoted);
    samples = get(root, "samples");
    if (root == NULL || !cJSON_IsArray(samples) || cJSON_GetArraySize(samples) == 0 ||
        !cJSON_IsArray(get(root, "devices"))) {
        fprintf(stderr, "nvml-testlib: %s is not a trace (docs/trace-format.md)\n", path);
        cJSON_Delete(root);
        return NVML_ERROR_UNKNOWN;
    }
    if (num(root, "format_version", 1) > 3) {
        fprintf(stderr, "nvml-testlib: %s: unknown format_version\n", path);
        cJSON_Delete(root);
        return NVML_ERROR_UNKNOWN;
    }
    free_trace();
    g_root = root;
    g_trace_path = strdup(path);
    g_samples = samples;
    g_nsamples = cJSON_GetArraySize(samples);
    g_t = calloc((size_t)g_nsamples, sizeof(double));
    i = 0;
    cJSON_ArrayForEach(s, samples) g_t[i++] = num(s, "t", 0.0);
    g_period = g_t[g_nsamples - 1] + num(root, "interval_s", 0.0);
    g_file_pos = 0;
    return NVML_SUCCESS;
}

static int device_count(void)
{
    int n = (int)num(g_root, "device_count", cJSON_GetArraySize(get(g_root, "devices")));
    if (n < 0)
        n = 0;
    return n > MAX_GPUS ? MAX_GPUS : n;
}

static const cJSON *find_index(const cJSON *array, int index)
{
    const cJSON *e;
    if (!cJSON_IsArray(array))
        return NULL;
    cJSON_ArrayForEach(e, array)
    {
        const cJSON *ix = get(e, "index");
        if (cJSON_IsNumber(ix) && ix->valueint == index)
            return e;
    }
    return NULL;
}

static const cJSON *device_facts(int gpu) { return find_index(get(g_root, "devices"), gpu); }

static const cJSON *sample_at(long long pos);

/*
 * A GPU's MIG mode [current, pending] while the sample at g_pos is current: that sample's
 * reading's `mig_mode` when it is one (a mode changed at runtime), else the device's static
 * `mig_mode` (also while the reading's is an error: nvmlDeviceGetMigMode fails, the GPU's MIG
 * devices stay as they were). g_pos is set by enter(), under the lock.
 */
static long long g_pos;

static const cJSON *mig_mode_now(int gpu)
{
    const cJSON *reading = find_index(get(sample_at(g_pos), "gpus"), gpu);
    const cJSON *mode = get(reading, "mig_mode");
    return cJSON_IsArray(mode) ? mode : get(device_facts(gpu), "mig_mode");
}

/* MIG devices exist while the current mode is 1 (nvml.h: the pending mode is the mode after
 * the next activation trigger, a GPU reset; it changes nothing until then). */
static int mig_enabled(int gpu)
{
    const cJSON *mode = mig_mode_now(gpu);
    const cJSON *cur = cJSON_IsArray(mode) ? cJSON_GetArrayItem(mode, 0) : NULL;
    return cJSON_IsNumber(cur) && cur->valueint == 1;
}

static const cJSON *mig_facts(int gpu, int slot)
{
    if (!mig_enabled(gpu))
        return NULL;
    return find_index(get(device_facts(gpu), "mig_devices"), slot);
}

/* ---------------------------------------------------------------- time */

static double mono_s(const struct timespec *a, const struct timespec *b)
{
    return (double)(a->tv_sec - b->tv_sec) + (double)(a->tv_nsec - b->tv_nsec) / 1e9;
}

static void start_clock(void)
{
    struct timespec rt;
    if (g_clock_started)
        return;
    clock_gettime(CLOCK_MONOTONIC, &g_mono_base);
    clock_gettime(CLOCK_REALTIME, &rt);
    g_base_us = (unsigned long long)rt.tv_sec * 1000000ULL + (unsigned long long)rt.tv_nsec / 1000ULL;
    g_clock_started = 1;
}

static int file_mode(void)
{
    const char *p = getenv("NVML_TESTLIB_SAMPLE_FILE");
    return p != NULL && p[0] != '\0';
}

/* The current absolute sample position: loop * nsamples + index. */
static long long current_pos(void)
{
    const char *path = getenv("NVML_TESTLIB_SAMPLE_FILE");
    if (path != NULL && path[0] != '\0') {
        char buf[64];
        ssize_t n;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            n = read(fd, buf, sizeof(buf) - 1);
            close(fd);
            if (n > 0) {
                char *end;
                long long v;
                buf[n] = '\0';
                errno = 0;
                v = strtoll(buf, &end, 10);
                if (end != buf && errno == 0)
                    g_file_pos = v < 0 ? 0 : (v >= g_nsamples ? g_nsamples - 1 : v);
            }
        }
        return g_file_pos;
    } else {
        struct timespec now;
        const char *sp = getenv("NVML_TESTLIB_SPEED");
        double speed = sp ? atof(sp) : 1.0, tt;
        long long loop = 0;
        int lo, hi;
        if (!(speed > 0))
            speed = 1.0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        tt = mono_s(&now, &g_mono_base) * speed;
        if (g_period > 0) {
            loop = (long long)floor(tt / g_period);
            tt -= (double)loop * g_period;
        }
        /* the last sample with t <= tt (binary search), or 0 */
        lo = 0;
        hi = g_nsamples - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (g_t[mid] <= tt)
                lo = mid;
            else
                hi = mid - 1;
        }
        return loop * g_nsamples + lo;
    }
}

static const cJSON *sample_at(long long pos) { return cJSON_GetArrayItem(g_samples, (int)(pos % g_nsamples)); }

/* Trace time of a position, unwrapped over the loops, in µs since the epoch. */
static unsigned long long timestamp_us(long long pos)
{
    long long loop = pos / g_nsamples;
    double t = g_t[pos % g_nsamples] + (file_mode() ? 0.0 : (double)loop * g_period);
    if (t < 0)
        t = 0;
    return g_base_us + (unsigned long long)llround(t * 1e6);
}

/* ---------------------------------------------------------------- events */

static void set_push(struct nvmlEventSet_st *set, int gpu, unsigned long long xid)
{
    if (set->len == SET_QUEUE) { /* full: drop the oldest */
        set->head = (set->head + 1) % SET_QUEUE;
        set->len--;
    }
    set->queue[(set->head + set->len) % SET_QUEUE].gpu = gpu;
    set->queue[(set->head + set->len) % SET_QUEUE].xid = xid;
    set->len++;
}

/* Hand the set the Xid events of the samples in (cursor, pos]. */
static void deliver(struct nvmlEventSet_st *set, long long pos)
{
    long long p, from;
    if (pos <= set->cursor) {
        set->cursor = pos; /* the sample file moved back: nothing to deliver */
        return;
    }
    from = set->cursor + 1;
    if (pos - from > 4LL * g_nsamples) /* a long sleep in wall-clock mode: the last loops only */
        from = pos - 4LL * g_nsamples;
    for (p = from; p <= pos; p++) {
        const cJSON *ev, *xids = get(sample_at(p), "xid_events");
        if (!cJSON_IsArray(xids))
            continue;
        cJSON_ArrayForEach(ev, xids)
        {
            int gpu = (int)num(ev, "index", -1);
            if (gpu >= 0 && gpu < MAX_GPUS && (set->types[gpu] & nvmlEventTypeXidCriticalError))
                set_push(set, gpu, to_ull(get(ev, "xid")));
        }
    }
    set->cursor = pos;
}

/* ---------------------------------------------------------------- lifecycle */

static nvmlReturn_t do_init(const char *fn)
{
    nvmlReturn_t ret;
    const cJSON *sample;
    lock();
    ret = injected(fn);
    if (ret == NVML_SUCCESS)
        ret = load_trace();
    if (ret == NVML_SUCCESS) {
        start_clock();
        sample = sample_at(current_pos());
        ret = recorded_error(sample);
        if (ret == NVML_SUCCESS)
            g_refcount++;
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }

DECLDIR nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}

DECLDIR nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret;
    lock();
    if ((ret = injected("nvmlShutdown")) != NVML_SUCCESS) {
        /* the injected error: nothing released */
    } else if (g_refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (--g_refcount == 0) {
        g_init_generation++;
        pthread_cond_broadcast(&g_cond); /* wake nvmlEventSetWait_v2 */
    }
    unlock();
    return ret;
}

/* Entry of every call but init/shutdown/errorString: initialised, and the driver there? */
static nvmlReturn_t enter(long long *pos)
{
    long long p;
    if (g_refcount == 0 || g_root == NULL)
        return NVML_ERROR_UNINITIALIZED;
    p = current_pos();
    g_pos = p;
    if (pos)
        *pos = p;
    return recorded_error(sample_at(p));
}

static int valid_handle(nvmlDevice_t d)
{
    if (d == NULL)
        return 0;
    if (d >= &g_gpu_handles[0] && d < &g_gpu_handles[MAX_GPUS])
        return d->gpu < device_count();
    if (d >= &g_mig_handles[0][0] && d <= &g_mig_handles[MAX_GPUS - 1][MAX_MIG - 1])
        return d->gpu < device_count() && mig_facts(d->gpu, d->mig) != NULL;
    return 0;
}

/*
 * Entry of a per-device call, under the lock: the handle's static facts (devices[] entry or
 * mig_devices[] entry), its reading in the current sample (GPU reading, or MIG reading of a
 * MIG handle) and, for a MIG handle, the parent's reading.
 */
struct ctx {
    long long pos;
    const cJSON *facts;   /* devices[] entry, or devices[].mig_devices[] entry */
    const cJSON *reading; /* samples[].gpus[] entry, or its mig_devices[] entry */
    const cJSON *parent;  /* samples[].gpus[] entry of the parent (== reading for a GPU) */
    int is_mig;
};

static nvmlReturn_t device_enter(nvmlDevice_t d, struct ctx *c)
{
    nvmlReturn_t ret = enter(&c->pos);
    nvmlReturn_t rerr;
    if (ret != NVML_SUCCESS)
        return ret;
    if (!valid_handle(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    c->is_mig = d->mig >= 0;
    c->parent = find_index(get(sample_at(c->pos), "gpus"), d->gpu);
    if (c->parent == NULL)
        return NVML_ERROR_UNKNOWN; /* the trace has no reading of this GPU here */
    rerr = recorded_error(c->parent);
    if (rerr != NVML_SUCCESS)
        return rerr; /* {"index": N, "nvml_error": X}: the whole GPU */
    if (c->is_mig) {
        c->facts = mig_facts(d->gpu, d->mig);
        c->reading = find_index(get(c->parent, "mig_devices"), d->mig);
        if (c->reading == NULL)
            return NVML_ERROR_NOT_FOUND; /* no reading of that MIG device in this sample */
        rerr = recorded_error(c->reading);
        if (rerr != NVML_SUCCESS)
            return rerr;
    } else {
        c->facts = device_facts(d->gpu);
        c->reading = c->parent;
    }
    return NVML_SUCCESS;
}

/* A field of an object: missing -> NOT_SUPPORTED, {"nvml_error": X} -> X. */
static nvmlReturn_t field(const cJSON *obj, const char *key, const cJSON **out)
{
    const cJSON *v = get(obj, key);
    nvmlReturn_t ret;
    if (v == NULL || cJSON_IsNull(v))
        return NVML_ERROR_NOT_SUPPORTED;
    ret = recorded_error(v);
    if (ret != NVML_SUCCESS)
        return ret;
    *out = v;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int length)
{
    size_t n = strlen(s);
    if (buf == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- system */

static nvmlReturn_t system_string(const char *key, char *buf, unsigned int length)
{
    nvmlReturn_t ret;
    const cJSON *v;
    lock();
    ret = enter(NULL);
    if (ret == NVML_SUCCESS) {
        v = get(g_root, key);
        ret = cJSON_IsString(v) ? copy_string(v->valuestring, buf, length) : NVML_ERROR_NOT_SUPPORTED;
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return system_string("driver_version", version, length);
}

DECLDIR nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return system_string("nvml_version", version, length);
}

DECLDIR nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t ret;
    const cJSON *v;
    lock();
    ret = enter(NULL);
    if (ret == NVML_SUCCESS) {
        v = get(g_root, "cuda_driver_version");
        if (cudaDriverVersion == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else if (!cJSON_IsNumber(v))
            ret = NVML_ERROR_NOT_SUPPORTED;
        else
            *cudaDriverVersion = v->valueint;
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

DECLDIR nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t ret;
    lock();
    ret = enter(NULL);
    if (ret == NVML_SUCCESS) {
        if (deviceCount == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *deviceCount = (unsigned int)device_count();
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t ret;
    long long pos;
    lock();
    ret = enter(&pos);
    if (ret == NVML_SUCCESS) {
        if (device == NULL || index >= (unsigned int)device_count()) {
            ret = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            /* nvml.h: NVML_ERROR_GPU_IS_LOST if the target GPU has fallen off the bus */
            const cJSON *reading = find_index(get(sample_at(pos), "gpus"), (int)index);
            nvmlReturn_t rerr = reading ? recorded_error(reading) : NVML_SUCCESS;
            if (rerr == NVML_ERROR_GPU_IS_LOST)
                ret = rerr;
            else
                *device = &g_gpu_handles[index];
        }
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t ret;
    int gpu, slot;
    lock();
    ret = enter(NULL);
    if (ret == NVML_SUCCESS) {
        if (uuid == NULL || device == NULL) {
            ret = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            ret = NVML_ERROR_NOT_FOUND;
            for (gpu = 0; gpu < device_count() && ret == NVML_ERROR_NOT_FOUND; gpu++) {
                const cJSON *u = get(device_facts(gpu), "uuid");
                if (cJSON_IsString(u) && strcmp(u->valuestring, uuid) == 0) {
                    *device = &g_gpu_handles[gpu];
                    ret = NVML_SUCCESS;
                }
                for (slot = 0; slot < MAX_MIG && ret == NVML_ERROR_NOT_FOUND; slot++) {
                    u = get(mig_facts(gpu, slot), "uuid");
                    if (cJSON_IsString(u) && strcmp(u->valuestring, uuid) == 0) {
                        *device = &g_mig_handles[gpu][slot];
                        ret = NVML_SUCCESS;
                    }
                }
            }
        }
    }
    unlock();
    return ret;
}

/* ---------------------------------------------------------------- device: static facts */

#define DEVICE_CALL(d, c)                                                                          \
    struct ctx c;                                                                                  \
    nvmlReturn_t ret;                                                                              \
    lock();                                                                                        \
    ret = device_enter((d), &c);                                                                   \
    if (ret != NVML_SUCCESS)                                                                       \
        goto out;

#define DEVICE_END                                                                                 \
    out:                                                                                           \
    unlock();                                                                                      \
    return ret;

/* A MIG handle answers what the trace records for it; everything else is the parent's. */
#define GPU_ONLY(c)                                                                                \
    if ((c).is_mig) {                                                                              \
        ret = NVML_ERROR_NOT_SUPPORTED;                                                            \
        goto out;                                                                                  \
    }

/* NVML_TESTLIB_FAULTS, inside a DEVICE_CALL */
#define INJECT(fn)                                                                                 \
    if ((ret = injected(fn)) != NVML_SUCCESS)                                                      \
        goto out;

#define NEED(p)                                                                                    \
    if ((p) == NULL) {                                                                             \
        ret = NVML_ERROR_INVALID_ARGUMENT;                                                         \
        goto out;                                                                                  \
    }

static nvmlReturn_t facts_string(nvmlDevice_t device, const char *key, char *buf, unsigned int length)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    v = get(c.facts, key);
    ret = cJSON_IsString(v) ? copy_string(v->valuestring, buf, length) : NVML_ERROR_NOT_SUPPORTED;
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    return facts_string(device, "name", name, length);
}

DECLDIR nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t ret;
    lock();
    ret = injected("nvmlDeviceGetUUID");
    unlock();
    return ret != NVML_SUCCESS ? ret : facts_string(device, "uuid", uuid, length);
}

DECLDIR nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    struct ctx c;
    nvmlReturn_t ret;
    lock();
    ret = device_enter(device, &c);
    unlock();
    if (ret == NVML_SUCCESS && c.is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    return ret == NVML_SUCCESS ? facts_string(device, "serial", serial, length) : ret;
}

DECLDIR nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE_CALL(device, c)
    NEED(index)
    *index = (unsigned int)(c.is_mig ? device->mig : device->gpu);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(arch)
    if ((ret = field(c.facts, "architecture", &v)) == NVML_SUCCESS)
        *arch = (nvmlDeviceArchitecture_t)to_ull(v);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(major)
    NEED(minor)
    if ((ret = field(c.facts, "cuda_compute_capability", &v)) == NVML_SUCCESS) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 2) {
            ret = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *major = (int)to_ull(cJSON_GetArrayItem(v, 0));
            *minor = (int)to_ull(cJSON_GetArrayItem(v, 1));
        }
    }
    DEVICE_END
}

/* ---------------------------------------------------------------- device: per sample */

DECLDIR nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    NEED(memory)
    if ((ret = field(c.reading, "memory_bytes", &v)) == NVML_SUCCESS) {
        memory->total = to_ull(get(v, "total"));
        memory->free = to_ull(get(v, "free"));
        memory->used = to_ull(get(v, "used"));
    }
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    NEED(memory)
    if (memory->version != nvmlMemory_v2) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        goto out;
    }
    if ((ret = field(c.reading, "memory_v2_bytes", &v)) == NVML_SUCCESS) {
        memory->total = to_ull(get(v, "total"));
        memory->reserved = to_ull(get(v, "reserved"));
        memory->free = to_ull(get(v, "free"));
        memory->used = to_ull(get(v, "used"));
    }
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(utilization)
    if ((ret = field(c.reading, "utilization_pct", &v)) == NVML_SUCCESS) {
        utilization->gpu = (unsigned int)to_ull(get(v, "gpu"));
        utilization->memory = (unsigned int)to_ull(get(v, "memory"));
    }
    DEVICE_END
}

/* utilization_pct.gpu of GPU `gpu` in the sample at `pos`; 0 when it has none. */
static int util_at(long long pos, int gpu, unsigned int *value)
{
    const cJSON *r = find_index(get(sample_at(pos), "gpus"), gpu);
    const cJSON *u = get(r, "utilization_pct");
    const cJSON *g = get(u, "gpu");
    if (recorded_error(r) != NVML_SUCCESS || !cJSON_IsNumber(g))
        return 0;
    *value = (unsigned int)to_ull(g);
    return 1;
}

DECLDIR nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                          unsigned long long lastSeenTimeStamp,
                                          nvmlValueType_t *sampleValType, unsigned int *sampleCount,
                                          nvmlSample_t *samples)
{
    const cJSON *v;
    long long p, first;
    unsigned int n = 0, cap, value;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(sampleValType)
    NEED(sampleCount)
    if (samples != NULL && *sampleCount == 0) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (type != NVML_GPU_UTILIZATION_SAMPLES) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if ((ret = field(c.reading, "utilization_pct", &v)) != NVML_SUCCESS)
        goto out;
    cap = samples ? *sampleCount : 0xFFFFFFFFu;
    first = c.pos - (SAMPLE_RING - 1);
    if (first < 0)
        first = 0;
    for (p = first; p <= c.pos && n < cap; p++) {
        unsigned long long ts = timestamp_us(p);
        if (ts <= lastSeenTimeStamp || !util_at(p, device->gpu, &value))
            continue;
        if (samples != NULL) {
            memset(&samples[n], 0, sizeof(samples[n]));
            samples[n].timeStamp = ts;
            samples[n].sampleValue.uiVal = value;
        }
        n++;
    }
    *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
    *sampleCount = n;
    ret = n == 0 ? NVML_ERROR_NOT_FOUND : NVML_SUCCESS;
    DEVICE_END
}

static nvmlReturn_t reading_uint(nvmlDevice_t device, const char *key, unsigned int *out)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(out)
    if ((ret = field(c.reading, key, &v)) == NVML_SUCCESS)
        *out = (unsigned int)to_ull(v);
    DEVICE_END
}

static nvmlReturn_t reading_ull(nvmlDevice_t device, const char *key, unsigned long long *out)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(out)
    if ((ret = field(c.reading, key, &v)) == NVML_SUCCESS)
        *out = to_ull(v);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                              unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU) {
        nvmlReturn_t ret;
        lock();
        ret = enter(NULL);
        unlock();
        return ret == NVML_SUCCESS ? NVML_ERROR_INVALID_ARGUMENT : ret;
    }
    return reading_uint(device, "temperature_c", temp);
}

DECLDIR nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return reading_uint(device, "power_mw", power);
}

DECLDIR nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    return reading_ull(device, "total_energy_mj", energy);
}

DECLDIR nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    unsigned int v = 0;
    nvmlReturn_t ret = reading_uint(device, "performance_state", pState ? &v : NULL);
    if (ret == NVML_SUCCESS)
        *pState = (nvmlPstates_t)v;
    return ret;
}

DECLDIR nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    return reading_uint(device, "fan_speed_pct", speed);
}

DECLDIR nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                            unsigned long long *clocksEventReasons)
{
    return reading_ull(device, "clocks_event_reasons", clocksEventReasons);
}

DECLDIR nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    const cJSON *v;
    const char *key;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(clock)
    switch (type) {
    case NVML_CLOCK_GRAPHICS: /* graphics and SM clocks are one domain on these GPUs */
        key = get(c.reading, "clock_graphics_mhz") ? "clock_graphics_mhz" : "clock_sm_mhz";
        break;
    case NVML_CLOCK_SM:
        key = "clock_sm_mhz";
        break;
    case NVML_CLOCK_MEM:
        key = "clock_mem_mhz";
        break;
    case NVML_CLOCK_VIDEO:
        key = "clock_video_mhz";
        break;
    default:
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if ((ret = field(c.reading, key, &v)) == NVML_SUCCESS)
        *clock = (unsigned int)to_ull(v);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                 nvmlEccCounterType_t counterType,
                                                 unsigned long long *eccCounts)
{
    const char *key;
    if (errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        key = counterType == NVML_VOLATILE_ECC ? "ecc_uncorrected_volatile" : "ecc_uncorrected_aggregate";
    else if (errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        key = counterType == NVML_VOLATILE_ECC ? "ecc_corrected_volatile" : "ecc_corrected_aggregate";
    else
        key = NULL;
    if (key == NULL || (counterType != NVML_VOLATILE_ECC && counterType != NVML_AGGREGATE_ECC)) {
        nvmlReturn_t ret;
        lock();
        ret = enter(NULL);
        unlock();
        return ret == NVML_SUCCESS ? NVML_ERROR_INVALID_ARGUMENT : ret;
    }
    return reading_ull(device, key, eccCounts);
}

DECLDIR nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                               unsigned int *uncRows, unsigned int *isPending,
                                               unsigned int *failureOccurred)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(corrRows)
    NEED(uncRows)
    NEED(isPending)
    NEED(failureOccurred)
    if ((ret = field(c.reading, "remapped_rows", &v)) == NVML_SUCCESS) {
        *corrRows = (unsigned int)to_ull(get(v, "correctable"));
        *uncRows = (unsigned int)to_ull(get(v, "uncorrectable"));
        *isPending = (unsigned int)to_ull(get(v, "pending"));
        *failureOccurred = (unsigned int)to_ull(get(v, "failure"));
    }
    DEVICE_END
}

/*
 * retired_pages_dbe / retired_pages_sbe: a list of page addresses, or a count (then the
 * addresses are 0, 4096, ...). Missing or NotSupported (H100) -> that code.
 */
DECLDIR nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                               unsigned int *pageCount, unsigned long long *addresses)
{
    const cJSON *v;
    unsigned int n, i;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(pageCount)
    if (cause != NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR &&
        cause != NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    ret = field(c.reading,
                cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? "retired_pages_dbe"
                                                                         : "retired_pages_sbe",
                &v);
    if (ret != NVML_SUCCESS)
        goto out;
    n = cJSON_IsArray(v) ? (unsigned int)cJSON_GetArraySize(v) : (unsigned int)to_ull(v);
    if (addresses == NULL || *pageCount < n) {
        ret = n == 0 && addresses == NULL ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
        *pageCount = n;
        goto out;
    }
    for (i = 0; i < n; i++)
        addresses[i] = cJSON_IsArray(v) ? to_ull(cJSON_GetArrayItem(v, (int)i)) : 4096ULL * i;
    *pageCount = n;
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    const cJSON *v, *p;
    unsigned int n, i = 0, gi = 0xFFFFFFFFu, ci = 0xFFFFFFFFu;
    DEVICE_CALL(device, c)
    NEED(infoCount)
    if ((ret = field(c.reading, "compute_processes", &v)) != NVML_SUCCESS)
        goto out;
    if (!cJSON_IsArray(v)) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    n = (unsigned int)cJSON_GetArraySize(v);
    if (n == 0) {
        *infoCount = 0;
        goto out;
    }
    if (infos == NULL || *infoCount < n) {
        *infoCount = n;
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
        goto out;
    }
    if (c.is_mig) {
        gi = (unsigned int)to_ull(get(c.facts, "gpu_instance_id"));
        ci = (unsigned int)to_ull(get(c.facts, "compute_instance_id"));
    }
    cJSON_ArrayForEach(p, v)
    {
        const cJSON *mem = get(p, "usedGpuMemory");
        memset(&infos[i], 0, sizeof(infos[i]));
        infos[i].pid = (unsigned int)to_ull(get(p, "pid"));
        /* null: not available (NVML_VALUE_NOT_AVAILABLE, as under WDDM) */
        infos[i].usedGpuMemory = cJSON_IsNumber(mem) ? to_ull(mem) : 0xFFFFFFFFFFFFFFFFULL;
        infos[i].gpuInstanceId = get(p, "gpuInstanceId") ? (unsigned int)to_ull(get(p, "gpuInstanceId")) : gi;
        infos[i].computeInstanceId =
            get(p, "computeInstanceId") ? (unsigned int)to_ull(get(p, "computeInstanceId")) : ci;
        i++;
    }
    *infoCount = n;
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                         nvmlGpuTopologyLevel_t *pathInfo)
{
    struct ctx c2;
    const cJSON *topo, *lvl;
    char key[16];
    DEVICE_CALL(device1, c)
    INJECT("nvmlDeviceGetTopologyCommonAncestor")
    GPU_ONLY(c)
    NEED(pathInfo)
    if ((ret = device_enter(device2, &c2)) != NVML_SUCCESS)
        goto out;
    if (c2.is_mig) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    snprintf(key, sizeof(key), "%d", device2->gpu);
    topo = get(c.facts, "topology");
    lvl = get(topo, key);
    if (cJSON_IsNumber(lvl))
        *pathInfo = (nvmlGpuTopologyLevel_t)lvl->valueint;
    else
        *pathInfo = device1 == device2 ? NVML_TOPOLOGY_INTERNAL : NVML_TOPOLOGY_SYSTEM;
    DEVICE_END
}

/* ---------------------------------------------------------------- topology (trace version 3) */

/*
 * devices[] entries of format version 3 may carry (docs/trace-format.md): numa_node, cpu_affinity
 * (64-bit words), nvlinks [{link, state, remote_pci_bus_id, remote_device_type}], p2p_read
 * {"<peer index>": nvmlGpuP2PStatus_t}, fabric {cluster_uuid, clique_id, state, status}; and,
 * since version 1, pci_bus_id. A key absent: NVML_ERROR_NOT_SUPPORTED, as for every field; a
 * value {"nvml_error": X}: X. On a MIG handle the calls whose nvml.h return list has
 * NOT_SUPPORTED answer it (NVLink, NUMA, CPU affinity, fabric: the parent GPU's), the others
 * (PCI info, P2P status) INVALID_ARGUMENT ("device is invalid").
 */

/* "00000000:3B:00.0", "0000:3b:00.0" or "3b:00.0" -> its parts; 0 when not of that form */
static int parse_bus_id(const char *s, unsigned int *domain, unsigned int *bus, unsigned int *dev,
                        unsigned int *fn)
{
    char tail;
    if (s == NULL)
        return 0;
    if (sscanf(s, "%x:%x:%x.%x%c", domain, bus, dev, fn, &tail) == 4)
        return 1;
    *domain = 0;
    return sscanf(s, "%x:%x.%x%c", bus, dev, fn, &tail) == 3;
}

/* The devices[] entry whose pci_bus_id is the same address as `bus_id`, or NULL. */
static const cJSON *device_at_bus(const char *bus_id)
{
    unsigned int d, b, v, f, d2, b2, v2, f2;
    const cJSON *e;
    if (!parse_bus_id(bus_id, &d, &b, &v, &f))
        return NULL;
    cJSON_ArrayForEach(e, get(g_root, "devices"))
    {
        const cJSON *id = get(e, "pci_bus_id");
        if (cJSON_IsString(id) && parse_bus_id(id->valuestring, &d2, &b2, &v2, &f2) && d == d2 &&
            b == b2 && v == v2 && f == f2)
            return e;
    }
    return NULL;
}

/* nvmlPciInfo_t of the address `bus_id` (a string), with the device and subsystem ids of the
 * trace's GPU at that address when it has them. */
static nvmlReturn_t fill_pci(const cJSON *bus_id, nvmlPciInfo_t *pci)
{
    unsigned int domain, bus, dev, fn;
    const cJSON *facts;
    if (!cJSON_IsString(bus_id) || !parse_bus_id(bus_id->valuestring, &domain, &bus, &dev, &fn))
        return NVML_ERROR_UNKNOWN; /* the trace's address is not one */
    memset(pci, 0, sizeof(*pci));
    pci->domain = domain;
    pci->bus = bus & 0xFFu;
    pci->device = dev & 0x1Fu;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", domain & 0xFFFFu,
             bus & 0xFFu, dev & 0x1Fu, fn & 0x7u);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", domain, bus & 0xFFu, dev & 0x1Fu,
             fn & 0x7u);
    facts = device_at_bus(bus_id->valuestring);
    pci->pciDeviceId = (unsigned int)to_ull(get(facts, "pci_device_id"));
    pci->pciSubSystemId = (unsigned int)to_ull(get(facts, "pci_subsystem_id"));
    return NVML_SUCCESS;
}

DECLDIR nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceGetPciInfo_v3")
    NEED(pci)
    if (c.is_mig) { /* nvml.h lists no NOT_SUPPORTED here: a MIG handle is not a PCI device */
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if ((ret = field(c.facts, "pci_bus_id", &v)) == NVML_SUCCESS)
        ret = fill_pci(v, pci);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceGetNumaNodeId")
    GPU_ONLY(c)
    NEED(node)
    if ((ret = field(c.facts, "numa_node", &v)) != NVML_SUCCESS)
        goto out;
    if (!cJSON_IsNumber(v)) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    *node = (unsigned int)(int)v->valuedouble; /* -1 (no NUMA node) as 0xFFFFFFFF; pynvml reads c_int */
    DEVICE_END
}

/* One word of a CPU mask: a string (the numbers quote_affinity_words quoted) or a number. */
static unsigned long affinity_word(const cJSON *w)
{
    if (cJSON_IsString(w))
        return strtoul(w->valuestring, NULL, 0);
    return (unsigned long)to_ull(w);
}

DECLDIR nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet)
{
    const cJSON *v;
    unsigned int i, n;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceGetCpuAffinity")
    GPU_ONLY(c)
    NEED(cpuSet)
    if (cpuSetSize == 0) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if ((ret = field(c.facts, "cpu_affinity", &v)) != NVML_SUCCESS)
        goto out;
    if (!cJSON_IsArray(v)) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    n = (unsigned int)cJSON_GetArraySize(v);
    for (i = 0; i < cpuSetSize; i++) /* words past the recorded ones: no CPU there */
        cpuSet[i] = i < n ? affinity_word(cJSON_GetArrayItem(v, (int)i)) : 0UL;
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                            nvmlGpuP2PCapsIndex_t p2pIndex, nvmlGpuP2PStatus_t *p2pStatus)
{
    struct ctx c2;
    const cJSON *v;
    char key[16];
    DEVICE_CALL(device1, c)
    INJECT("nvmlDeviceGetP2PStatus")
    NEED(p2pStatus)
    if ((ret = device_enter(device2, &c2)) != NVML_SUCCESS)
        goto out;
    /* nvml.h: INVALID_ARGUMENT "if device1 or device2 or p2pIndex is invalid" (no NOT_SUPPORTED) */
    if (c.is_mig || c2.is_mig || (unsigned int)p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (p2pIndex != NVML_P2P_CAPS_INDEX_READ) { /* a trace records the read capability only */
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    snprintf(key, sizeof(key), "%d", device2->gpu);
    if ((ret = field(get(c.facts, "p2p_read"), key, &v)) != NVML_SUCCESS)
        goto out;
    if (!cJSON_IsNumber(v)) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    *p2pStatus = (nvmlGpuP2PStatus_t)v->valueint;
    DEVICE_END
}

/*
 * The devices[].nvlinks[] entry of link `link` (a per-link NVLink call, under the lock): the
 * checks nvml.h lists (MIG handle: NOT_SUPPORTED, link >= NVML_NVLINK_MAX_LINKS:
 * INVALID_ARGUMENT), then NOT_SUPPORTED for a link the trace does not list (a GPU without it).
 */
static nvmlReturn_t nvlink_entry(const struct ctx *c, unsigned int link, const cJSON **out)
{
    const cJSON *links, *e;
    if (c->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    links = get(c->facts, "nvlinks");
    if (cJSON_IsArray(links)) {
        cJSON_ArrayForEach(e, links)
        {
            const cJSON *n = get(e, "link");
            if (cJSON_IsNumber(n) && n->valueint >= 0 && (unsigned int)n->valueint == link) {
                nvmlReturn_t r = recorded_error(e);
                if (r != NVML_SUCCESS)
                    return r; /* {"link": 3, "nvml_error": X}: every call on that link */
                *out = e;
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

DECLDIR nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    const cJSON *e, *v;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceGetNvLinkState")
    if ((ret = nvlink_entry(&c, link, &e)) != NVML_SUCCESS)
        goto out;
    NEED(isActive)
    if ((ret = field(e, "state", &v)) == NVML_SUCCESS)
        *isActive = to_ull(v) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                         nvmlPciInfo_t *pci)
{
    const cJSON *e, *v;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceGetNvLinkRemotePciInfo_v2")
    if ((ret = nvlink_entry(&c, link, &e)) != NVML_SUCCESS)
        goto out;
    NEED(pci)
    if ((ret = field(e, "remote_pci_bus_id", &v)) == NVML_SUCCESS)
        ret = fill_pci(v, pci);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                         nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    const cJSON *e, *v;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceGetNvLinkRemoteDeviceType")
    if ((ret = nvlink_entry(&c, link, &e)) != NVML_SUCCESS)
        goto out;
    NEED(pNvLinkDeviceType)
    if ((ret = field(e, "remote_device_type", &v)) == NVML_SUCCESS)
        *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)to_ull(v);
    DEVICE_END
}

/* A cluster UUID as 32 hex digits (dashes skipped) -> 16 bytes; zeros when not of that form. */
static void parse_uuid(const cJSON *v, unsigned char out[NVML_GPU_FABRIC_UUID_LEN])
{
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    unsigned char tmp[NVML_GPU_FABRIC_UUID_LEN];
    int nibbles = 0;
    memset(out, 0, NVML_GPU_FABRIC_UUID_LEN);
    memset(tmp, 0, sizeof(tmp));
    for (; *s; s++) {
        int x;
        if (*s == '-')
            continue;
        if (*s >= '0' && *s <= '9')
            x = *s - '0';
        else if (*s >= 'a' && *s <= 'f')
            x = *s - 'a' + 10;
        else if (*s >= 'A' && *s <= 'F')
            x = *s - 'A' + 10;
        else
            return;
        if (nibbles >= 2 * NVML_GPU_FABRIC_UUID_LEN)
            return;
        tmp[nibbles / 2] = (unsigned char)(tmp[nibbles / 2] | (x << (nibbles % 2 ? 0 : 4)));
        nibbles++;
    }
    if (nibbles == 2 * NVML_GPU_FABRIC_UUID_LEN)
        memcpy(out, tmp, sizeof(tmp));
}

DECLDIR nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    const cJSON *f, *status;
    unsigned int version;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceGetGpuFabricInfoV")
    NEED(gpuFabricInfo)
    version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        goto out;
    }
    GPU_ONLY(c) /* nvml.h lists NOT_SUPPORTED only: "device doesn't support gpu fabric" */
    if ((ret = field(c.facts, "fabric", &f)) != NVML_SUCCESS)
        goto out;
    /* the caller's struct is v2 (pynvml's c_nvmlGpuFabricInfoV_t) or v3: zero that many bytes */
    memset(gpuFabricInfo, 0, version == nvmlGpuFabricInfo_v2 ? sizeof(nvmlGpuFabricInfo_v2_t)
                                                              : sizeof(nvmlGpuFabricInfo_v3_t));
    gpuFabricInfo->version = version;
    parse_uuid(get(f, "cluster_uuid"), gpuFabricInfo->clusterUuid);
    status = get(f, "status");
    gpuFabricInfo->status = cJSON_IsString(status) ? code_of_name(status->valuestring)
                                                   : (nvmlReturn_t)to_ull(status);
    gpuFabricInfo->cliqueId = (unsigned int)to_ull(get(f, "clique_id"));
    gpuFabricInfo->state = (nvmlGpuFabricState_t)to_ull(get(f, "state"));
    gpuFabricInfo->healthMask = (unsigned int)to_ull(get(f, "health_mask"));
    if (version == nvmlGpuFabricInfo_v3)
        gpuFabricInfo->healthSummary = (unsigned char)to_ull(get(f, "health_summary"));
    DEVICE_END
}

/* ---------------------------------------------------------------- MIG */

DECLDIR nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                          unsigned int *pendingMode)
{
    const cJSON *v;
    DEVICE_CALL(device, c)
    GPU_ONLY(c)
    NEED(currentMode)
    NEED(pendingMode)
    /* the reading's mode when this sample has one (changed at runtime), else the device's */
    if ((ret = field(get(c.reading, "mig_mode") != NULL ? c.reading : c.facts, "mig_mode", &v)) ==
        NVML_SUCCESS) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 2) {
            ret = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *currentMode = (unsigned int)to_ull(cJSON_GetArrayItem(v, 0));
            *pendingMode = (unsigned int)to_ull(cJSON_GetArrayItem(v, 1));
        }
    }
    DEVICE_END
}

static unsigned int max_mig(const cJSON *facts)
{
    unsigned int m = (unsigned int)to_ull(get(facts, "max_mig_device_count"));
    return m > MAX_MIG ? MAX_MIG : m;
}

DECLDIR nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    DEVICE_CALL(device, c)
    NEED(count)
    if (c.is_mig) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    *count = max_mig(c.facts);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                         nvmlDevice_t *migDevice)
{
    DEVICE_CALL(device, c)
    NEED(migDevice)
    if (c.is_mig) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (!mig_enabled(device->gpu)) {
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if (index >= max_mig(c.facts)) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (mig_facts(device->gpu, (int)index) == NULL) {
        ret = NVML_ERROR_NOT_FOUND;
        goto out;
    }
    *migDevice = &g_mig_handles[device->gpu][index];
    DEVICE_END
}

/* MIG handle predicates and ids: static facts, answered even when a reading is an error. */
static nvmlReturn_t handle_enter(nvmlDevice_t d)
{
    nvmlReturn_t ret = enter(NULL);
    if (ret != NVML_SUCCESS)
        return ret;
    return valid_handle(d) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

DECLDIR nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    nvmlReturn_t ret;
    lock();
    ret = handle_enter(device);
    if (ret == NVML_SUCCESS) {
        if (isMigDevice == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *isMigDevice = device->mig >= 0;
    }
    unlock();
    return ret;
}

static nvmlReturn_t mig_id(nvmlDevice_t device, const char *key, unsigned int *id)
{
    nvmlReturn_t ret;
    lock();
    ret = handle_enter(device);
    if (ret == NVML_SUCCESS) {
        if (id == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else if (device->mig < 0)
            ret = NVML_ERROR_NOT_SUPPORTED;
        else
            *id = (unsigned int)to_ull(get(mig_facts(device->gpu, device->mig), key));
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return mig_id(device, "gpu_instance_id", id);
}

DECLDIR nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return mig_id(device, "compute_instance_id", id);
}

DECLDIR nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    nvmlReturn_t ret;
    lock();
    ret = handle_enter(migDevice);
    if (ret == NVML_SUCCESS) {
        if (device == NULL || migDevice->mig < 0)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *device = &g_gpu_handles[migDevice->gpu];
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    const cJSON *a;
    DEVICE_CALL(device, c)
    NEED(attributes)
    if (!c.is_mig) { /* nvml.h: "This API currently only supports MIG device handles." */
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if ((ret = field(c.facts, "attributes", &a)) != NVML_SUCCESS)
        goto out;
    memset(attributes, 0, sizeof(*attributes));
    attributes->multiprocessorCount = (unsigned int)to_ull(get(a, "multiprocessor_count"));
    attributes->sharedCopyEngineCount = (unsigned int)to_ull(get(a, "shared_copy_engine_count"));
    attributes->sharedDecoderCount = (unsigned int)to_ull(get(a, "shared_decoder_count"));
    attributes->sharedEncoderCount = (unsigned int)to_ull(get(a, "shared_encoder_count"));
    attributes->sharedJpegCount = (unsigned int)to_ull(get(a, "shared_jpeg_count"));
    attributes->sharedOfaCount = (unsigned int)to_ull(get(a, "shared_ofa_count"));
    attributes->gpuInstanceSliceCount = (unsigned int)to_ull(get(a, "gpu_instance_slice_count"));
    attributes->computeInstanceSliceCount = (unsigned int)to_ull(get(a, "compute_instance_slice_count"));
    attributes->memorySizeMB = to_ull(get(a, "memory_size_mb"));
    DEVICE_END
}

/* ---------------------------------------------------------------- event sets */

static struct nvmlEventSet_st *valid_set(nvmlEventSet_t set)
{
    if (set < &g_sets[0] || set >= &g_sets[MAX_SETS] || !set->in_use)
        return NULL;
    return set;
}

DECLDIR nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    long long pos = 0;
    int i;
    nvmlReturn_t ret;
    lock();
    ret = injected("nvmlEventSetCreate");
    if (ret == NVML_SUCCESS)
        ret = enter(&pos);
    if (ret == NVML_SUCCESS) {
        ret = NVML_ERROR_MEMORY;
        for (i = 0; set != NULL && i < MAX_SETS; i++) {
            if (!g_sets[i].in_use) {
                unsigned long long gen = g_sets[i].generation + 1;
                memset(&g_sets[i], 0, sizeof(g_sets[i]));
                g_sets[i].in_use = 1;
                g_sets[i].generation = gen;
                g_sets[i].cursor = pos; /* events of samples already current are not delivered */
                *set = &g_sets[i];
                ret = NVML_SUCCESS;
                break;
            }
        }
        if (set == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
    }
    unlock();
    return ret;
}

/* What a GPU can report: the device's "supported_event_types" in the trace, else what an H100
 * reports (single- and double-bit ECC, P-state, Xid, clock changes). */
static unsigned long long supported_events(const cJSON *facts)
{
    const cJSON *v = get(facts, "supported_event_types");
    if (cJSON_IsNumber(v))
        return (unsigned long long)v->valuedouble;
    return nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |
           nvmlEventTypeXidCriticalError | 0x0000000000000010LL /* nvmlEventTypeClock */;
}

DECLDIR nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                      unsigned long long *eventTypes)
{
    DEVICE_CALL(device, c)
    NEED(eventTypes)
    GPU_ONLY(c)
    *eventTypes = supported_events(c.facts);
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                              nvmlEventSet_t set)
{
    struct nvmlEventSet_st *s;
    DEVICE_CALL(device, c)
    INJECT("nvmlDeviceRegisterEvents")
    s = valid_set(set);
    if (s == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    if (c.is_mig) { /* nvml.h: no per-instance event reporting with MIG device handles */
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if (eventTypes & ~supported_events(c.facts)) { /* real NVML registers nothing then */
        ret = NVML_ERROR_NOT_SUPPORTED;
        goto out;
    }
    /* deliver what is due before the registration changes what the set listens to */
    deliver(s, c.pos);
    s->types[device->gpu] |= eventTypes;
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct timespec deadline, now, slice;
    struct nvmlEventSet_st *s;
    unsigned long long set_gen, init_gen;
    nvmlReturn_t ret;
    long long pos;

    lock();
    ret = injected("nvmlEventSetWait_v2");
    if (ret == NVML_SUCCESS)
        ret = enter(&pos);
    if (ret != NVML_SUCCESS)
        goto done;
    s = valid_set(set);
    if (s == NULL || data == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto done;
    }
    set_gen = s->generation;
    init_gen = g_init_generation;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeoutms / 1000;
    deadline.tv_nsec += (long)(timeoutms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    for (;;) {
        if (g_init_generation != init_gen || g_refcount == 0 || !s->in_use || s->generation != set_gen) {
            ret = NVML_ERROR_UNINITIALIZED; /* shut down or set freed while waiting */
            break;
        }
        pos = current_pos();
        ret = recorded_error(sample_at(pos));
        if (ret != NVML_SUCCESS)
            break; /* the driver went away */
        deliver(s, pos);
        if (s->len > 0) {
            struct event_rec *e = &s->queue[s->head];
            memset(data, 0, sizeof(*data));
            data->device = &g_gpu_handles[e->gpu];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = e->xid;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            s->head = (s->head + 1) % SET_QUEUE;
            s->len--;
            ret = NVML_SUCCESS;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > deadline.tv_sec || (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec)) {
            ret = NVML_ERROR_TIMEOUT;
            break;
        }
        slice = now;
        slice.tv_nsec += POLL_MS * 1000000L;
        if (slice.tv_nsec >= 1000000000L) {
            slice.tv_sec++;
            slice.tv_nsec -= 1000000000L;
        }
        if (slice.tv_sec > deadline.tv_sec || (slice.tv_sec == deadline.tv_sec && slice.tv_nsec > deadline.tv_nsec))
            slice = deadline;
        pthread_cond_timedwait(&g_cond, &g_lock, &slice);
    }
done:
    unlock();
    return ret;
}

/* Always releases the set (also while the driver is away), waking its waiters. */
DECLDIR nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    struct nvmlEventSet_st *s;
    nvmlReturn_t ret;
    lock();
    if ((ret = injected("nvmlEventSetFree")) != NVML_SUCCESS) {
        /* the injected error: the set stays */
    } else if ((s = valid_set(set)) == NULL) {
        ret = g_refcount == 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    } else {
        s->in_use = 0;
        s->generation++;
        pthread_cond_broadcast(&g_cond);
        if (g_refcount == 0)
            ret = NVML_ERROR_UNINITIALIZED; /* released all the same */
    }
    unlock();
    return ret;
}

/* ---------------------------------------------------------------- GPM */

/*
 * GPM (GPU Performance Monitoring, Hopper and newer). The trace records per GPU per sample an
 * optional "gpm" object: {"supported": true, "sm_active_pct": 94.9, "graphics_pct": 98.4,
 * "sm_occupancy_pct": 60.0, "tensor_active_pct": 92.1, "dram_bw_pct": 23.5, ...}. Absent (or
 * "supported": false): the GPU has no GPM. A value recorded at sample i describes the interval
 * (t[i-1], t[i]] (what a recorder computes from its GPM samples of the previous and this tick).
 *
 * A GPM sample records its GPU, the absolute trace position current at nvmlGpmSampleGet and
 * that position's trace time (unwrapped over the loops in wall-clock mode), and the init
 * generation. nvmlGpmMetricsGet between positions a < b answers, per metric, the mean of the
 * samples a+1 .. b weighted by their durations (t[k] - t[k-1]): the time-weighted mean over
 * [t[a], t[b]]. a == b (both taken while one sample was current): that sample's value.
 */
#define MAX_GPM_SAMPLES 1024

struct nvmlGpmSample_st {
    int in_use;
    int taken; /* filled by nvmlGpmSampleGet */
    int gpu;
    long long pos;
    unsigned long long init_generation;
};

static struct nvmlGpmSample_st g_gpm[MAX_GPM_SAMPLES];

struct gpm_key {
    unsigned int id;
    const char *key;
};

static const struct gpm_key g_gpm_keys[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, "graphics_pct"},
    {NVML_GPM_METRIC_SM_UTIL, "sm_active_pct"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy_pct"},
    {NVML_GPM_METRIC_INTEGER_UTIL, "integer_pct"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, "tensor_active_pct"},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, "dfma_tensor_pct"},
    {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "hmma_tensor_pct"},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, "imma_tensor_pct"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_bw_pct"},
    {NVML_GPM_METRIC_FP64_UTIL, "fp64_pct"},
    {NVML_GPM_METRIC_FP32_UTIL, "fp32_pct"},
    {NVML_GPM_METRIC_FP16_UTIL, "fp16_pct"},
};

#define N_GPM_KEYS (sizeof(g_gpm_keys) / sizeof(g_gpm_keys[0]))

static const char *gpm_key(unsigned int id)
{
    size_t i;
    for (i = 0; i < N_GPM_KEYS; i++)
        if (g_gpm_keys[i].id == id)
            return g_gpm_keys[i].key;
    return NULL;
}

/*
 * The "gpm" object of a GPU reading: NVML_SUCCESS and *out when supported; NOT_SUPPORTED when
 * absent, null or "supported": false; {"nvml_error": X} -> X.
 */
static nvmlReturn_t gpm_object(const cJSON *reading, const cJSON **out)
{
    const cJSON *g, *sup;
    nvmlReturn_t ret = field(reading, "gpm", &g);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!cJSON_IsObject(g))
        return NVML_ERROR_NOT_SUPPORTED;
    sup = get(g, "supported");
    if (sup != NULL && !cJSON_IsTrue(sup))
        return NVML_ERROR_NOT_SUPPORTED;
    *out = g;
    return NVML_SUCCESS;
}

/* Trace time of an absolute position, in seconds, unwrapped over the loops (wall-clock mode). */
static double trace_time(long long pos)
{
    long long loop = pos / g_nsamples;
    return g_t[pos % g_nsamples] + (file_mode() ? 0.0 : (double)loop * g_period);
}

static struct nvmlGpmSample_st *valid_gpm(nvmlGpmSample_t s)
{
    if (s < &g_gpm[0] || s >= &g_gpm[MAX_GPM_SAMPLES] || !s->in_use)
        return NULL;
    return s;
}

DECLDIR nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    const cJSON *g;
    nvmlReturn_t r;
    struct ctx c;
    nvmlReturn_t ret;
    lock();
    if ((ret = injected("nvmlGpmQueryDeviceSupport")) != NVML_SUCCESS)
        goto out;
    if ((ret = device_enter(device, &c)) != NVML_SUCCESS)
        goto out;
    NEED(gpmSupport)
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        goto out;
    }
    GPU_ONLY(c) /* GPM of a MIG instance is nvmlGpmMigSampleGet's, which is not implemented */
    r = gpm_object(c.reading, &g);
    if (r != NVML_SUCCESS && r != NVML_ERROR_NOT_SUPPORTED) {
        ret = r; /* "gpm": {"nvml_error": X} */
        goto out;
    }
    gpmSupport->isSupportedDevice = r == NVML_SUCCESS;
    DEVICE_END
}

DECLDIR nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    nvmlReturn_t ret;
    int i;
    lock();
    ret = injected("nvmlGpmSampleAlloc");
    if (ret == NVML_SUCCESS)
        ret = enter(NULL);
    if (ret == NVML_SUCCESS && gpmSample == NULL)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        ret = NVML_ERROR_MEMORY;
        for (i = 0; i < MAX_GPM_SAMPLES; i++) {
            if (!g_gpm[i].in_use) {
                memset(&g_gpm[i], 0, sizeof(g_gpm[i]));
                g_gpm[i].in_use = 1;
                *gpmSample = &g_gpm[i];
                ret = NVML_SUCCESS;
                break;
            }
        }
    }
    unlock();
    return ret;
}

/* Releases a valid sample whether or not NVML is initialised (so nothing leaks across a re-init). */
DECLDIR nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    struct nvmlGpmSample_st *s;
    nvmlReturn_t ret;
    lock();
    ret = injected("nvmlGpmSampleFree");
    if (ret == NVML_SUCCESS) {
        s = valid_gpm(gpmSample);
        if (s == NULL)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            memset(s, 0, sizeof(*s));
    }
    unlock();
    return ret;
}

DECLDIR nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    const cJSON *g;
    struct nvmlGpmSample_st *s;
    struct ctx c;
    nvmlReturn_t ret;
    lock();
    if ((ret = injected("nvmlGpmSampleGet")) != NVML_SUCCESS)
        goto out;
    if ((ret = device_enter(device, &c)) != NVML_SUCCESS)
        goto out;
    if ((s = valid_gpm(gpmSample)) == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto out;
    }
    GPU_ONLY(c)
    if ((ret = gpm_object(c.reading, &g)) != NVML_SUCCESS)
        goto out;
    s->taken = 1;
    s->gpu = device->gpu;
    s->pos = c.pos;
    s->init_generation = g_init_generation;
    DEVICE_END
}

/*
 * One metric over the samples a+1 .. b (a == b: sample b alone) of GPU `gpu`: the duration-
 * weighted mean of gpm.<key>. A sample of the interval without GPM: NOT_SUPPORTED; a field
 * missing: NOT_SUPPORTED; a field {"nvml_error": X}: X.
 */
static nvmlReturn_t gpm_span(int gpu, const char *key, long long from, long long to, double *sum, double *weight)
{
    long long k;
    for (k = from; k <= to; k++) {
        const cJSON *g, *v;
        const cJSON *r = find_index(get(sample_at(k), "gpus"), gpu);
        double w = from == to ? 1.0 : trace_time(k) - trace_time(k - 1);
        nvmlReturn_t ret = gpm_object(r, &g);
        if (ret != NVML_SUCCESS)
            return ret;
        if ((ret = field(g, key, &v)) != NVML_SUCCESS)
            return ret;
        if (!cJSON_IsNumber(v))
            return NVML_ERROR_NOT_SUPPORTED;
        if (w < 0)
            w = 0;
        *sum += v->valuedouble * w;
        *weight += w;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t gpm_metric(int gpu, const char *key, long long a, long long b, double *value)
{
    double sum = 0, weight = 0;
    long long n = b - a, loops, rem;
    nvmlReturn_t ret;
    if (n == 0) {
        ret = gpm_span(gpu, key, b, b, &sum, &weight);
    } else {
        /* n consecutive positions cover every index once: a long wall-clock interval is whole
         * loops of the trace plus a remainder */
        loops = n / g_nsamples;
        rem = n % g_nsamples;
        ret = NVML_SUCCESS;
        if (loops > 0) {
            ret = gpm_span(gpu, key, a + 1, a + g_nsamples, &sum, &weight);
            sum *= (double)loops;
            weight *= (double)loops;
        }
        if (ret == NVML_SUCCESS && rem > 0)
            ret = gpm_span(gpu, key, b - rem + 1, b, &sum, &weight);
        if (ret == NVML_SUCCESS && !(weight > 0)) { /* equal times: the later sample's value */
            sum = weight = 0;
            ret = gpm_span(gpu, key, b, b, &sum, &weight);
        }
    }
    if (ret == NVML_SUCCESS)
        *value = sum / weight;
    return ret;
}

/*
 * The error of a sample of [a, b] or of the current one, else SUCCESS: the driver gone (the
 * sample's own nvml_error), the GPU's reading an error ({"index": N, "nvml_error": X}: a GPU
 * lost between the two samples is NVML_ERROR_GPU_IS_LOST), no reading of it (UNKNOWN).
 */
static nvmlReturn_t gpm_gpu_error(int gpu, long long a, long long b, long long now)
{
    long long k, last = b - a >= g_nsamples ? a + g_nsamples : b;
    nvmlReturn_t ret = recorded_error(find_index(get(sample_at(now), "gpus"), gpu));
    for (k = a; k <= last && ret == NVML_SUCCESS; k++) {
        const cJSON *r = find_index(get(sample_at(k), "gpus"), gpu);
        ret = recorded_error(sample_at(k));
        if (ret == NVML_SUCCESS)
            ret = r == NULL ? NVML_ERROR_UNKNOWN : recorded_error(r);
    }
    return ret;
}

DECLDIR nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    struct nvmlGpmSample_st *s1, *s2;
    long long now, a, b;
    unsigned int i;
    nvmlReturn_t ret;
    lock();
    if ((ret = injected("nvmlGpmMetricsGet")) != NVML_SUCCESS)
        goto done;
    if ((ret = enter(&now)) != NVML_SUCCESS)
        goto done;
    if (metricsGet == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto done;
    }
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        goto done;
    }
    s1 = valid_gpm(metricsGet->sample1);
    s2 = valid_gpm(metricsGet->sample2);
    /* a sample not allocated, freed, never filled, filled before an nvmlShutdown that ended the
     * session (re-init), both the same buffer, or two GPUs: INVALID_ARGUMENT */
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || s1 == NULL || s2 == NULL || s1 == s2 || !s1->taken ||
        !s2->taken || s1->init_generation != g_init_generation || s2->init_generation != g_init_generation ||
        s1->gpu != s2->gpu) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
        goto done;
    }
    a = s1->pos < s2->pos ? s1->pos : s2->pos;
    b = s1->pos < s2->pos ? s2->pos : s1->pos;
    /* the GPU lost (or any whole-GPU error) between the samples or now: that error */
    if ((ret = gpm_gpu_error(s1->gpu, a, b, now)) != NVML_SUCCESS)
        goto done;
    for (i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        const char *key = gpm_key(m->metricId);
        m->value = 0;
        memset(&m->metricInfo, 0, sizeof(m->metricInfo));
        if (m->metricId == 0 || m->metricId >= NVML_GPM_METRIC_MAX)
            m->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        else if (key == NULL)
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else
            m->nvmlReturn = gpm_metric(s1->gpu, key, a, b, &m->value);
        if (m->nvmlReturn != NVML_SUCCESS)
            m->value = 0;
    }
done:
    unlock();
    return ret;
}
