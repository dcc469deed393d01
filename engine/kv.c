/* kv.c — KV block allocator: a stack of free block ids and a reference count
 * per block. */
#include "engine/kv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kv_init(struct kv *kv, int n_blocks, int block_size) {
    memset(kv, 0, sizeof *kv);
    if (n_blocks < 1 || block_size < 1) return -EINVAL;
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    kv->refs = calloc((size_t)n_blocks, sizeof *kv->refs);
    if (!kv->free_list || !kv->refs) {
        kv_free(kv);
        return -ENOMEM;
    }
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    /* pop order 0, 1, 2, ...: the stack holds ids in reverse */
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return 0;
}

void kv_free(struct kv *kv) {
    free(kv->free_list);
    free(kv->refs);
    memset(kv, 0, sizeof *kv);
}

int kv_free_blocks(const struct kv *kv) { return kv->n_free; }

int kv_blocks_for(const struct kv *kv, int n_tokens) {
    return n_tokens <= 0 ? 0 : (n_tokens + kv->block_size - 1) / kv->block_size;
}

int kv_block_refs(const struct kv *kv, int block) {
    return block >= 0 && block < kv->n_blocks ? kv->refs[block] : -1;
}

static int grow_table(struct kv_seq *s, int need) {
    if (need <= s->cap) return 0;
    int cap = s->cap ? s->cap : 4;
    while (cap < need) cap *= 2;
    int32_t *b = realloc(s->blocks, (size_t)cap * sizeof *b);
    if (!b) return -ENOMEM;
    s->blocks = b;
    s->cap = cap;
    return 0;
}

static void unref(struct kv *kv, int b) {
    if (--kv->refs[b] == 0) kv->free_list[kv->n_free++] = b;
}

int kv_seq_reserve(struct kv *kv, struct kv_seq *s, int n_tokens) {
    if (n_tokens < 0) return -EINVAL;
    int need = kv_blocks_for(kv, n_tokens);
    if (need <= s->n_blocks) return 0;
    int more = need - s->n_blocks;
    if (more > kv->n_free) return -ENOSPC;
    if (grow_table(s, need)) return -ENOMEM;
    while (s->n_blocks < need) {
        int b = kv->free_list[--kv->n_free];
        kv->refs[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    return 0;
}

int kv_seq_fork(struct kv *kv, const struct kv_seq *src, int n_tokens, struct kv_seq *dst,
                struct kv_copy *copy) {
    copy->src = copy->dst = -1;
    int used = kv_blocks_for(kv, n_tokens);
    if (n_tokens < 0 || used > src->n_blocks || src == dst) return -EINVAL;
    int full = n_tokens / kv->block_size, partial = used - full;
    if (partial > kv->n_free) return -ENOSPC;
    kv_seq_free(kv, dst);
    if (grow_table(dst, used ? used : 1)) return -ENOMEM;
    for (int i = 0; i < full; i++) {
        int b = src->blocks[i];
        if (kv->refs[b] == UINT16_MAX) { /* absurd fan-out: refuse, undo */
            kv_seq_free(kv, dst);
            return -ENOSPC;
        }
        kv->refs[b]++;
        dst->blocks[dst->n_blocks++] = b;
    }
    if (partial) {
        int b = kv->free_list[--kv->n_free];
        kv->refs[b] = 1;
        dst->blocks[dst->n_blocks++] = b;
        copy->src = src->blocks[full];
        copy->dst = b;
    }
    return 0;
}

void kv_seq_free(struct kv *kv, struct kv_seq *s) {
    for (int i = 0; i < s->n_blocks; i++) unref(kv, s->blocks[i]);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
