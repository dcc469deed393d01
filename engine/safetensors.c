/* safetensors.c — see safetensors.h. */
#include "engine/safetensors.h"

#include "engine/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* dtypes                                                                    */

static const struct {
    const char *name;
    const char *pretty;
    size_t size;
} g_dtypes[ST_NDTYPES] = {
    [ST_F16] = {"F16", "fp16", 2},         [ST_BF16] = {"BF16", "bf16", 2},
    [ST_F32] = {"F32", "fp32", 4},         [ST_F64] = {"F64", "fp64", 8},
    [ST_I8] = {"I8", "int8", 1},           [ST_I16] = {"I16", "int16", 2},
    [ST_I32] = {"I32", "int32", 4},        [ST_I64] = {"I64", "int64", 8},
    [ST_U8] = {"U8", "uint8", 1},          [ST_U16] = {"U16", "uint16", 2},
    [ST_U32] = {"U32", "uint32", 4},       [ST_U64] = {"U64", "uint64", 8},
    [ST_BOOL] = {"BOOL", "bool", 1},       [ST_F8_E4M3] = {"F8_E4M3", "fp8_e4m3", 1},
    [ST_F8_E5M2] = {"F8_E5M2", "fp8_e5m2", 1},
};

const char *st_dtype_name(enum st_dtype dt) {
    return (unsigned)dt < ST_NDTYPES ? g_dtypes[dt].name : "?";
}
const char *st_dtype_pretty(enum st_dtype dt) {
    return (unsigned)dt < ST_NDTYPES ? g_dtypes[dt].pretty : "?";
}
size_t st_dtype_size(enum st_dtype dt) {
    return (unsigned)dt < ST_NDTYPES ? g_dtypes[dt].size : 0;
}
int st_dtype_parse(const char *s, enum st_dtype *out) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(s, g_dtypes[i].name) == 0) { *out = (enum st_dtype)i; return 0; }
    return -EINVAL;
}

char *st_format_type(enum st_dtype dt, int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%s [", st_dtype_pretty(dt));
    for (int i = 0; i < ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

/* ------------------------------------------------------------------------ */
/* reading                                                                   */

struct st_file {
    char *path;
    void *map;          /* whole file, PROT_READ, MAP_PRIVATE */
    size_t size;
};

struct st_priv {
    struct st_file *files;   /* [n_files] */
    char *names;             /* all tensor names, NUL-separated */
};

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

struct range { uint64_t begin, end; int idx; };
static int cmp_range(const void *a, const void *b) {
    const struct range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* A JSON number that is a non-negative integer below 2^53. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Maps `path` and parses its header. On success appends nothing yet: returns
 * the tensors in *out_t (names pointing into *out_names). */
static int parse_file(const char *path, struct st_file *f, struct st_tensor **out_t,
                      int *out_n, char **out_names, char *err, size_t errlen) {
    const char *bn = base_name(path);
    int rc = 0;
    cJSON *root = NULL;
    struct st_tensor *ts = NULL;
    struct range *rg = NULL;
    char *names = NULL;
    memset(f, 0, sizeof *f);
    *out_t = NULL;
    *out_n = 0;
    *out_names = NULL;

    int fd;
    size_t size;
    rc = util_open_regular(path, &fd, &size, err, errlen);
    if (rc) return rc;
    if (size < 8) {
        close(fd);
        return util_err(err, errlen, -EINVAL,
                        "%s: truncated: %zu bytes, a safetensors file has at least 8", bn, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return util_err(err, errlen, -e, "%s: mmap: %s", path, strerror(e));
    f->map = map;
    f->size = size;
    f->path = strdup(path);
    if (!f->path) { rc = -ENOMEM; goto fail; }

    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)((const unsigned char *)map)[i] << (8 * i);
    if (hlen == 0 || hlen > size - 8) {
        rc = util_err(err, errlen, -EINVAL,
                      "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)"
                      " — truncated or not a safetensors file", bn, hlen, size);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        rc = util_err(err, errlen, -EINVAL, "%s: header length %" PRIu64
                      " exceeds the %u-byte limit", bn, hlen, ST_MAX_HEADER);
        goto fail;
    }
    const char *hdr = (const char *)map + 8;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = (at && at >= hdr && at <= hdr + hlen) ? (long)(at - hdr) : -1;
        rc = util_err(err, errlen, -EINVAL, "%s: header is not valid JSON (near byte %ld)", bn,
                      off);
        goto fail;
    }
    for (const char *p = end; p && p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != '\0') {
            rc = util_err(err, errlen, -EINVAL, "%s: trailing bytes after the header JSON", bn);
            goto fail;
        }
    if (!cJSON_IsObject(root)) {
        rc = util_err(err, errlen, -EINVAL, "%s: header is not a JSON object", bn);
        goto fail;
    }
    uint64_t data_start = 8 + hlen, data_size = size - data_start;

    int n = 0;
    size_t names_len = 0;
    for (cJSON *it = root->child; it; it = it->next) {
        if (!it->string) { rc = util_err(err, errlen, -EINVAL, "%s: header key missing", bn); goto fail; }
        if (strcmp(it->string, "__metadata__") == 0) continue;
        n++;
        names_len += strlen(it->string) + 1;
    }
    ts = calloc((size_t)n + 1, sizeof *ts);
    rg = calloc((size_t)n + 1, sizeof *rg);
    names = malloc(names_len + 1);
    if (!ts || !rg || !names) { rc = util_err(err, errlen, -ENOMEM, "%s: out of memory", bn); goto fail; }

    int i = 0;
    size_t np = 0;
    for (cJSON *it = root->child; it; it = it->next) {
        const char *nm = it->string;
        if (strcmp(nm, "__metadata__") == 0) {
            if (!cJSON_IsObject(it)) {
                rc = util_err(err, errlen, -EINVAL, "%s: __metadata__ is not an object", bn);
                goto fail;
            }
            continue;
        }
        struct st_tensor *t = &ts[i];
        size_t l = strlen(nm);
        memcpy(names + np, nm, l + 1);
        t->name = names + np;
        np += l + 1;
        if (!cJSON_IsObject(it)) {
            rc = util_err(err, errlen, -EINVAL, "%s: %s: entry is not an object", bn, nm);
            goto fail;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo)) {
            rc = util_err(err, errlen, -EINVAL,
                          "%s: %s: needs string dtype, array shape and array data_offsets", bn, nm);
            goto fail;
        }
        if (st_dtype_parse(jd->valuestring, &t->dtype)) {
            rc = util_err(err, errlen, -EINVAL, "%s: %s: unknown dtype \"%.32s\"", bn, nm,
                          jd->valuestring);
            goto fail;
        }
        int nd = cJSON_GetArraySize(js);
        if (nd > ST_MAX_DIMS) {
            rc = util_err(err, errlen, -EINVAL, "%s: %s: %d dimensions (at most %d)", bn, nm, nd,
                          ST_MAX_DIMS);
            goto fail;
        }
        t->ndim = nd;
        uint64_t numel = 1;
        int d = 0;
        for (const cJSON *x = js->child; x; x = x->next, d++) {
            uint64_t v;
            if (json_uint(x, &v)) {
                rc = util_err(err, errlen, -EINVAL,
                              "%s: %s: shape entries must be non-negative integers", bn, nm);
                goto fail;
            }
            t->shape[d] = (int64_t)v;
            if (v && numel > UINT64_MAX / v) {
                rc = util_err(err, errlen, -EINVAL, "%s: %s: shape overflows", bn, nm);
                goto fail;
            }
            numel *= v;
        }
        uint64_t b, e2;
        if (cJSON_GetArraySize(jo) != 2 || json_uint(jo->child, &b) ||
            json_uint(jo->child->next, &e2)) {
            rc = util_err(err, errlen, -EINVAL,
                          "%s: %s: data_offsets must be two non-negative integers", bn, nm);
            goto fail;
        }
        if (e2 < b) {
            rc = util_err(err, errlen, -EINVAL, "%s: %s: data_offsets [%" PRIu64 ", %" PRIu64
                          "] end before they begin", bn, nm, b, e2);
            goto fail;
        }
        uint64_t esz = st_dtype_size(t->dtype);
        if (numel > UINT64_MAX / esz || numel * esz != e2 - b) {
            char ty[160];
            rc = util_err(err, errlen, -EINVAL,
                          "%s: %s: %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64
                          ", %" PRIu64 "] hold %" PRIu64, bn, nm,
                          st_format_type(t->dtype, t->ndim, t->shape, ty, sizeof ty),
                          numel > UINT64_MAX / esz ? UINT64_MAX : numel * esz, b, e2, e2 - b);
            goto fail;
        }
        if (e2 > data_size) {
            rc = util_err(err, errlen, -EINVAL,
                          "%s: %s: data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of"
                          " the file (data area is %" PRIu64 " bytes) — truncated file?",
                          bn, nm, b, e2, data_size);
            goto fail;
        }
        t->numel = (int64_t)numel;
        t->nbytes = (size_t)(e2 - b);
        t->data = (const char *)map + data_start + b;
        rg[i].begin = b;
        rg[i].end = e2;
        rg[i].idx = i;
        i++;
    }
    qsort(rg, (size_t)n, sizeof *rg, cmp_range);
    uint64_t prev_end = 0;
    int prev = -1;
    for (int k = 0; k < n; k++) {
        if (rg[k].begin == rg[k].end) continue; /* empty tensors occupy nothing */
        if (prev >= 0 && rg[k].begin < prev_end) {
            rc = util_err(err, errlen, -EINVAL,
                          "%s: tensors %s and %s overlap (bytes [%" PRIu64 ", %" PRIu64
                          ") and [%" PRIu64 ", %" PRIu64 "))", bn, ts[rg[prev].idx].name,
                          ts[rg[k].idx].name, rg[prev].begin, prev_end, rg[k].begin, rg[k].end);
            goto fail;
        }
        prev = k;
        prev_end = rg[k].end;
    }
    free(rg);
    cJSON_Delete(root);
    *out_t = ts;
    *out_n = n;
    *out_names = names;
    return 0;
fail:
    if (rc == -ENOMEM) util_err(err, errlen, rc, "%s: out of memory", bn);
    free(rg);
    free(ts);
    free(names);
    cJSON_Delete(root);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
    return rc;
}

void safetensors_close(struct safetensors *st) {
    if (!st) return;
    struct st_priv *p = st->priv;
    if (p) {
        for (int i = 0; i < st->n_files; i++) {
            if (p->files[i].map) munmap(p->files[i].map, p->files[i].size);
            free(p->files[i].path);
        }
        free(p->files);
        free(p->names);
        free(p);
    }
    free(st->file_paths);
    free(st->tensors);
    free(st);
}

/* Builds a struct safetensors from parsed files; takes ownership of everything. */
static int assemble(struct st_file *files, int nf, struct st_tensor **ts, int *nts, char **names,
                    struct safetensors **out, char *err, size_t errlen) {
    int rc = 0;
    struct safetensors *st = calloc(1, sizeof *st);
    struct st_priv *p = calloc(1, sizeof *p);
    size_t total_n = 0, total_names = 0;
    for (int i = 0; i < nf; i++) {
        total_n += (size_t)nts[i];
        for (int k = 0; k < nts[i]; k++) total_names += strlen(ts[i][k].name) + 1;
    }
    if (!st || !p) goto oom;
    st->priv = p;
    p->files = files;
    st->n_files = nf;
    st->file_paths = calloc((size_t)nf + 1, sizeof *st->file_paths);
    st->tensors = calloc(total_n + 1, sizeof *st->tensors);
    p->names = malloc(total_names + 1);
    if (!st->file_paths || !st->tensors || !p->names) goto oom;
    size_t np = 0, k = 0;
    for (int i = 0; i < nf; i++) {
        st->file_paths[i] = files[i].path;
        for (int j = 0; j < nts[i]; j++, k++) {
            st->tensors[k] = ts[i][j];
            size_t l = strlen(ts[i][j].name);
            memcpy(p->names + np, ts[i][j].name, l + 1);
            st->tensors[k].name = p->names + np;
            st->tensors[k].file = i;
            np += l + 1;
            st->total_bytes += ts[i][j].nbytes;
        }
    }
    st->n_tensors = (int)total_n;
    qsort(st->tensors, total_n, sizeof *st->tensors, cmp_tensor_name);
    for (size_t i = 1; i < total_n; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0) {
            rc = util_err(err, errlen, -EINVAL, "tensor %s appears twice (in %s and %s)",
                          st->tensors[i].name, base_name(files[st->tensors[i - 1].file].path),
                          base_name(files[st->tensors[i].file].path));
            goto fail;
        }
    for (int i = 0; i < nf; i++) { free(ts[i]); free(names[i]); }
    *out = st;
    return 0;
oom:
    rc = util_err(err, errlen, -ENOMEM, "out of memory assembling safetensors");
fail:
    for (int i = 0; i < nf; i++) { free(ts[i]); free(names[i]); }
    if (st) {
        if (!st->priv) {
            for (int i = 0; i < nf; i++) {
                if (files[i].map) munmap(files[i].map, files[i].size);
                free(files[i].path);
            }
            free(files);
            free(p);
        }
        safetensors_close(st);
    } else {
        for (int i = 0; i < nf; i++) {
            if (files[i].map) munmap(files[i].map, files[i].size);
            free(files[i].path);
        }
        free(files);
        free(p);
    }
    return rc;
}

int safetensors_open(const char *path, struct safetensors **out, char *err, size_t errlen) {
    *out = NULL;
    struct st_file *f = calloc(1, sizeof *f);
    if (!f) return util_err(err, errlen, -ENOMEM, "out of memory");
    struct st_tensor *ts;
    int n;
    char *names;
    int rc = parse_file(path, f, &ts, &n, &names, err, errlen);
    if (rc) { free(f); return rc; }
    return assemble(f, 1, &ts, &n, &names, out, err, errlen);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

#define INDEX_NAME "model.safetensors.index.json"

static int open_index(const char *dir, const char *ipath, struct safetensors **out, char *err,
                      size_t errlen) {
    char *text = NULL;
    size_t len;
    int rc = util_read_file(ipath, 64u << 20, &text, &len, err, errlen);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return util_err(err, errlen, -EINVAL, "%s: not valid JSON", INDEX_NAME);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        cJSON_Delete(root);
        return util_err(err, errlen, -EINVAL, "%s: no weight_map object", INDEX_NAME);
    }
    /* unique shard names, in order of appearance */
    int cap = 16, nf = 0;
    const char **fnames = calloc((size_t)cap, sizeof *fnames);
    struct st_file *files = NULL;
    struct st_tensor **ts = NULL;
    int *nts = NULL;
    char **names = NULL;
    if (!fnames) { rc = -ENOMEM; goto fail; }
    for (const cJSON *it = wm->child; it; it = it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0]) {
            rc = util_err(err, errlen, -EINVAL, "%s: weight_map[%s] is not a file name",
                          INDEX_NAME, it->string ? it->string : "?");
            goto fail;
        }
        const char *fn = it->valuestring;
        if (strchr(fn, '/') || fn[0] == '.') {
            rc = util_err(err, errlen, -EINVAL,
                          "%s: shard name \"%.64s\" must be a plain file name in the directory",
                          INDEX_NAME, fn);
            goto fail;
        }
        int k;
        for (k = 0; k < nf; k++)
            if (strcmp(fnames[k], fn) == 0) break;
        if (k < nf) continue;
        if (nf == cap) {
            cap *= 2;
            const char **nn = realloc(fnames, (size_t)cap * sizeof *fnames);
            if (!nn) { rc = -ENOMEM; goto fail; }
            fnames = nn;
        }
        fnames[nf++] = fn;
    }
    files = calloc((size_t)nf, sizeof *files);
    ts = calloc((size_t)nf, sizeof *ts);
    nts = calloc((size_t)nf, sizeof *nts);
    names = calloc((size_t)nf, sizeof *names);
    if (!files || !ts || !nts || !names) { rc = -ENOMEM; goto fail; }
    int opened = 0;
    for (int k = 0; k < nf; k++) {
        size_t pl = strlen(dir) + strlen(fnames[k]) + 2;
        char *path = malloc(pl);
        if (!path) { rc = -ENOMEM; goto fail_files; }
        snprintf(path, pl, "%s/%s", dir, fnames[k]);
        if (!file_exists(path)) {
            rc = util_err(err, errlen, -ENOENT,
                          "missing shard %s (listed in %s) in %s", fnames[k], INDEX_NAME, dir);
            free(path);
            goto fail_files;
        }
        rc = parse_file(path, &files[k], &ts[k], &nts[k], &names[k], err, errlen);
        free(path);
        if (rc) goto fail_files;
        qsort(ts[k], (size_t)nts[k], sizeof *ts[k], cmp_tensor_name); /* for the lookups below */
        opened++;
    }
    /* every tensor the index names must be in the shard it names */
    for (const cJSON *it = wm->child; it; it = it->next) {
        int k;
        for (k = 0; k < nf; k++)
            if (strcmp(fnames[k], it->valuestring) == 0) break;
        struct st_tensor key = {.name = it->string};
        if (!bsearch(&key, ts[k], (size_t)nts[k], sizeof key, cmp_tensor_name)) {
            rc = util_err(err, errlen, -EINVAL, "%s lists tensor %s in %s, but %s has no such tensor",
                          INDEX_NAME, it->string, fnames[k], fnames[k]);
            goto fail_files;
        }
    }
    cJSON_Delete(root);
    free(fnames);
    rc = assemble(files, nf, ts, nts, names, out, err, errlen);
    free(ts);
    free(nts);
    free(names);
    return rc;
fail_files:
    for (int k = 0; k < nf; k++) {
        if (files[k].map) munmap(files[k].map, files[k].size);
        free(files[k].path);
        free(ts[k]);
        free(names[k]);
    }
    (void)opened;
fail:
    if (rc == -ENOMEM) util_err(err, errlen, rc, "out of memory reading %s", INDEX_NAME);
    cJSON_Delete(root);
    free(fnames);
    free(files);
    free(ts);
    free(nts);
    free(names);
    return rc;
}

int safetensors_open_dir(const char *dir, struct safetensors **out, char *err, size_t errlen) {
    *out = NULL;
    size_t pl = strlen(dir) + sizeof INDEX_NAME + 2;
    char *path = malloc(pl);
    if (!path) return util_err(err, errlen, -ENOMEM, "out of memory");
    snprintf(path, pl, "%s/%s", dir, INDEX_NAME);
    int rc;
    if (file_exists(path)) {
        rc = open_index(dir, path, out, err, errlen);
    } else {
        snprintf(path, pl, "%s/model.safetensors", dir);
        if (file_exists(path))
            rc = safetensors_open(path, out, err, errlen);
        else
            rc = util_err(err, errlen, -ENOENT,
                          "%s: no model.safetensors or " INDEX_NAME " found", dir);
    }
    free(path);
    return rc;
}

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const char *safetensors_file_of(const struct safetensors *st, const struct st_tensor *t) {
    if (!st || !t || t->file < 0 || t->file >= st->n_files) return "?";
    return base_name(st->file_paths[t->file]);
}

/* ------------------------------------------------------------------------ */
/* writing                                                                   */

struct st_writer {
    int fd;
    char *path;
    int n;
    uint64_t data_start;
    uint64_t *begin, *size;   /* [n] */
    int error;                /* first write error (-errno) */
};

/* Appends JSON-escaped s to buf; returns new length (may exceed cap: caller sizes). */
static size_t json_escape(char *buf, size_t pos, size_t cap, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        const char *out = tmp;
        if (*p == '"') out = "\\\"";
        else if (*p == '\\') out = "\\\\";
        else if (*p < 0x20) snprintf(tmp, sizeof tmp, "\\u%04x", *p);
        else { tmp[0] = (char)*p; tmp[1] = 0; }
        size_t l = strlen(out);
        if (pos + l < cap) memcpy(buf + pos, out, l);
        pos += l;
    }
    return pos;
}

/* Builds the header (padded to 8 bytes with spaces). */
static int build_header(const struct st_desc *t, int n, char **out, size_t *out_len,
                        uint64_t *begin, uint64_t *size, char *err, size_t errlen) {
    size_t cap = 64;
    for (int i = 0; i < n; i++) cap += 6 * strlen(t[i].name) + 160 + 24 * (size_t)t[i].ndim;
    char *h = malloc(cap + 8);
    if (!h) return util_err(err, errlen, -ENOMEM, "out of memory");
    size_t pos = (size_t)snprintf(h, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!t[i].name || (unsigned)t[i].dtype >= ST_NDTYPES || t[i].ndim < 0 ||
            t[i].ndim > ST_MAX_DIMS) {
            free(h);
            return util_err(err, errlen, -EINVAL, "safetensors_write: bad tensor %d", i);
        }
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) {
                free(h);
                return util_err(err, errlen, -EINVAL, "safetensors_write: %s: negative shape",
                                t[i].name);
            }
            numel *= (uint64_t)t[i].shape[d];
        }
        uint64_t nb = numel * st_dtype_size(t[i].dtype);
        begin[i] = off;
        size[i] = nb;
        pos += (size_t)snprintf(h + pos, cap - pos, ",\"");
        pos = json_escape(h, pos, cap, t[i].name);
        pos += (size_t)snprintf(h + pos, cap - pos, "\":{\"dtype\":\"%s\",\"shape\":[",
                                st_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            pos += (size_t)snprintf(h + pos, cap - pos, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
        pos += (size_t)snprintf(h + pos, cap - pos, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                off, off + nb);
        off += nb;
        /* keep every tensor 8-aligned? the format packs them; alignment of the
         * data area comes from the padded header, tensors are typically
         * multiples of 8 bytes anyway. */
    }
    pos += (size_t)snprintf(h + pos, cap - pos, "}");
    AWQD_ASSERT(pos < cap);
    while (pos % 8) h[pos++] = ' ';
    *out = h;
    *out_len = pos;
    return 0;
}

int st_writer_open(const char *path, const struct st_desc *t, int n, struct st_writer **out,
                   char *err, size_t errlen) {
    *out = NULL;
    struct st_writer *w = calloc(1, sizeof *w);
    if (!w) return util_err(err, errlen, -ENOMEM, "out of memory");
    w->fd = -1;
    w->n = n;
    w->begin = calloc((size_t)n + 1, sizeof *w->begin);
    w->size = calloc((size_t)n + 1, sizeof *w->size);
    w->path = strdup(path);
    char *h = NULL;
    size_t hl = 0;
    int rc;
    if (!w->begin || !w->size || !w->path) { rc = util_err(err, errlen, -ENOMEM, "out of memory"); goto fail; }
    rc = build_header(t, n, &h, &hl, w->begin, w->size, err, errlen);
    if (rc) goto fail;
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        rc = util_err(err, errlen, -e, "%s: %s", path, strerror(e));
        goto fail;
    }
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    w->data_start = 8 + hl;
    uint64_t total = w->data_start;
    for (int i = 0; i < n; i++) total += w->size[i];
    if (pwrite(w->fd, lenb, 8, 0) != 8 || pwrite(w->fd, h, hl, 8) != (ssize_t)hl ||
        ftruncate(w->fd, (off_t)total) != 0) {
        int e = errno;
        rc = util_err(err, errlen, -e, "%s: write: %s", path, strerror(e));
        goto fail;
    }
    free(h);
    *out = w;
    return 0;
fail:
    free(h);
    if (w->fd >= 0) close(w->fd);
    free(w->begin);
    free(w->size);
    free(w->path);
    free(w);
    return rc;
}

size_t st_writer_tensor_bytes(const struct st_writer *w, int i) {
    return (i >= 0 && i < w->n) ? (size_t)w->size[i] : 0;
}

int st_writer_put(struct st_writer *w, int i, size_t off, const void *data, size_t len,
                  char *err, size_t errlen) {
    if (i < 0 || i >= w->n || off > w->size[i] || len > w->size[i] - off)
        return util_err(err, errlen, -EINVAL, "%s: write outside tensor %d", w->path, i);
    const char *p = data;
    uint64_t pos = w->data_start + w->begin[i] + off;
    while (len) {
        ssize_t r = pwrite(w->fd, p, len, (off_t)pos);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            __atomic_store_n(&w->error, -e, __ATOMIC_RELAXED);
            return util_err(err, errlen, -e, "%s: write: %s", w->path, strerror(e));
        }
        p += r;
        len -= (size_t)r;
        pos += (uint64_t)r;
    }
    return 0;
}

int st_writer_close(struct st_writer *w, char *err, size_t errlen) {
    if (!w) return 0;
    int rc = w->error;
    if (close(w->fd) != 0 && !rc) rc = -errno;
    if (rc) util_err(err, errlen, rc, "%s: write failed: %s", w->path, strerror(-rc));
    free(w->begin);
    free(w->size);
    free(w->path);
    free(w);
    return rc;
}

int safetensors_write(const char *path, const struct st_desc *t, int n, char *err,
                      size_t errlen) {
    size_t pl = strlen(path) + 8;
    char *tmp = malloc(pl);
    if (!tmp) return util_err(err, errlen, -ENOMEM, "out of memory");
    snprintf(tmp, pl, "%s.tmp", path);
    struct st_writer *w;
    int rc = st_writer_open(tmp, t, n, &w, err, errlen);
    if (rc) { free(tmp); return rc; }
    for (int i = 0; i < n && !rc; i++)
        if (w->size[i]) {
            if (!t[i].data) rc = util_err(err, errlen, -EINVAL, "safetensors_write: %s: no data", t[i].name);
            else rc = st_writer_put(w, i, 0, t[i].data, w->size[i], err, errlen);
        }
    int rc2 = st_writer_close(w, rc ? NULL : err, errlen);
    if (!rc) rc = rc2;
    if (!rc && rename(tmp, path) != 0) {
        int e = errno;
        rc = util_err(err, errlen, -e, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}
