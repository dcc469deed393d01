/* kv.h — the paged KV cache's block manager: which blocks are free, which
 * sequence owns which blocks. Host bookkeeping only; the K/V memory itself
 * lives in the backend, owned by struct model (model.h), indexed by the block
 * ids handed out here.
 *
 * Usage (one sequence):
 *     struct kv kv;                        kv_init(&kv, n_blocks, 16);
 *     struct kv_seq s = {0};
 *     if (kv_seq_reserve(&kv, &s, len + n_new) == -ENOSPC) { ...preempt/wait... }
 *     ... model_forward with s.blocks as the block table ...
 *     kv_seq_free(&kv, &s);                kv_free(&kv);
 *
 * Sharing (n > 1 choices of one prompt): after prefilling `len` tokens into
 * `s`, kv_seq_fork(&kv, &s, len, &t, &cp) gives t the same full blocks
 * (refcount + 1) and, when len % block_size != 0, a fresh block for the
 * partial last one: the caller must copy cp.src -> cp.dst (model_copy_block)
 * before t appends. Full blocks are never written again, so sharing them is
 * safe; a sequence only writes positions >= its length.
 *
 * Errors: -ENOSPC when the blocks are not there (nothing changes: a reserve
 * is all or nothing), -ENOMEM when the host is out of memory, -EINVAL on bad
 * arguments. Never aborts on input.
 *
 * Thread safety: none; the scheduler thread owns a struct kv. */
#ifndef AWQD_KV_H
#define AWQD_KV_H

#include <stdint.h>

struct kv {
    int n_blocks;                 /* blocks in the pool */
    int block_size;               /* tokens per block */
    int32_t *free_list;           /* [n_blocks] stack of free block ids */
    int n_free;
    uint16_t *refs;               /* [n_blocks] owners of each block (0 = free) */
};

/* One sequence's block table. Zero-initialise before first use. */
struct kv_seq {
    int32_t *blocks;              /* [cap] block ids; the first n_blocks are held */
    int n_blocks;
    int cap;
};

/* A block copy the caller must perform after kv_seq_fork (src = -1: none). */
struct kv_copy {
    int src, dst;
};

int kv_init(struct kv *kv, int n_blocks, int block_size);
void kv_free(struct kv *kv);

int kv_free_blocks(const struct kv *kv);
/* Blocks needed to hold n_tokens. */
int kv_blocks_for(const struct kv *kv, int n_tokens);

/* Makes s hold enough blocks for n_tokens tokens (never shrinks). */
int kv_seq_reserve(struct kv *kv, struct kv_seq *s, int n_tokens);
/* dst (zeroed or freed) shares the first n_tokens of src; see above. */
int kv_seq_fork(struct kv *kv, const struct kv_seq *src, int n_tokens, struct kv_seq *dst,
                struct kv_copy *copy);
/* Drops s's references (blocks whose count reaches 0 become free) and its
 * table; s is zeroed and may be reused. */
void kv_seq_free(struct kv *kv, struct kv_seq *s);

/* Reference count of one block (tests, debugging). */
int kv_block_refs(const struct kv *kv, int block);

#endif
