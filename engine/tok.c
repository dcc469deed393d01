/* tok.c — byte-level BPE tokenizer from a Hugging Face tokenizer.json: loading,
 * encoding, decoding and streaming decoding. The contract is in tok.h; the
 * algorithm and its corner cases are described in docs/TOKENIZER.md.
 *
 * Sections:  byte-level map · hashing · UTF-8 · loading (model, added tokens,
 * normalizer, pre-tokenizer, post-processor, tokenizer_config) · BPE with word
 * cache · encode pipeline · decode · streaming decode. */
#include "engine/tok.h"
#include "engine/util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* ======================================================================
 * Types
 * ====================================================================== */

enum { TF_VALID = 1, TF_SPECIAL = 2, TF_ADDED = 4, TF_MODEL = 8 };

/* open-addressing table id lookup: slot = id, -1 empty */
struct idhash {
    int32_t *slot;   /* [mask+1] ids or -1 */
    uint32_t *hash;  /* [mask+1] full hash of the slot's key */
    uint32_t mask;
};

struct pair_ent { uint32_t rank; int32_t new_id; };

struct adj_ent { int32_t right; uint32_t rank; int32_t new_id; };

struct merge_ent {
    uint64_t key;    /* (left id << 32) | right id; UINT64_MAX = empty */
    uint32_t rank;   /* index in model.merges (lower merges first) */
    int32_t new_id;  /* id of left+right */
};

struct added_tok {
    int32_t id;
    char *content;   /* NUL-terminated UTF-8 */
    size_t len;
    uint8_t special, normalized, lstrip, rstrip, single_word;
};

/* byte trie over added-token contents for leftmost-longest matching */
struct trie_node {
    int32_t child;   /* first child node or -1 */
    int32_t sibling; /* next sibling or -1 */
    int32_t tok;     /* index into tok->added ending here, or -1 */
    uint8_t byte;
};
struct trie {
    struct trie_node *n; /* [nn]; node 0 is the root */
    int32_t nn, cap;
    int nonempty;
};

enum split_beh { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };
enum pt_kind { PT_SPLIT, PT_BYTELEVEL };
struct pt_step {
    enum pt_kind kind;
    pcre2_code *re;        /* PT_SPLIT, or PT_BYTELEVEL with use_regex */
    int jit;               /* re was JIT-compiled */
    enum split_beh beh;
    int add_prefix_space;  /* PT_BYTELEVEL */
};

#define CACHE_SHARDS 16
#define CACHE_SHARD_CAP 4096  /* slots per shard (power of two) */
#define CACHE_MAX_WORD 128    /* longer words are not cached */
struct cache_ent {
    uint64_t h;        /* 0 = empty */
    int32_t *ids;      /* malloc'd: [nids] ids then wlen word bytes */
    uint16_t nids, wlen;
};
struct cache_shard {
    pthread_mutex_t mu;
    struct cache_ent *e; /* [CACHE_SHARD_CAP] */
    uint32_t count;
};

struct tok {
    int32_t nids;            /* largest id + 1 */
    uint8_t *flags;          /* [nids] TF_* */
    uint32_t *str_off;       /* [nids+1] token strings in strs */
    char *strs;              /* NUL-separated token strings */
    uint32_t *byte_off;      /* [nids+1] decoded bytes in bytes */
    char *bytes;             /* decoded bytes of each token, concatenated */
    uint32_t *mbyte_off;     /* [nids+1] model-vocab raw bytes (encode side) */
    char *mbytes;
    struct idhash str_hash;  /* token string -> id */
    struct idhash byte_hash; /* model token raw bytes -> id (mappable only) */
    struct merge_ent *merges;/* [merge_mask+1] load-time hash (pair -> rank, new id); freed after load */
    uint32_t merge_mask;
    uint32_t *adj_start;     /* [nids+1] merges with left id i are adj[adj_start[i] .. adj_start[i+1]) */
    struct adj_ent *adj;     /* [nmerges] sorted by (left, right): cache-friendly lookups */
    int32_t byte_id[256];    /* id of each single byte, -1 if absent */
    int all_bytes;           /* every byte_id is >= 0 */
    struct pair_ent *byte_pairs; /* [256*256] merge of two single bytes (new_id -1: none) */
    int32_t unk_id;
    int fuse_unk, ignore_merges;

    struct added_tok *added; /* [nadded] */
    int nadded;
    struct trie trie_raw;    /* added tokens with normalized=false */
    struct trie trie_norm;   /* added tokens with normalized=true */

    int norm[4];             /* utf8proc option sets applied in order */
    int nnorm;
    int norm_nfc_only;       /* the normalizer is exactly NFC: fast path */

    struct pt_step steps[8];
    int nsteps;

    int32_t *prefix, *suffix;/* post-processor ids around the sequence */
    int nprefix, nsuffix;

    int32_t bos_id, eos_id;
    int adds_bos;

    struct cache_shard cache[CACHE_SHARDS];
};

/* ======================================================================
 * Byte-level map (GPT-2 bytes_to_unicode)
 * ====================================================================== */

static uint16_t g_byte2cp[256];
static int16_t g_cp2byte[324];
static pthread_once_t g_bl_once = PTHREAD_ONCE_INIT;

static void bl_init(void) {
    int n = 0;
    for (int i = 0; i < 324; i++) g_cp2byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = keep ? b : 256 + n++;
        g_byte2cp[b] = (uint16_t)cp;
        g_cp2byte[cp] = (int16_t)b;
    }
}

/* ======================================================================
 * Hashing
 * ====================================================================== */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w; memcpy(&w, s, 8);
        h = mix64(h ^ w) ; s += 8; n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = mix64(h ^ w ^ ((uint64_t)n << 59));
    return h ? h : 1;
}

static int idhash_init(struct idhash *h, size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    h->slot = malloc(cap * sizeof *h->slot);
    h->hash = malloc(cap * sizeof *h->hash);
    if (!h->slot || !h->hash) return -ENOMEM;
    memset(h->slot, 0xff, cap * sizeof *h->slot);
    h->mask = (uint32_t)(cap - 1);
    return 0;
}

static void idhash_free(struct idhash *h) { free(h->slot); free(h->hash); }

/* key(id) is given by off/blob */
static int32_t idhash_get(const struct idhash *h, const uint32_t *off, const char *blob,
                          const void *key, size_t len) {
    if (!h->slot) return -1;
    uint64_t hv = hash_bytes(key, len);
    for (uint32_t i = (uint32_t)hv & h->mask;; i = (i + 1) & h->mask) {
        int32_t id = h->slot[i];
        if (id < 0) return -1;
        if (h->hash[i] == (uint32_t)(hv >> 32) && off[id + 1] - off[id] == len &&
            memcmp(blob + off[id], key, len) == 0)
            return id;
    }
}

/* inserts id (its key read from off/blob); replaces an equal key */
static void idhash_put(struct idhash *h, const uint32_t *off, const char *blob, int32_t id) {
    const char *key = blob + off[id];
    size_t len = off[id + 1] - off[id];
    uint64_t hv = hash_bytes(key, len);
    for (uint32_t i = (uint32_t)hv & h->mask;; i = (i + 1) & h->mask) {
        int32_t o = h->slot[i];
        if (o < 0 || (h->hash[i] == (uint32_t)(hv >> 32) && off[o + 1] - off[o] == len &&
                      memcmp(blob + off[o], key, len) == 0)) {
            h->slot[i] = id;
            h->hash[i] = (uint32_t)(hv >> 32);
            return;
        }
    }
}

/* The merge of (a, b), or NULL: a search in a's sorted list of merges (the
 * lists of frequent tokens stay in cache, unlike slots of a big hash). */
static inline const struct adj_ent *merge_get(const struct tok *t, int32_t a, int32_t b) {
    uint32_t lo = t->adj_start[a], hi = t->adj_start[a + 1];
    while (hi - lo > 8) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t->adj[mid].right < b) lo = mid + 1;
        else hi = mid + 1; /* adj[mid].right >= b: the answer is in [lo, mid] */
    }
    for (uint32_t i = lo; i < hi; i++)
        if (t->adj[i].right == b) return &t->adj[i];
    return NULL;
}

static int adj_cmp(const void *x, const void *y) {
    const struct adj_ent *a = x, *b = y;
    return (a->right > b->right) - (a->right < b->right);
}

/* Builds adj/adj_start from the load-time hash, then frees the hash. */
static int merges_finish(struct tok *t) {
    size_t nids = (size_t)t->nids, n = 0;
    t->adj_start = calloc(nids + 2, sizeof *t->adj_start);
    if (!t->adj_start) return -ENOMEM;
    for (uint32_t i = 0; i <= t->merge_mask; i++)
        if (t->merges[i].key != UINT64_MAX) { t->adj_start[(t->merges[i].key >> 32) + 1]++; n++; }
    for (size_t i = 0; i < nids; i++) t->adj_start[i + 1] += t->adj_start[i];
    t->adj = malloc((n + 1) * sizeof *t->adj);
    uint32_t *fill = malloc((nids + 1) * sizeof *fill);
    if (!t->adj || !fill) { free(fill); return -ENOMEM; }
    memcpy(fill, t->adj_start, nids * sizeof *fill);
    for (uint32_t i = 0; i <= t->merge_mask; i++) {
        const struct merge_ent *m = &t->merges[i];
        if (m->key == UINT64_MAX) continue;
        uint32_t a = (uint32_t)(m->key >> 32);
        t->adj[fill[a]++] = (struct adj_ent){(int32_t)(uint32_t)m->key, m->rank, m->new_id};
    }
    free(fill);
    for (size_t i = 0; i < nids; i++)
        if (t->adj_start[i + 1] - t->adj_start[i] > 1)
            qsort(t->adj + t->adj_start[i], t->adj_start[i + 1] - t->adj_start[i], sizeof *t->adj, adj_cmp);
    free(t->merges);
    t->merges = NULL;
    return 0;
}

static void merge_put(struct tok *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = (uint32_t)mix64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        struct merge_ent *m = &t->merges[i];
        if (m->key == key || m->key == UINT64_MAX) { /* a repeated pair: the last one wins, as in HF */
            m->key = key; m->rank = rank; m->new_id = new_id;
            return;
        }
    }
}

/* ======================================================================
 * UTF-8
 * ====================================================================== */

/* Length of the valid UTF-8 sequence at s[0..n), 0 when invalid, -k when it is
 * a valid but incomplete prefix of k bytes that runs into the end. Follows the
 * Unicode "maximal subpart" rules: on invalid input *bad gets the number of
 * bytes that one U+FFFD replaces. */
static int utf8_seq(const uint8_t *s, size_t n, int *bad) {
    uint8_t b = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else { *bad = 1; return 0; }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return -i;
        uint8_t c = s[i];
        if (c < lo || c > hi) { *bad = i; return 0; }
        lo = 0x80; hi = 0xBF;
    }
    return need;
}

/* Offset of the first invalid UTF-8 byte, or n when all valid. */
static size_t utf8_validate(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            while (i + 8 <= n) { /* ASCII fast path */
                uint64_t w; memcpy(&w, s + i, 8);
                if (w & 0x8080808080808080ULL) break;
                i += 8;
            }
            if (i < n && s[i] < 0x80) { i++; continue; }
            if (i >= n) break;
        }
        int bad = 0, k = utf8_seq(s + i, n - i, &bad);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

static uint32_t utf8_decode1(const uint8_t *s, int k) {
    switch (k) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default: return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                    ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

/* Appends the lossy decoding of s[0..n) to out (room for 3*n bytes needed).
 * When !final, stops before a valid but incomplete sequence at the end and
 * returns the number of bytes consumed; otherwise consumes everything. */
static size_t utf8_lossy(const uint8_t *s, size_t n, int final, char *out, size_t *olen) {
    size_t i = 0, o = *olen;
    while (i < n) {
        if (s[i] < 0x80) { out[o++] = (char)s[i++]; continue; }
        int bad = 0, k = utf8_seq(s + i, n - i, &bad);
        if (k > 0) { memcpy(out + o, s + i, (size_t)k); o += (size_t)k; i += (size_t)k; continue; }
        if (k < 0) {
            if (!final) break;
            bad = -k;
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; i += (size_t)bad;
    }
    *olen = o;
    return i;
}

/* ======================================================================
 * Growable id vector
 * ====================================================================== */

struct ivec { int32_t *v; size_t n, cap; };

static int ivec_push(struct ivec *a, const int32_t *ids, size_t n) {
    if (n == 0) return 0;
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        while (cap < a->n + n) cap *= 2;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -ENOMEM;
        a->v = v; a->cap = cap;
    }
    if (n <= 4) for (size_t i = 0; i < n; i++) a->v[a->n + i] = ids[i]; /* the usual case */
    else memcpy(a->v + a->n, ids, n * sizeof *ids);
    a->n += n;
    return 0;
}

/* ======================================================================
 * Loading
 * ====================================================================== */

/* Raw bytes of a byte-level token string; returns the length or -1 when a
 * character is outside the byte-level alphabet. out needs strlen(s) bytes. */
static long bl_to_bytes(const char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        int bad = 0, k = utf8_seq((const uint8_t *)s + i, n - i, &bad);
        if (k <= 0) return -1;
        uint32_t cp = utf8_decode1((const uint8_t *)s + i, k);
        if (cp >= 324 || g_cp2byte[cp] < 0) return -1;
        out[o++] = (char)g_cp2byte[cp];
        i += (size_t)k;
    }
    return (long)o;
}

static int trie_add(struct trie *tr, const char *s, size_t len, int32_t tokidx) {
    if (tr->nn == 0) {
        tr->cap = 64;
        tr->n = malloc((size_t)tr->cap * sizeof *tr->n);
        if (!tr->n) return -ENOMEM;
        tr->n[0] = (struct trie_node){-1, -1, -1, 0};
        tr->nn = 1;
    }
    int32_t cur = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = tr->n[cur].child;
        while (c >= 0 && tr->n[c].byte != b) c = tr->n[c].sibling;
        if (c < 0) {
            if (tr->nn == tr->cap) {
                struct trie_node *nn = realloc(tr->n, (size_t)tr->cap * 2 * sizeof *nn);
                if (!nn) return -ENOMEM;
                tr->n = nn; tr->cap *= 2;
            }
            c = tr->nn++;
            tr->n[c] = (struct trie_node){-1, tr->n[cur].child, -1, b};
            tr->n[cur].child = c;
        }
        cur = c;
    }
    if (tr->n[cur].tok < 0) tr->n[cur].tok = tokidx; /* first one wins on duplicates */
    tr->nonempty = 1;
    return 0;
}

/* Longest added token starting at s[0..n): its index in tok->added, or -1. */
static int32_t trie_longest(const struct trie *tr, const uint8_t *s, size_t n, size_t *mlen) {
    int32_t cur = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = tr->n[cur].child;
        while (c >= 0 && tr->n[c].byte != s[i]) c = tr->n[c].sibling;
        if (c < 0) break;
        cur = c;
        if (tr->n[cur].tok >= 0) { best = tr->n[cur].tok; *mlen = i + 1; }
    }
    return best;
}

/* Onig's \s (Unicode White_Space) spelled out for PCRE2, whose UCP \s also
 * takes U+180E. */
#define WS_MEMBERS "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Rewrites an Oniguruma pattern for PCRE2: \s and \S (outside classes) and \s
 * inside classes become the explicit White_Space set. Returns malloc'd text. */
static char *regex_translate(const char *p) {
    size_t n = strlen(p), cap = n * 8 + 64, o = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        if (o + 160 > cap) {
            cap *= 2;
            char *nb = realloc(out, cap);
            if (!nb) { free(out); return NULL; }
            out = nb;
        }
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            if (e == 's') {
                o += (size_t)sprintf(out + o, in_class ? "%s" : "[%s]", WS_MEMBERS);
                i++;
                continue;
            }
            if (e == 'S' && !in_class) {
                o += (size_t)sprintf(out + o, "[^%s]", WS_MEMBERS);
                i++;
                continue;
            }
            out[o++] = c; out[o++] = e; i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[o++] = c;
            if (i + 1 < n && p[i + 1] == '^') out[o++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') out[o++] = p[++i]; /* literal ] first */
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *end = strstr(p + i + 2, ":]");
            if (end) {
                size_t k = (size_t)(end + 2 - (p + i));
                memcpy(out + o, p + i, k); o += k; i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

static int compile_re(struct pt_step *st, const char *pat, int literal, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    char *tr = NULL;
    uint32_t opts = PCRE2_UTF;
    if (literal) opts |= PCRE2_LITERAL;
    else {
        opts |= PCRE2_UCP;
        tr = regex_translate(pat);
        if (!tr) return util_err(err, errlen, -ENOMEM, "tokenizer: out of memory");
        pat = tr;
    }
    st->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!st->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        int rc = util_err(err, errlen, -EINVAL, "tokenizer.json: pre_tokenizer regex \"%s\" does not compile at %zu: %s",
                          pat, (size_t)eo, (char *)msg);
        free(tr);
        return rc;
    }
    free(tr);
    st->jit = pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int jbool(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int parse_normalizer(struct tok *t, const cJSON *n, char *err, size_t errlen) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = jstr(n, "type");
    if (!type) return util_err(err, errlen, -EINVAL, "tokenizer.json: normalizer without a type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        cJSON_ArrayForEach(it, arr) {
            int rc = parse_normalizer(t, it, err, errlen);
            if (rc < 0) return rc;
        }
        return 0;
    }
    int opt;
    if (strcmp(type, "NFC") == 0) opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (strcmp(type, "NFD") == 0) opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (strcmp(type, "NFKC") == 0) opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (strcmp(type, "NFKD") == 0) opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else return util_err(err, errlen, -ENOTSUP, "tokenizer.json: normalizer \"%s\" is not supported (NFC, NFD, NFKC, NFKD, Sequence)", type);
    if (t->nnorm == 4) return util_err(err, errlen, -ENOTSUP, "tokenizer.json: too many normalizers");
    t->norm[t->nnorm++] = opt;
    return 0;
}

static int parse_pretok(struct tok *t, const cJSON *p, char *err, size_t errlen) {
    if (!p || cJSON_IsNull(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) return util_err(err, errlen, -EINVAL, "tokenizer.json: pre_tokenizer without a type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        cJSON_ArrayForEach(it, arr) {
            int rc = parse_pretok(t, it, err, errlen);
            if (rc < 0) return rc;
        }
        return 0;
    }
    if (t->nsteps == (int)(sizeof t->steps / sizeof t->steps[0]))
        return util_err(err, errlen, -ENOTSUP, "tokenizer.json: too many pre-tokenizers");
    struct pt_step *st = &t->steps[t->nsteps];
    memset(st, 0, sizeof *st);
    if (strcmp(type, "ByteLevel") == 0) {
        st->kind = PT_BYTELEVEL;
        st->beh = SB_ISOLATED;
        st->add_prefix_space = jbool(p, "add_prefix_space", 1);
        if (jbool(p, "use_regex", 1)) {
            int rc = compile_re(st, GPT2_RE, 0, err, errlen);
            if (rc < 0) return rc;
        }
        t->nsteps++;
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        st->kind = PT_SPLIT;
        if (jbool(p, "invert", 0))
            return util_err(err, errlen, -ENOTSUP, "tokenizer.json: Split pre-tokenizer with invert=true is not supported");
        const char *beh = jstr(p, "behavior");
        if (!beh) return util_err(err, errlen, -EINVAL, "tokenizer.json: Split pre-tokenizer without behavior");
        if (strcmp(beh, "Isolated") == 0) st->beh = SB_ISOLATED;
        else if (strcmp(beh, "Removed") == 0) st->beh = SB_REMOVED;
        else if (strcmp(beh, "MergedWithPrevious") == 0) st->beh = SB_MERGED_PREV;
        else if (strcmp(beh, "MergedWithNext") == 0) st->beh = SB_MERGED_NEXT;
        else if (strcmp(beh, "Contiguous") == 0) st->beh = SB_CONTIGUOUS;
        else return util_err(err, errlen, -ENOTSUP, "tokenizer.json: Split behavior \"%s\" is not supported", beh);
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        if (!re && !lit) return util_err(err, errlen, -EINVAL, "tokenizer.json: Split pre-tokenizer without a Regex or String pattern");
        int rc = compile_re(st, re ? re : lit, !re, err, errlen);
        if (rc < 0) return rc;
        t->nsteps++;
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        /* HF: every char::is_numeric() character (Nd, Nl, No) is a match;
         * individual_digits isolates each, otherwise runs stay together */
        st->kind = PT_SPLIT;
        st->beh = jbool(p, "individual_digits", 0) ? SB_ISOLATED : SB_CONTIGUOUS;
        int rc = compile_re(st, "\\p{N}", 0, err, errlen);
        if (rc < 0) return rc;
        t->nsteps++;
        return 0;
    }
    return util_err(err, errlen, -ENOTSUP,
                    "tokenizer.json: pre_tokenizer \"%s\" is not supported (byte-level BPE needs ByteLevel, Split, Digits, Sequence)", type);
}

static int append_ids(int32_t **arr, int *n, const int32_t *ids, int k) {
    int32_t *a = realloc(*arr, (size_t)(*n + k + 1) * sizeof *a);
    if (!a) return -ENOMEM;
    if (k) memcpy(a + *n, ids, (size_t)k * sizeof *ids);
    *arr = a; *n += k;
    return 0;
}

static int parse_template_part(struct tok *t, const cJSON *items, const cJSON *specials,
                               int32_t **pre, int *npre, int32_t **suf, int *nsuf, char *err, size_t errlen) {
    int seen_seq = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, items) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        if (sq) {
            if (seen_seq) return util_err(err, errlen, -ENOTSUP, "tokenizer.json: TemplateProcessing with two sequences in \"single\"");
            seen_seq = 1;
            continue;
        }
        const char *name = jstr(sp, "id");
        if (!name) return util_err(err, errlen, -EINVAL, "tokenizer.json: bad TemplateProcessing item");
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *x;
        if (!cJSON_IsArray(ids)) return util_err(err, errlen, -EINVAL, "tokenizer.json: TemplateProcessing special token \"%s\" has no ids", name);
        cJSON_ArrayForEach(x, ids) {
            int32_t id = (int32_t)x->valuedouble;
            if (!cJSON_IsNumber(x) || id < 0 || id >= t->nids || !(t->flags[id] & TF_VALID))
                return util_err(err, errlen, -EINVAL, "tokenizer.json: TemplateProcessing special token \"%s\" has a bad id", name);
            int rc = seen_seq ? append_ids(suf, nsuf, &id, 1) : append_ids(pre, npre, &id, 1);
            if (rc < 0) return util_err(err, errlen, rc, "tokenizer: out of memory");
        }
    }
    return 0;
}

static int parse_post(struct tok *t, const cJSON *p, char *err, size_t errlen) {
    if (!p || cJSON_IsNull(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) return util_err(err, errlen, -EINVAL, "tokenizer.json: post_processor without a type");
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(p, "processors");
        cJSON_ArrayForEach(it, arr) {
            int rc = parse_post(t, it, err, errlen);
            if (rc < 0) return rc;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        /* a later processor wraps what the earlier ones made */
        int32_t *pre = NULL, *suf = NULL;
        int npre = 0, nsuf = 0;
        int rc = parse_template_part(t, cJSON_GetObjectItemCaseSensitive(p, "single"),
                                     cJSON_GetObjectItemCaseSensitive(p, "special_tokens"),
                                     &pre, &npre, &suf, &nsuf, err, errlen);
        if (rc == 0) rc = append_ids(&pre, &npre, t->prefix, t->nprefix);
        if (rc == 0) rc = append_ids(&suf, &nsuf, NULL, 0);
        if (rc == 0) {
            int32_t *s2 = NULL; int n2 = 0;
            rc = append_ids(&s2, &n2, t->suffix, t->nsuffix);
            if (rc == 0) rc = append_ids(&s2, &n2, suf, nsuf);
            if (rc == 0) { free(t->suffix); t->suffix = s2; t->nsuffix = n2; } else free(s2);
        }
        free(suf);
        if (rc < 0) { free(pre); return rc == -ENOMEM ? util_err(err, errlen, rc, "tokenizer: out of memory") : rc; }
        free(t->prefix); t->prefix = pre; t->nprefix = npre;
        return 0;
    }
    return util_err(err, errlen, -ENOTSUP, "tokenizer.json: post_processor \"%s\" is not supported (ByteLevel, TemplateProcessing, Sequence)", type);
}

static int check_decoder(const cJSON *d, char *err, size_t errlen) {
    const char *type = d ? jstr(d, "type") : NULL;
    if (type && strcmp(type, "ByteLevel") == 0) return 0;
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        int n = 0;
        cJSON_ArrayForEach(it, arr) {
            int rc = check_decoder(it, err, errlen);
            if (rc < 0) return rc;
            n++;
        }
        if (n) return 0;
    }
    return util_err(err, errlen, -ENOTSUP, "tokenizer.json: decoder \"%s\" is not supported (ByteLevel only)",
                    type ? type : "null");
}

/* bos_token / eos_token in tokenizer_config.json: a string, an object with
 * "content", or null. */
static int32_t config_token(const struct tok *t, const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = NULL;
    if (cJSON_IsString(v)) s = v->valuestring;
    else if (cJSON_IsObject(v)) s = jstr(v, "content");
    return s ? tok_token_to_id(t, s, strlen(s)) : -1;
}

static int load_model(struct tok *t, const cJSON *root, char *err, size_t errlen) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return util_err(err, errlen, -EINVAL, "tokenizer.json: no \"model\" object");
    const char *type = jstr(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (type && strcmp(type, "BPE") != 0)
        return util_err(err, errlen, -ENOTSUP, "tokenizer.json: model type \"%s\" is not supported; only byte-level BPE is (Unigram, WordPiece and WordLevel are not)", type);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return util_err(err, errlen, -EINVAL, "tokenizer.json: BPE model without vocab object and merges array");
    if (jbool(model, "byte_fallback", 0))
        return util_err(err, errlen, -ENOTSUP, "tokenizer.json: SentencePiece-style BPE with byte_fallback is not supported yet (byte-level BPE only)");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
        return util_err(err, errlen, -ENOTSUP, "tokenizer.json: BPE dropout is not supported");
    const char *csp = jstr(model, "continuing_subword_prefix"), *eows = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eows && *eows))
        return util_err(err, errlen, -ENOTSUP, "tokenizer.json: BPE continuing_subword_prefix/end_of_word_suffix are not supported");
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);

    /* ids: model vocab and added tokens */
    int32_t maxid = -1;
    int nvocab = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e8)
            return util_err(err, errlen, -EINVAL, "tokenizer.json: vocab entry \"%s\" has a bad id", it->string);
        if ((int32_t)it->valuedouble > maxid) maxid = (int32_t)it->valuedouble;
        nvocab++;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    int nadded = cJSON_GetArraySize(added);
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8 || !jstr(it, "content"))
            return util_err(err, errlen, -EINVAL, "tokenizer.json: added_tokens entry without id/content");
        if ((int32_t)id->valuedouble > maxid) maxid = (int32_t)id->valuedouble;
    }
    if (maxid < 0) return util_err(err, errlen, -EINVAL, "tokenizer.json: empty vocabulary");
    t->nids = maxid + 1;
    size_t nids = (size_t)t->nids;
    const char **mstr = calloc(nids, sizeof *mstr); /* model string per id */
    const char **astr = calloc(nids, sizeof *astr); /* added content per id */
    t->flags = calloc(nids, 1);
    t->added = calloc((size_t)nadded + 1, sizeof *t->added);
    int rc = -ENOMEM;
    char *tmp = NULL;
    if (!mstr || !astr || !t->flags || !t->added) goto oom;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = (int32_t)it->valuedouble;
        mstr[id] = it->string;
        t->flags[id] |= TF_VALID | TF_MODEL;
    }
    cJSON_ArrayForEach(it, added) {
        struct added_tok *a = &t->added[t->nadded];
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        a->content = strdup(jstr(it, "content"));
        if (!a->content) goto oom;
        a->len = strlen(a->content);
        a->special = (uint8_t)jbool(it, "special", 0);
        a->normalized = (uint8_t)jbool(it, "normalized", !a->special);
        a->lstrip = (uint8_t)jbool(it, "lstrip", 0);
        a->rstrip = (uint8_t)jbool(it, "rstrip", 0);
        a->single_word = (uint8_t)jbool(it, "single_word", 0);
        t->nadded++;
        astr[a->id] = a->content;
        t->flags[a->id] |= TF_VALID | TF_ADDED | (a->special ? TF_SPECIAL : 0);
    }

    /* string, decoded-bytes and model-bytes blobs */
    size_t total = 0, maxlen = 0;
    for (size_t i = 0; i < nids; i++) {
        const char *s = astr[i] ? astr[i] : mstr[i];
        size_t l = s ? strlen(s) : 0, lm = mstr[i] ? strlen(mstr[i]) : 0;
        total += l + 1;
        if (l > maxlen) maxlen = l;
        if (lm > maxlen) maxlen = lm;
    }
    if (total > UINT32_MAX / 2) { rc = util_err(err, errlen, -EINVAL, "tokenizer.json: vocabulary too large"); goto fail; }
    t->str_off = malloc((nids + 1) * sizeof *t->str_off);
    t->byte_off = malloc((nids + 1) * sizeof *t->byte_off);
    t->mbyte_off = malloc((nids + 1) * sizeof *t->mbyte_off);
    t->strs = malloc(total + 1);
    t->bytes = malloc(total + 1);
    t->mbytes = malloc(total + 1);
    tmp = malloc(maxlen + 1);
    if (!t->str_off || !t->byte_off || !t->mbyte_off || !t->strs || !t->bytes || !t->mbytes || !tmp) goto oom;
    size_t so = 0, bo = 0, mo = 0;
    for (size_t i = 0; i < nids; i++) {
        const char *s = astr[i] ? astr[i] : mstr[i];
        size_t l = s ? strlen(s) : 0;
        t->str_off[i] = (uint32_t)so;
        if (l) memcpy(t->strs + so, s, l);
        so += l;
        t->strs[so++] = 0;
        /* what HF's ByteLevel decoder makes of the token: its bytes when every
         * character is in the byte alphabet, else its UTF-8 text as is */
        t->byte_off[i] = (uint32_t)bo;
        long k = l ? bl_to_bytes(s, l, tmp) : 0;
        if (k >= 0) { memcpy(t->bytes + bo, tmp, (size_t)k); bo += (size_t)k; }
        else { memcpy(t->bytes + bo, s, l); bo += l; }
        /* the model token's raw bytes, for encoding */
        t->mbyte_off[i] = (uint32_t)mo;
        if (mstr[i]) {
            k = bl_to_bytes(mstr[i], strlen(mstr[i]), tmp);
            if (k > 0) { memcpy(t->mbytes + mo, tmp, (size_t)k); mo += (size_t)k; }
        }
    }
    t->str_off[nids] = (uint32_t)so;
    t->byte_off[nids] = (uint32_t)bo;
    t->mbyte_off[nids] = (uint32_t)mo;
    if (idhash_init(&t->str_hash, nids) < 0 || idhash_init(&t->byte_hash, nids) < 0) goto oom;
    /* str_hash keys span each string and its NUL (see tok_token_to_id) */
    for (size_t i = 0; i < nids; i++)
        if (mstr[i] && !astr[i]) idhash_put(&t->str_hash, t->str_off, t->strs, (int32_t)i);
    for (size_t i = 0; i < nids; i++)
        if (astr[i]) idhash_put(&t->str_hash, t->str_off, t->strs, (int32_t)i);
    for (size_t i = 0; i < nids; i++)
        if (t->mbyte_off[i + 1] > t->mbyte_off[i]) idhash_put(&t->byte_hash, t->mbyte_off, t->mbytes, (int32_t)i);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = idhash_get(&t->byte_hash, t->mbyte_off, t->mbytes, &c, 1);
    }
    t->unk_id = -1;
    const char *unk = jstr(model, "unk_token");
    if (unk) t->unk_id = tok_token_to_id(t, unk, strlen(unk));

    /* merges */
    int nmerges = cJSON_GetArraySize(merges);
    size_t mcap = 16;
    while (mcap < (size_t)nmerges * 2) mcap <<= 1;
    t->merges = malloc(mcap * sizeof *t->merges);
    if (!t->merges) goto oom;
    memset(t->merges, 0xff, mcap * sizeof *t->merges);
    t->merge_mask = (uint32_t)(mcap - 1);
    char *cat = malloc(2 * maxlen + 2);
    if (!cat) goto oom;
    uint32_t rank = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = util_err(err, errlen, -EINVAL, "tokenizer.json: merge %u \"%s\" is not two tokens", rank, s);
                free(cat); goto fail;
            }
            a = s; la = (size_t)(sp - s); b = sp + 1; lb = strlen(b);
        } else if (cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring; la = strlen(a);
            b = cJSON_GetArrayItem(it, 1)->valuestring; lb = strlen(b);
        } else {
            rc = util_err(err, errlen, -EINVAL, "tokenizer.json: merge %u is neither \"a b\" nor [\"a\",\"b\"]", rank);
            free(cat); goto fail;
        }
        if (la + lb > 2 * maxlen) {
            rc = util_err(err, errlen, -EINVAL, "tokenizer.json: merge %u makes a token not in the vocabulary", rank);
            free(cat); goto fail;
        }
        int32_t ia = tok_token_to_id(t, a, la), ib = tok_token_to_id(t, b, lb);
        memcpy(cat, a, la); memcpy(cat + la, b, lb);
        int32_t in = tok_token_to_id(t, cat, la + lb);
        if (ia < 0 || ib < 0 || in < 0) {
            rc = util_err(err, errlen, -EINVAL, "tokenizer.json: merge %u (\"%.*s\" \"%.*s\") uses a token not in the vocabulary",
                          rank, (int)la, a, (int)lb, b);
            free(cat); goto fail;
        }
        merge_put(t, ia, ib, rank, in);
        rank++;
    }
    free(cat);
    if (merges_finish(t) < 0) goto oom;
    t->all_bytes = 1;
    for (int b = 0; b < 256; b++) t->all_bytes &= t->byte_id[b] >= 0;
    t->byte_pairs = malloc(65536 * sizeof *t->byte_pairs);
    if (!t->byte_pairs) goto oom;
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) {
            const struct adj_ent *m = t->byte_id[a] >= 0 && t->byte_id[b] >= 0 ? merge_get(t, t->byte_id[a], t->byte_id[b]) : NULL;
            t->byte_pairs[a * 256 + b] = m ? (struct pair_ent){m->rank, m->new_id} : (struct pair_ent){0, -1};
        }
    free(tmp); free(mstr); free(astr);
    return 0;
oom:
    rc = util_err(err, errlen, -ENOMEM, "tokenizer: out of memory loading the vocabulary");
fail:
    free(tmp); free(mstr); free(astr);
    return rc;
}

/* Applies the normalizer chain to s[0..n): *out is malloc'd (NUL-terminated). */
static int normalize(const struct tok *t, const char *s, size_t n, char **out, size_t *outlen) {
    char *cur = NULL;
    size_t curlen = n;
    const char *src = s;
    for (int i = 0; i < t->nnorm; i++) {
        utf8proc_uint8_t *o = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)src, (utf8proc_ssize_t)curlen, &o,
                                          (utf8proc_option_t)t->norm[i]);
        free(cur);
        if (r < 0) { free(o); return -EILSEQ; }
        cur = (char *)o; curlen = (size_t)r; src = cur;
    }
    if (!cur) {
        cur = malloc(n + 1);
        if (!cur) return -ENOMEM;
        memcpy(cur, s, n);
        cur[n] = 0;
    }
    *out = cur;
    *outlen = curlen;
    return 0;
}

int tok_load(const char *dir, struct tok **out, char *err, size_t errlen) {
    if (!dir || !out) return util_err(err, errlen, -EINVAL, "tok_load: NULL argument");
    *out = NULL;
    pthread_once(&g_bl_once, bl_init);
    char path[4096], cpath[4096];
    struct stat stt;
    if (stat(dir, &stt) == 0 && S_ISREG(stt.st_mode)) {
        snprintf(path, sizeof path, "%s", dir);
        const char *sl = strrchr(dir, '/');
        snprintf(cpath, sizeof cpath, "%.*stokenizer_config.json", sl ? (int)(sl - dir + 1) : 0, dir);
    } else {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = util_read_file(path, 0, &text, &len, err, errlen);
    if (rc < 0) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return util_err(err, errlen, -EINVAL, "%s: not valid JSON", path);
    struct tok *t = calloc(1, sizeof *t);
    if (!t) { cJSON_Delete(root); return util_err(err, errlen, -ENOMEM, "tokenizer: out of memory"); }
    t->bos_id = t->eos_id = -1;
    for (int i = 0; i < CACHE_SHARDS; i++) pthread_mutex_init(&t->cache[i].mu, NULL);

    if ((rc = load_model(t, root, err, errlen)) < 0) goto fail;
    if ((rc = parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen)) < 0) goto fail;
    t->norm_nfc_only = t->nnorm == 1 && t->norm[0] == (UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    for (int i = 0; i < t->nadded; i++) {
        struct added_tok *a = &t->added[i];
        if (!a->len) continue;
        if (!a->normalized) rc = trie_add(&t->trie_raw, a->content, a->len, i);
        else { /* matched in normalized text, so the pattern is normalized too (as HF does) */
            char *c = NULL;
            size_t cl = 0;
            rc = normalize(t, a->content, a->len, &c, &cl);
            if (rc == 0) rc = trie_add(&t->trie_norm, c, cl, i);
            free(c);
        }
        if (rc < 0) {
            rc = util_err(err, errlen, rc, "tokenizer: cannot prepare added token \"%s\"", a->content);
            goto fail;
        }
    }
    if ((rc = parse_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err, errlen)) < 0) goto fail;
    {
        int has_bl = 0;
        for (int i = 0; i < t->nsteps; i++) has_bl |= t->steps[i].kind == PT_BYTELEVEL;
        if (!has_bl) {
            rc = util_err(err, errlen, -ENOTSUP, "tokenizer.json: not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer; SentencePiece-style BPE is not supported yet)");
            goto fail;
        }
    }
    if ((rc = parse_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), err, errlen)) < 0) goto fail;
    if ((rc = check_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), err, errlen)) < 0) goto fail;
    cJSON_Delete(root);
    root = NULL;

    /* tokenizer_config.json (optional) */
    if (util_read_file(cpath, 0, &text, &len, NULL, 0) == 0) {
        cJSON *cfg = cJSON_ParseWithLength(text, len);
        free(text);
        if (!cfg) { rc = util_err(err, errlen, -EINVAL, "%s: not valid JSON", cpath); goto fail; }
        t->bos_id = config_token(t, cfg, "bos_token");
        t->eos_id = config_token(t, cfg, "eos_token");
        int add_bos = jbool(cfg, "add_bos_token", 0);
        cJSON_Delete(cfg);
        if (add_bos && t->bos_id >= 0 && !(t->nprefix > 0 && t->prefix[0] == t->bos_id)) {
            int32_t *p = malloc((size_t)(t->nprefix + 1) * sizeof *p);
            if (!p) { rc = util_err(err, errlen, -ENOMEM, "tokenizer: out of memory"); goto fail; }
            p[0] = t->bos_id;
            if (t->nprefix) memcpy(p + 1, t->prefix, (size_t)t->nprefix * sizeof *p);
            free(t->prefix);
            t->prefix = p;
            t->nprefix++;
        }
    }
    t->adds_bos = t->bos_id >= 0 && t->nprefix > 0 && t->prefix[0] == t->bos_id;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        t->cache[i].e = calloc(CACHE_SHARD_CAP, sizeof *t->cache[i].e);
        if (!t->cache[i].e) { rc = util_err(err, errlen, -ENOMEM, "tokenizer: out of memory"); goto fail; }
    }
    *out = t;
    return 0;
fail:
    cJSON_Delete(root);
    tok_free(t);
    return rc;
}

static void cache_clear(struct cache_shard *c) {
    for (int j = 0; j < CACHE_SHARD_CAP; j++) {
        free(c->e[j].ids);
        c->e[j] = (struct cache_ent){0};
    }
    c->count = 0;
}

void tok_free(struct tok *t) {
    if (!t) return;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        if (t->cache[i].e) cache_clear(&t->cache[i]);
        free(t->cache[i].e);
        pthread_mutex_destroy(&t->cache[i].mu);
    }
    for (int i = 0; i < t->nsteps; i++) pcre2_code_free(t->steps[i].re);
    for (int i = 0; i < t->nadded; i++) free(t->added[i].content);
    free(t->added);
    free(t->trie_raw.n); free(t->trie_norm.n);
    free(t->flags); free(t->str_off); free(t->strs); free(t->byte_off); free(t->bytes);
    free(t->mbyte_off); free(t->mbytes);
    idhash_free(&t->str_hash); idhash_free(&t->byte_hash);
    free(t->merges); free(t->adj_start); free(t->adj); free(t->byte_pairs); free(t->prefix); free(t->suffix);
    free(t);
}

/* ======================================================================
 * Small accessors
 * ====================================================================== */

int32_t tok_token_to_id(const struct tok *t, const char *s, size_t len) {
    if (!t || !s) return -1;
    /* keys in str_hash include the terminating NUL (blob offsets span it) */
    char stackbuf[256];
    char *k = len + 1 <= sizeof stackbuf ? stackbuf : malloc(len + 1);
    if (!k) return -1;
    memcpy(k, s, len);
    k[len] = 0;
    int32_t id = idhash_get(&t->str_hash, t->str_off, t->strs, k, len + 1);
    if (k != stackbuf) free(k);
    return id;
}

int32_t tok_vocab_size(const struct tok *t) { return t->nids; }
int tok_is_valid(const struct tok *t, int32_t id) { return id >= 0 && id < t->nids && (t->flags[id] & TF_VALID); }
int tok_is_special(const struct tok *t, int32_t id) { return tok_is_valid(t, id) && (t->flags[id] & TF_SPECIAL); }
int32_t tok_bos_id(const struct tok *t) { return t->bos_id; }
int32_t tok_eos_id(const struct tok *t) { return t->eos_id; }
int tok_adds_bos(const struct tok *t) { return t->adds_bos; }

const char *tok_token_bytes(const struct tok *t, int32_t id, size_t *len) {
    if (!tok_is_valid(t, id)) return NULL;
    *len = t->byte_off[id + 1] - t->byte_off[id];
    return t->bytes + t->byte_off[id];
}

const char *tok_token_str(const struct tok *t, int32_t id) {
    if (!tok_is_valid(t, id)) return NULL;
    return t->strs + t->str_off[id];
}

/* ======================================================================
 * BPE on one pre-token (raw bytes), with a sharded word cache
 * ====================================================================== */

struct sym { int32_t id, prev, next; uint32_t len; };
/* a candidate merge of the symbols at pos and its right neighbour, valid while
 * they still hold ids left and right */
struct hent { uint64_t key; int32_t left, right, new_id; }; /* key = rank << 32 | pos */

static void heap_push(struct hent *h, size_t *n, struct hent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (e.key >= h[p].key) break;
        h[i] = h[p]; i = p;
    }
    h[i] = e;
}
static struct hent heap_pop(struct hent *h, size_t *n) {
    struct hent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].key < h[c].key) c++;
        if (h[c].key >= last.key) break;
        h[i] = h[c]; i = c;
    }
    h[i] = last;
    return top;
}

static inline void push_pair(const struct tok *t, struct hent *h, size_t *nh, const struct sym *s, int32_t pos) {
    const struct adj_ent *m = merge_get(t, s[pos].id, s[s[pos].next].id);
    if (m) heap_push(h, nh, (struct hent){((uint64_t)m->rank << 32) | (uint32_t)pos, s[pos].id,
                                          s[s[pos].next].id, m->new_id});
}

/* Merges the bytes of one word by rank: always the lowest-ranked adjacent pair,
 * the leftmost on ties (what HF's heap-based Word::merge_all does). */
static int bpe_merge(const struct tok *t, const uint8_t *w, size_t n, struct ivec *out) {
    struct sym sbuf[64];
    struct hent hbuf[192];
    struct sym *s = n <= 64 ? sbuf : malloc(n * sizeof *s);
    struct hent *h = n <= 64 ? hbuf : malloc(3 * n * sizeof *h);
    if (!s || !h) {
        if (s != sbuf) free(s);
        if (h != hbuf) free(h);
        return -ENOMEM;
    }
    size_t ns = 0, nh = 0; /* at most 3n heap entries are ever pushed */
    if (t->all_bytes) {
        /* every byte is a token: the first pairs come from the byte-pair table */
        for (size_t i = 0; i < n; i++) {
            s[i] = (struct sym){t->byte_id[w[i]], (int32_t)i - 1, (int32_t)i + 1, 1};
            if (i + 1 < n) {
                const struct pair_ent *p = &t->byte_pairs[w[i] * 256 + w[i + 1]];
                if (p->new_id >= 0)
                    heap_push(h, &nh, (struct hent){((uint64_t)p->rank << 32) | (uint32_t)i, t->byte_id[w[i]],
                                                    t->byte_id[w[i + 1]], p->new_id});
            }
        }
        ns = n;
        s[ns - 1].next = -1;
    } else {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[w[i]];
            if (id < 0) {
                if (t->unk_id < 0) continue; /* HF drops a character it cannot map */
                if (t->fuse_unk && ns && s[ns - 1].id == t->unk_id) { s[ns - 1].len++; continue; }
                id = t->unk_id;
            }
            s[ns] = (struct sym){id, (int32_t)ns - 1, (int32_t)ns + 1, 1};
            ns++;
        }
        if (ns) s[ns - 1].next = -1;
        for (size_t i = 0; i + 1 < ns; i++) push_pair(t, h, &nh, s, (int32_t)i);
    }
    while (nh) {
        struct hent top = heap_pop(h, &nh);
        int32_t pos = (int32_t)(uint32_t)top.key;
        struct sym *a = &s[pos];
        if (a->len == 0 || a->next < 0 || a->id != top.left) continue; /* stale entry */
        struct sym *b = &s[a->next];
        if (b->id != top.right) continue;
        a->id = top.new_id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) s[b->next].prev = pos;
        if (a->prev >= 0) push_pair(t, h, &nh, s, a->prev);
        if (a->next >= 0) push_pair(t, h, &nh, s, pos);
    }
    int rc = 0;
    for (int32_t i = ns ? 0 : -1; i >= 0 && rc == 0; i = s[i].next) rc = ivec_push(out, &s[i].id, 1);
    if (s != sbuf) free(s);
    if (h != hbuf) free(h);
    return rc;
}

static int bpe_word(const struct tok *t, const uint8_t *w, size_t n, struct ivec *out) {
    if (n == 0) return 0;
    if (n == 1 && t->byte_id[w[0]] >= 0) return ivec_push(out, &t->byte_id[w[0]], 1);
    if (t->ignore_merges) {
        int32_t id = idhash_get(&t->byte_hash, t->mbyte_off, t->mbytes, w, n);
        if (id >= 0) return ivec_push(out, &id, 1);
    }
    if (n > CACHE_MAX_WORD) return bpe_merge(t, w, n, out);
    uint64_t hv = hash_bytes(w, n);
    struct cache_shard *c = (struct cache_shard *)&t->cache[hv % CACHE_SHARDS];
    uint32_t mask = CACHE_SHARD_CAP - 1;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = (uint32_t)(hv >> 8) & mask;; i = (i + 1) & mask) {
        struct cache_ent *e = &c->e[i];
        if (e->h == 0) break;
        if (e->h == hv && e->wlen == n && memcmp(e->ids + e->nids, w, n) == 0) {
            int rc = ivec_push(out, e->ids, e->nids);
            pthread_mutex_unlock(&c->mu);
            return rc;
        }
    }
    pthread_mutex_unlock(&c->mu);

    size_t before = out->n;
    int rc = bpe_merge(t, w, n, out);
    if (rc < 0) return rc;
    size_t k = out->n - before;
    int32_t *blob = malloc(k * sizeof(int32_t) + n);
    if (!blob) return 0; /* caching is optional */
    if (k) memcpy(blob, out->v + before, k * sizeof(int32_t));
    memcpy(blob + k, w, n);
    pthread_mutex_lock(&c->mu);
    if (c->count >= CACHE_SHARD_CAP / 2) cache_clear(c);
    for (uint32_t i = (uint32_t)(hv >> 8) & mask;; i = (i + 1) & mask) {
        struct cache_ent *e = &c->e[i];
        if (e->h == hv && e->wlen == n && memcmp(e->ids + e->nids, w, n) == 0) { free(blob); break; }
        if (e->h == 0) {
            *e = (struct cache_ent){hv, blob, (uint16_t)k, (uint16_t)n};
            c->count++;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* ======================================================================
 * Encode pipeline: added tokens -> normalizer -> pre-tokenizer -> BPE
 * ====================================================================== */

struct enc {
    const struct tok *t;
    struct ivec *out;
    pcre2_match_data *md;
    char *err;
    size_t errlen;
};

static int pretok(struct enc *e, int step, const char *s, size_t n);

/* One regex search: 1 match in [*ms, *me), 0 none, <0 error. */
static int re_find(struct enc *e, const struct pt_step *st, const char *s, size_t n, size_t off,
                   size_t *ms, size_t *me) {
    int rc = st->jit ? pcre2_jit_match(st->re, (PCRE2_SPTR)s, n, off, 0, e->md, NULL)
                     : pcre2_match(st->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, e->md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return util_err(e->err, e->errlen, -EINVAL, "tokenizer: regex match failed: %s", (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    *ms = ov[0]; *me = ov[1];
    return 1;
}

struct span { size_t a, b; int m; };

static int split_general(struct enc *e, int step, const struct pt_step *st, const char *s, size_t n) {
    size_t cap = 16, ns = 0, off = 0, prev = 0;
    struct span *sp = malloc(cap * sizeof *sp);
    if (!sp) return -ENOMEM;
    int rc = 0;
    while (off <= n) {
        size_t ms = 0, me = 0; /* set by re_find on a match (rc > 0) */
        rc = re_find(e, st, s, n, off, &ms, &me);
        if (rc <= 0) break;
        if (ns + 2 > cap) {
            struct span *np = realloc(sp, (cap *= 2) * sizeof *sp);
            if (!np) { rc = -ENOMEM; break; }
            sp = np;
        }
        if (prev != ms) sp[ns++] = (struct span){prev, ms, 0};
        sp[ns++] = (struct span){ms, me, 1};
        prev = me;
        if (me == ms) { /* empty match: step over one character */
            if (me >= n) break;
            off = me + 1;
            while (off < n && ((uint8_t)s[off] & 0xC0) == 0x80) off++;
        } else off = me;
    }
    if (rc >= 0 && prev < n) {
        if (ns + 1 > cap) {
            struct span *np = realloc(sp, (cap + 1) * sizeof *sp);
            if (!np) rc = -ENOMEM; else sp = np;
        }
        if (rc >= 0) sp[ns++] = (struct span){prev, n, 0};
    }
    if (rc < 0) { free(sp); return rc; }
    /* fold by behaviour (as HF's NormalizedString::split) */
    size_t k = 0;
    int prev_match = 0;
    if (st->beh == SB_MERGED_NEXT) {
        /* walk from the right into a new list, then reverse it */
        struct span *r = malloc((ns + 1) * sizeof *r);
        if (!r) { free(sp); return -ENOMEM; }
        for (size_t j = ns; j-- > 0;) {
            if (sp[j].m && !prev_match && k) r[k - 1].a = sp[j].a;
            else r[k++] = (struct span){sp[j].a, sp[j].b, 0};
            prev_match = sp[j].m;
        }
        for (size_t j = 0; j < k; j++) sp[j] = r[k - 1 - j];
        free(r);
    } else {
        for (size_t j = 0; j < ns; j++) {
            struct span x = sp[j];
            switch (st->beh) {
            case SB_REMOVED: if (!x.m) sp[k++] = x; break;
            case SB_ISOLATED: sp[k++] = x; break;
            case SB_MERGED_PREV:
                if (x.m && !prev_match && k) sp[k - 1].b = x.b;
                else sp[k++] = x;
                break;
            case SB_CONTIGUOUS:
                if (k && x.m == prev_match) sp[k - 1].b = x.b;
                else sp[k++] = x;
                break;
            default: break;
            }
            prev_match = x.m;
        }
    }
    for (size_t j = 0; j < k && rc >= 0; j++)
        if (sp[j].b > sp[j].a) rc = pretok(e, step + 1, s + sp[j].a, sp[j].b - sp[j].a);
    free(sp);
    return rc;
}

static int pretok(struct enc *e, int step, const char *s, size_t n) {
    const struct tok *t = e->t;
    if (n == 0) return 0;
    if (step == t->nsteps) return bpe_word(t, (const uint8_t *)s, n, e->out);
    const struct pt_step *st = &t->steps[step];
    if (st->kind == PT_BYTELEVEL && st->add_prefix_space && s[0] != ' ') {
        char *p = malloc(n + 1);
        if (!p) return -ENOMEM;
        p[0] = ' ';
        memcpy(p + 1, s, n);
        struct pt_step tmp = *st;
        tmp.add_prefix_space = 0;
        int rc;
        if (!tmp.re) rc = pretok(e, step + 1, p, n + 1);
        else rc = split_general(e, step, &tmp, p, n + 1);
        free(p);
        return rc;
    }
    if (!st->re) return pretok(e, step + 1, s, n);
    if (st->beh != SB_ISOLATED) return split_general(e, step, st, s, n);
    /* Isolated, the common case: every match and every gap is a piece */
    size_t off = 0, prev = 0;
    int rc = 0;
    while (off <= n) {
        size_t ms = 0, me = 0; /* set by re_find on a match (rc > 0) */
        rc = re_find(e, st, s, n, off, &ms, &me);
        if (rc <= 0) break;
        if (prev != ms && (rc = pretok(e, step + 1, s + prev, ms - prev)) < 0) return rc;
        if (me > ms && (rc = pretok(e, step + 1, s + ms, me - ms)) < 0) return rc;
        prev = me;
        if (me == ms) {
            if (me >= n) break;
            off = me + 1;
            while (off < n && ((uint8_t)s[off] & 0xC0) == 0x80) off++;
        } else off = me;
    }
    if (rc < 0) return rc;
    if (prev < n) return pretok(e, step + 1, s + prev, n - prev);
    return 0;
}

/* Characters that NFC leaves alone and that never combine with a neighbour,
 * so a text made only of them is already NFC (a conservative fast path). */
static inline int nfc_inert(uint32_t c) {
    return c < 0x300 || (c >= 0x3040 && c <= 0x3096) || (c >= 0x30A1 && c <= 0x30FA) ||
           (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) ||
           (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xFF01 && c <= 0xFF5E) ||
           (c >= 0x1F300 && c <= 0x1FAFF) || (c >= 0x3000 && c <= 0x3029) || (c >= 0x3030 && c <= 0x303F);
}

static int needs_norm(const struct tok *t, const uint8_t *s, size_t n) {
    if (!t->norm_nfc_only) return 1;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) { i++; continue; }
        int bad = 0, k = utf8_seq(s + i, n - i, &bad);
        if (k <= 0) return 1;
        if (!nfc_inert(utf8_decode1(s + i, k))) return 1;
        i += (size_t)k;
    }
    return 0;
}

static int segment_normalized(struct enc *e, const char *s, size_t n);

/* A piece of text outside raw-matched added tokens: normalise, then match the
 * normalized added tokens, then pre-tokenize. */
static int segment(struct enc *e, const char *s, size_t n) {
    const struct tok *t = e->t;
    if (n == 0) return 0;
    if (!t->nnorm || !needs_norm(t, (const uint8_t *)s, n)) return segment_normalized(e, s, n);
    char *cur = NULL;
    size_t curlen = 0;
    int rc = normalize(t, s, n, &cur, &curlen);
    if (rc < 0) return util_err(e->err, e->errlen, rc, "tokenizer: normalization failed");
    rc = segment_normalized(e, cur, curlen);
    free(cur);
    return rc;
}

static int push_added(struct enc *e, const struct added_tok *a) { return ivec_push(e->out, &a->id, 1); }

static int is_ws_at(const uint8_t *s, size_t n, size_t i, int *k) {
    int bad = 0;
    *k = utf8_seq(s + i, n - i, &bad);
    if (*k <= 0) { *k = 1; return 0; }
    uint32_t c = utf8_decode1(s + i, *k);
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int is_word_cp(uint32_t c) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* Splits s on the added tokens of trie tr (leftmost-longest, honouring lstrip,
 * rstrip and single_word as HF's AddedVocabulary does); gaps go to gap(). */
static int split_added(struct enc *e, const struct trie *tr, const char *s, size_t n,
                       int (*gap)(struct enc *, const char *, size_t)) {
    const struct tok *t = e->t;
    const uint8_t *u = (const uint8_t *)s;
    size_t start_off = 0, i = 0;
    int rc;
    uint8_t first[256] = {0};
    for (int32_t c = tr->n[0].child; c >= 0; c = tr->n[c].sibling) first[tr->n[c].byte] = 1;
    while (i < n) {
        if (!first[u[i]]) { i++; continue; }
        size_t mlen = 0;
        int32_t ai = trie_longest(tr, u + i, n - i, &mlen);
        if (ai < 0) { i++; continue; }
        const struct added_tok *a = &t->added[ai];
        size_t ms = i, me = i + mlen;
        i = me;
        if (a->single_word) {
            int ok = 1;
            if (ms > 0) { /* the character before must not be a word character */
                size_t p = ms - 1;
                while (p > 0 && (u[p] & 0xC0) == 0x80) p--;
                int bad = 0, k = utf8_seq(u + p, ms - p, &bad);
                if (k > 0 && is_word_cp(utf8_decode1(u + p, k))) ok = 0;
            }
            if (me < n) {
                int bad = 0, k = utf8_seq(u + me, n - me, &bad);
                if (k > 0 && is_word_cp(utf8_decode1(u + me, k))) ok = 0;
            }
            if (!ok) continue;
        }
        if (a->lstrip) {
            size_t p = ms;
            while (p > start_off) {
                size_t q = p - 1;
                while (q > start_off && (u[q] & 0xC0) == 0x80) q--;
                int k;
                if (!is_ws_at(u, n, q, &k)) break;
                p = q;
            }
            ms = p;
        }
        if (a->rstrip) {
            int k;
            while (me < n && is_ws_at(u, n, me, &k)) me += (size_t)k;
            i = me;
        }
        if (start_off < ms && (rc = gap(e, s + start_off, ms - start_off)) < 0) return rc;
        if ((rc = push_added(e, a)) < 0) return rc;
        start_off = me;
    }
    if (start_off < n) return gap(e, s + start_off, n - start_off);
    return 0;
}

static int pretok0(struct enc *e, const char *s, size_t n) { return pretok(e, 0, s, n); }

static int segment_normalized(struct enc *e, const char *s, size_t n) {
    if (e->t->trie_norm.nonempty) return split_added(e, &e->t->trie_norm, s, n, pretok0);
    return pretok(e, 0, s, n);
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_special,
               int32_t **ids, size_t *n, char *err, size_t errlen) {
    if (!t || !ids || !n || (!text && len)) return util_err(err, errlen, -EINVAL, "tok_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    size_t bad = utf8_validate((const uint8_t *)text, len);
    if (bad != len)
        return util_err(err, errlen, -EILSEQ, "text is not valid UTF-8 (byte %zu)", bad);
    struct ivec out = {0};
    struct enc e = {t, &out, pcre2_match_data_create(1, NULL), err, errlen};
    int rc = e.md ? 0 : -ENOMEM;
    if (rc == 0 && add_special && t->nprefix) rc = ivec_push(&out, t->prefix, (size_t)t->nprefix);
    if (rc == 0 && len) {
        if (t->trie_raw.nonempty) rc = split_added(&e, &t->trie_raw, text, len, segment);
        else rc = segment(&e, text, len);
    }
    if (rc == 0 && add_special && t->nsuffix) rc = ivec_push(&out, t->suffix, (size_t)t->nsuffix);
    pcre2_match_data_free(e.md);
    if (rc < 0) {
        free(out.v);
        if (rc == -ENOMEM) return util_err(err, errlen, rc, "tokenizer: out of memory");
        return rc;
    }
    *ids = out.v;
    *n = out.n;
    return 0;
}

/* ======================================================================
 * Decode
 * ====================================================================== */

int tok_decode(const struct tok *t, const int32_t *ids, size_t n, int skip_special,
               char **out, size_t *out_len, char *err, size_t errlen) {
    if (!t || !out || (!ids && n)) return util_err(err, errlen, -EINVAL, "tok_decode: NULL argument");
    *out = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tok_is_valid(t, ids[i]))
            return util_err(err, errlen, -EINVAL, "token id %d (position %zu) is not in the vocabulary (size %d)",
                            (int)ids[i], i, (int)t->nids);
        total += t->byte_off[ids[i] + 1] - t->byte_off[ids[i]];
    }
    uint8_t *raw = malloc(total + 1);
    char *o = malloc(3 * total + 1);
    if (!raw || !o) { free(raw); free(o); return util_err(err, errlen, -ENOMEM, "tokenizer: out of memory"); }
    size_t r = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (skip_special && (t->flags[id] & TF_SPECIAL)) continue;
        size_t l = t->byte_off[id + 1] - t->byte_off[id];
        memcpy(raw + r, t->bytes + t->byte_off[id], l);
        r += l;
    }
    size_t ol = 0;
    utf8_lossy(raw, r, 1, o, &ol);
    free(raw);
    o[ol] = 0;
    *out = o;
    if (out_len) *out_len = ol;
    return 0;
}

/* ======================================================================
 * Streaming decode
 * ====================================================================== */

void tok_stream_init(struct tok_stream *s, const struct tok *t, int skip_special) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
}

static int stream_reserve(struct tok_stream *s, size_t need) {
    if (need <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need) cap *= 2;
    char *b = realloc(s->buf, cap);
    if (!b) return -ENOMEM;
    s->buf = b;
    s->cap = cap;
    return 0;
}

const char *tok_stream_push(struct tok_stream *s, int32_t id, size_t *len) {
    size_t l = 0;
    if (!tok_is_valid(s->t, id)) return NULL;
    if (s->skip_special && (s->t->flags[id] & TF_SPECIAL)) l = 0;
    else l = s->t->byte_off[id + 1] - s->t->byte_off[id];
    size_t nb = (size_t)s->npending + l;
    /* input bytes, then the output area after them */
    if (stream_reserve(s, nb + 3 * nb + 1) < 0) return NULL;
    uint8_t *in = (uint8_t *)s->buf + 3 * nb + 1;
    memcpy(in, s->pending, (size_t)s->npending);
    if (l) memcpy(in + s->npending, s->t->bytes + s->t->byte_off[id], l);
    size_t ol = 0;
    size_t used = utf8_lossy(in, nb, 0, s->buf, &ol);
    s->npending = (int)(nb - used);
    memmove(s->pending, in + used, (size_t)s->npending);
    s->buf[ol] = 0;
    if (len) *len = ol;
    return s->buf;
}

const char *tok_stream_flush(struct tok_stream *s, size_t *len) {
    if (stream_reserve(s, 3 * 4 + 1) < 0) return NULL;
    size_t ol = 0;
    utf8_lossy(s->pending, (size_t)s->npending, 1, s->buf, &ol);
    s->npending = 0;
    s->buf[ol] = 0;
    if (len) *len = ol;
    return s->buf;
}

void tok_stream_free(struct tok_stream *s) {
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}
