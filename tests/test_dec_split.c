/* test_dec_split.c — the decode attention's split count (kernels/cuda/dec_split.h)
 * on the CPU, for Qwen3-8B / Qwen3-32B / Llama-3-70B heads (8 KV heads; 4 at
 * tp = 2) on a 132-SM H200 with the default rule (4, 2): the measured picks
 * of sessions 3, 5, 43 and 44 written out per batch size. */
#include "tests/harness/test.h"

#include "kernels/cuda/dec_split.h"

TEST(dec_split, batches_on_8_kv_heads) {
    /* batch -> splits: ~2 CTAs a SM below one wave of 4 a SM (528), one piece
     * from there, three just over it (529-660 CTAs: batch 67-82), two to 1.5
     * waves (661-792: batch 83-99), one beyond */
    static const int cs[][2] = {{1, 33}, {2, 17}, {8, 5},  {16, 3}, {32, 2},  {48, 1},  {64, 1},  {66, 1}, {67, 3},
                                {80, 3}, {82, 3}, {83, 2}, {96, 2}, {99, 2}, {100, 1}, {128, 1}, {160, 1}};
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        int got = dec_split_rule(cs[i][0] * 8, 132, 4, 2, 1);
        ASSERT_MSG(got == cs[i][1], "batch %d on 8 KV heads: %d splits, expected %d", cs[i][0], got, cs[i][1]);
    }
    /* without the wave clause (AWQD_CUDA_DEC_WAVE=0): one piece from 528 CTAs */
    ASSERT_EQ_INT(dec_split_rule(80 * 8, 132, 4, 2, 0), 1);
    /* tp = 2 (4 KV heads a rank): the same CTA counts at twice the batch */
    ASSERT_EQ_INT(dec_split_rule(160 * 4, 132, 4, 2, 1), 3);
    ASSERT_EQ_INT(dec_split_rule(128 * 4, 132, 4, 2, 1), 1);
}

TEST(dec_split, limits) {
    ASSERT_EQ_INT(dec_split_rule(1, 132, 4, 2, 1), DEC_SPLIT_MAX); /* 264 wanted */
    ASSERT_EQ_INT(dec_split_rule(0, 132, 4, 2, 1), 1);
    ASSERT_EQ_INT(dec_split_rule(8, 0, 4, 2, 1), 1);
    /* the wave band's edges: 5/4 of lo x sms */
    ASSERT_EQ_INT(dec_split_rule(660, 132, 4, 2, 1), 3);
    ASSERT_EQ_INT(dec_split_rule(661, 132, 4, 2, 1), 2);
    ASSERT_EQ_INT(dec_split_rule(792, 132, 4, 2, 1), 2);
    ASSERT_EQ_INT(dec_split_rule(793, 132, 4, 2, 1), 1);
    ASSERT_EQ_INT(dec_split_rule(528, 132, 4, 2, 1), 1);
    ASSERT_EQ_INT(dec_split_rule(529, 132, 4, 2, 1), 3);
    /* the memory plan's bound (4, 4) is at least the default's everywhere */
    for (int c = 1; c <= 4096; c++)
        ASSERT_MSG(dec_split_rule(c, 132, 4, 4, 1) >= dec_split_rule(c, 132, 4, 2, 1), "%d CTAs", c);
}
