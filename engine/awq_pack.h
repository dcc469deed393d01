/* awq_pack.h — AWQ int4 packing and round-to-nearest (RTN) quantization,
 * bit-compatible with AutoAWQ (see ../shared/design/AWQ_FORMAT.md).
 *
 * Layout conventions (K in features, N out features, G group size):
 *   weight  fp16 [N, K]      nn.Linear layout (what HF fp16 checkpoints hold)
 *   W       [K, N]           the transposed view the AWQ math uses, y = x @ W
 *   codes   uint8 [K, N]     4-bit values 0..15
 *   qweight int32 [K, N/8]   8 codes per int32 along N; column 8c+j at nibble awq_order[j]
 *   qzeros  int32 [K/G, N/8] same packing of the zero-point codes
 *   scales  fp16 [K/G, N]
 *
 * Quantization follows AutoAWQ's pseudo_quantize_tensor (zero point, 4 bits)
 * on the fp16 weights upcast to fp32 (one fp32 rounding per operation):
 *   scale = fp16(clamp(max - min, 1e-5) / 15);  zero = clamp(-round(min / scale), 0, 15)
 * and the codes as WQLinear_GEMM.from_linear computes them from those:
 *   code  = round((w + zero * scale) / scale)
 * round() is round-half-to-even, as torch.round. This reproduces the
 * fixture awq-pack-vectors bit for bit (scales, zeros and packing).
 *
 * Thread safety: pure functions; call from any thread. */
#ifndef AWQD_AWQ_PACK_H
#define AWQD_AWQ_PACK_H

#include <stddef.h>
#include <stdint.h>

/* Column j (0..7) of a group of 8 sits at nibble awq_order[j] = {0,4,1,5,2,6,3,7}. */
extern const int awq_order[8];

/* codes uint8 [rows, n] (n % 8 == 0) -> packed int32 [rows, n/8]. */
void awq_pack(const uint8_t *codes, int64_t rows, int n, uint32_t *packed);
/* packed int32 [rows, n/8] -> codes uint8 [rows, n]. */
void awq_unpack(const uint32_t *packed, int64_t rows, int n, uint8_t *codes);

/* RTN scales and zeros of one group: w is fp16 [g, n] (g rows of W, row stride
 * ld elements); outputs scales fp16 [n], zeros uint8 [n], and, when codes !=
 * NULL, codes uint8 [g, n]. g <= 4096. */
void awq_rtn_group(const uint16_t *w, int g, int n, size_t ld, uint16_t *scales, uint8_t *zeros,
                   uint8_t *codes);

/* The same from fp32 values that are exactly fp16 (a faster path for writers):
 * w_ng [n, g] — the group's g values of output column c contiguous at
 * w_ng + c * g (the nn.Linear layout) -> scales [n], zeros [n], codes [g, n]. */
void awq_rtn_group_f32(const float *w_ng, int g, int n, uint16_t *scales, uint8_t *zeros,
                       uint8_t *codes);

/* Codes of one group from given scales/zeros, exactly as from_linear: NOT
 * clamped (a weight outside [min, max] of its group can give -1 or 16):
 * w fp16 [g, n] (row stride ld) -> raw int32 [g, n]. */
void awq_codes_group(const uint16_t *w, int g, int n, size_t ld, const uint16_t *scales,
                     const uint8_t *zeros, int32_t *raw);
/* AutoAWQ's packing loop bit for bit: qweight |= raw << 4*i with int32
 * wrap-around, so an unclamped 16 spills into the next nibble as it does in
 * AutoAWQ's files. raw int32 [rows, n] -> packed int32 [rows, n/8]. Use
 * awq_pack for clamped codes. */
void awq_pack_autoawq(const int32_t *raw, int64_t rows, int n, uint32_t *packed);

/* Whole linear layer: weight fp16 [N, K] (nn.Linear layout) -> qweight int32
 * [K, N/8], qzeros int32 [K/G, N/8], scales fp16 [K/G, N]. Needs K % G == 0 and
 * N % 8 == 0; returns 0 or -EINVAL / -ENOMEM. */
int awq_quantize_linear(const uint16_t *weight, int n, int k, int group, uint32_t *qweight,
                        uint32_t *qzeros, uint16_t *scales);

#endif
