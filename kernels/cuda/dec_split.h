/* dec_split.h — how many pieces the decode attention (attn_decode.cu) cuts
 * each sequence's context into: one CTA per (piece, sequence, KV head), the
 * pieces merged by a combine kernel. Plain C, shared by the CUDA backend,
 * the memory plan (mem_plan.cu: the partials' bound) and a CPU test
 * (tests/test_dec_split.c). The count depends on the number of sequences
 * only, so a CUDA graph captured once replays for any contexts. */
#ifndef AWQD_DEC_SPLIT_H
#define AWQD_DEC_SPLIT_H

#define DEC_SPLIT_MAX 64

/* ctas: sequences x KV heads; sms: the device's SMs; lo, hi: the rule's
 * CTAs per SM (4, 2 by default; AWQD_CUDA_DEC_SPLIT=lo,hi): pairs that
 * already give >= lo CTAs per SM run unsplit, fewer are split up to ~hi
 * CTAs per SM (swept in sessions 3 and 5, attn_decode.cu). wave: where the
 * pairs are just over one wave of lo CTAs per SM, up to 1.25 waves (the
 * second wave a quarter full or less) three pieces each instead of one
 * (session 43, H200, Qwen3-8B batch 80 = 640 CTAs on 528 slots: 16.31-16.34
 * -> 14.23-14.24 ms a step at context 2048, 8.55-8.57 -> 8.39-8.41 at 512;
 * two pieces 14.55-14.59 / 8.40-8.43), and from 1.25 to 1.5 waves two
 * (session 44, after the K/V copies lost their division: batch 88 / 96 at
 * context 2048 13.01-13.07 / 13.37-13.40 -> 12.21 / 12.55, at 8192
 * 36.61-36.70 / 37.54-37.55 -> 31.93 / 33.18, at 512 7.23-7.29 /
 * 7.28-7.34 -> 7.36 / 7.52; docs/PERFORMANCE.md "Session 44"). */
static inline int dec_split_rule(int ctas, int sms, int lo, int hi, int wave) {
    if (ctas <= 0 || sms <= 0) return 1;
    if (ctas >= lo * sms) {
        if (!wave || ctas == lo * sms) return 1;
        return 4 * ctas <= 5 * lo * sms ? 3 : 2 * ctas <= 3 * lo * sms ? 2 : 1;
    }
    int ns = (hi * sms + ctas - 1) / ctas;
    return ns < DEC_SPLIT_MAX ? ns : DEC_SPLIT_MAX;
}

#endif
