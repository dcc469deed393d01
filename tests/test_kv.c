/* test_kv.c — the KV block allocator: reserve, free, reuse, out of blocks,
 * fork with shared full blocks and a copied partial block, no leaks. */
#include "tests/harness/test.h"

#include <errno.h>
#include <stdlib.h>

#include "engine/kv.h"

TEST(kv, reserve_and_free) {
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, 8, 16), 0);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 8);
    struct kv_seq s = {0};
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &s, 1), 0);
    ASSERT_EQ_INT(s.n_blocks, 1);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &s, 16), 0);
    ASSERT_EQ_INT(s.n_blocks, 1);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &s, 17), 0);
    ASSERT_EQ_INT(s.n_blocks, 2);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &s, 5), 0); /* never shrinks */
    ASSERT_EQ_INT(s.n_blocks, 2);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 6);
    ASSERT(s.blocks[0] != s.blocks[1]);
    kv_seq_free(&kv, &s);
    ASSERT_EQ_INT(s.n_blocks, 0);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 8);
    kv_free(&kv);
}

TEST(kv, out_of_blocks_is_an_error_and_changes_nothing) {
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, 4, 16), 0);
    struct kv_seq a = {0}, b = {0};
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &a, 48), 0);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &b, 40), -ENOSPC);
    ASSERT_EQ_INT(b.n_blocks, 0);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 1);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &a, 65), -ENOSPC);
    ASSERT_EQ_INT(a.n_blocks, 3);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &b, 16), 0);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 0);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &b, 17), -ENOSPC);
    kv_seq_free(&kv, &a);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &b, 17), 0);
    kv_seq_free(&kv, &b);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 4);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &b, -1), -EINVAL);
    kv_free(&kv);
}

TEST(kv, freed_blocks_are_reused_and_ids_unique) {
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, 32, 4), 0);
    struct kv_seq s[8] = {{0}};
    unsigned seed = 7;
    for (int round = 0; round < 200; round++) {
        int i = rand_r(&seed) % 8;
        if (rand_r(&seed) % 3 == 0) {
            kv_seq_free(&kv, &s[i]);
        } else {
            int want = s[i].n_blocks * 4 + 1 + rand_r(&seed) % 9;
            int rc = kv_seq_reserve(&kv, &s[i], want);
            ASSERT(rc == 0 || rc == -ENOSPC);
        }
        /* every held block is held exactly once; held + free = total */
        int held = 0;
        static int seen[32];
        for (int b = 0; b < 32; b++) seen[b] = 0;
        for (int k = 0; k < 8; k++)
            for (int j = 0; j < s[k].n_blocks; j++) {
                int b = s[k].blocks[j];
                ASSERT(b >= 0 && b < 32);
                ASSERT_EQ_INT(seen[b]++, 0);
                ASSERT_EQ_INT(kv_block_refs(&kv, b), 1);
                held++;
            }
        ASSERT_EQ_INT(held + kv_free_blocks(&kv), 32);
    }
    for (int k = 0; k < 8; k++) kv_seq_free(&kv, &s[k]);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 32);
    kv_free(&kv);
}

TEST(kv, fork_shares_full_blocks_copies_partial) {
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, 10, 16), 0);
    struct kv_seq p = {0}, c1 = {0}, c2 = {0};
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &p, 40), 0); /* 3 blocks, last partial */
    struct kv_copy cp;
    ASSERT_EQ_INT(kv_seq_fork(&kv, &p, 40, &c1, &cp), 0);
    ASSERT_EQ_INT(c1.n_blocks, 3);
    ASSERT_EQ_INT(c1.blocks[0], p.blocks[0]);
    ASSERT_EQ_INT(c1.blocks[1], p.blocks[1]);
    ASSERT(c1.blocks[2] != p.blocks[2]);
    ASSERT_EQ_INT(cp.src, p.blocks[2]);
    ASSERT_EQ_INT(cp.dst, c1.blocks[2]);
    ASSERT_EQ_INT(kv_block_refs(&kv, p.blocks[0]), 2);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 6);
    /* a fork at a block boundary copies nothing */
    ASSERT_EQ_INT(kv_seq_fork(&kv, &p, 32, &c2, &cp), 0);
    ASSERT_EQ_INT(cp.src, -1);
    ASSERT_EQ_INT(c2.n_blocks, 2);
    ASSERT_EQ_INT(kv_block_refs(&kv, p.blocks[1]), 3);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 6);
    /* the parent goes first: shared blocks stay until the last owner */
    int b0 = p.blocks[0];
    kv_seq_free(&kv, &p);
    ASSERT_EQ_INT(kv_block_refs(&kv, b0), 2);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 7);
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &c1, 60), 0);
    kv_seq_free(&kv, &c1);
    kv_seq_free(&kv, &c2);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 10);
    kv_free(&kv);
}

TEST(kv, fork_without_room_for_partial_fails_cleanly) {
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, 2, 16), 0);
    struct kv_seq p = {0}, c = {0};
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &p, 20), 0);
    struct kv_copy cp;
    ASSERT_EQ_INT(kv_seq_fork(&kv, &p, 20, &c, &cp), -ENOSPC);
    ASSERT_EQ_INT(c.n_blocks, 0);
    ASSERT_EQ_INT(kv_block_refs(&kv, p.blocks[0]), 1);
    ASSERT_EQ_INT(kv_seq_fork(&kv, &p, 60, &c, &cp), -EINVAL);
    kv_seq_free(&kv, &p);
    kv_seq_free(&kv, &c);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 2);
    kv_free(&kv);
}
