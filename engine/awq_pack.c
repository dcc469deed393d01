/* awq_pack.c — see awq_pack.h. */
#include "engine/awq_pack.h"

#include "engine/ckpt.h" /* fp16_to_f32 / f32_to_fp16 */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const int awq_order[8] = {0, 4, 1, 5, 2, 6, 3, 7};

void awq_pack(const uint8_t *codes, int64_t rows, int n, uint32_t *packed) {
    int n8 = n / 8;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *c = codes + (size_t)r * n;
        uint32_t *p = packed + (size_t)r * n8;
        for (int i = 0; i < n8; i++) {
            uint32_t v = 0;
            for (int j = 0; j < 8; j++) v |= (uint32_t)(c[8 * i + j] & 15) << (4 * awq_order[j]);
            p[i] = v;
        }
    }
}

void awq_unpack(const uint32_t *packed, int64_t rows, int n, uint8_t *codes) {
    int n8 = n / 8;
    for (int64_t r = 0; r < rows; r++) {
        const uint32_t *p = packed + (size_t)r * n8;
        uint8_t *c = codes + (size_t)r * n;
        for (int i = 0; i < n8; i++)
            for (int j = 0; j < 8; j++) c[8 * i + j] = (uint8_t)((p[i] >> (4 * awq_order[j])) & 15);
    }
}

static int clamp15(float x) {
    if (!(x > 0)) return 0; /* also NaN */
    if (x > 15) return 15;
    return (int)x;
}

/* Round half to even in fp32 for |x| < 2^22 (the default rounding mode, like
 * torch.round); larger values are integers already. */
static inline float rne(float x) {
    if (!(fabsf(x) < 4194304.0f)) return x;
    float t = x + 12582912.0f; /* 1.5 * 2^23: the sum's ulp is 1 */
    return t - 12582912.0f;
}

/* One output column: v [g] fp16-exact values of that column's group.
 * fp32 arithmetic, one rounding per operation, as PyTorch computes on float32
 * tensors; the scale is rounded to fp16 before the zero and the codes are
 * derived from it (what AutoAWQ stores and what from_linear uses). */
static void rtn_column(const float *v, int g, uint16_t *scale, uint8_t *zero, uint8_t *codes,
                       size_t code_stride) {
    float mx = -INFINITY, mn = INFINITY;
    for (int r = 0; r < g; r++) {
        mx = v[r] > mx ? v[r] : mx;
        mn = v[r] < mn ? v[r] : mn;
    }
    float range = mx - mn;
    float rg = range < 1e-5f ? 1e-5f : range;
    if (!(rg == rg)) rg = 1e-5f; /* NaN weights: keep the scale finite */
    uint16_t sh = f32_to_fp16(rg / 15.0f);
    if (sh == 0) sh = 1; /* underflow: smallest subnormal, never divide by 0 */
    float s = fp16_to_f32(sh);
    int zi = clamp15(-rne(mn / s));
    *scale = sh;
    *zero = (uint8_t)zi;
    if (!codes) return;
    volatile float szv = (float)zi * s; /* materialised: never fused into an fma below */
    float sz = szv;
    for (int r = 0; r < g; r++) codes[(size_t)r * code_stride] = (uint8_t)clamp15(rne((v[r] + sz) / s));
}

void awq_rtn_group(const uint16_t *w, int g, int n, size_t ld, uint16_t *scales, uint8_t *zeros,
                   uint8_t *codes) {
    float col[4096];
    for (int c = 0; c < n; c++) {
        for (int r = 0; r < g && r < 4096; r++) col[r] = fp16_to_f32(w[(size_t)r * ld + c]);
        rtn_column(col, g < 4096 ? g : 4096, &scales[c], &zeros[c], codes ? codes + c : NULL,
                   (size_t)n);
    }
}

void awq_rtn_group_f32(const float *w_ng, int g, int n, uint16_t *scales, uint8_t *zeros,
                       uint8_t *codes) {
    for (int c = 0; c < n; c++)
        rtn_column(w_ng + (size_t)c * g, g, &scales[c], &zeros[c], codes ? codes + c : NULL,
                   (size_t)n);
}

void awq_codes_group(const uint16_t *w, int g, int n, size_t ld, const uint16_t *scales,
                     const uint8_t *zeros, int32_t *raw) {
    for (int c = 0; c < n; c++) {
        float s = fp16_to_f32(scales[c]);
        volatile float szv = (float)zeros[c] * s;
        float sz = szv;
        for (int r = 0; r < g; r++) {
            float rq = rne((fp16_to_f32(w[(size_t)r * ld + c]) + sz) / s);
            raw[(size_t)r * n + c] = rq > 1e6f ? 1000000 : (rq < -1e6f ? -1000000 : (int32_t)rq);
        }
    }
}

void awq_pack_autoawq(const int32_t *raw, int64_t rows, int n, uint32_t *packed) {
    static const int order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    int n8 = n / 8;
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *c = raw + (size_t)r * n;
        uint32_t *p = packed + (size_t)r * n8;
        for (int i = 0; i < n8; i++) {
            uint32_t v = 0;
            for (int b = 0; b < 8; b++) v |= (uint32_t)c[8 * i + order_map[b]] << (4 * b);
            p[i] = v;
        }
    }
}

int awq_quantize_linear(const uint16_t *weight, int n, int k, int group, uint32_t *qweight,
                        uint32_t *qzeros, uint16_t *scales) {
    if (n <= 0 || k <= 0 || group <= 0 || k % group || n % 8) return -EINVAL;
    uint16_t *wt = malloc((size_t)group * n * sizeof *wt);   /* fp16 [G, N]: one group of W */
    uint8_t *codes = malloc((size_t)group * n);              /* [G, N] */
    uint8_t *zeros = malloc((size_t)n);                      /* [N] */
    if (!wt || !codes || !zeros) {
        free(wt);
        free(codes);
        free(zeros);
        return -ENOMEM;
    }
    for (int g0 = 0; g0 < k; g0 += group) {
        for (int r = 0; r < group; r++)
            for (int c = 0; c < n; c++) wt[(size_t)r * n + c] = weight[(size_t)c * k + g0 + r];
        awq_rtn_group(wt, group, n, (size_t)n, scales + (size_t)(g0 / group) * n, zeros, codes);
        awq_pack(codes, group, n, qweight + (size_t)g0 * (n / 8));
        awq_pack(zeros, 1, n, qzeros + (size_t)(g0 / group) * (n / 8));
    }
    free(wt);
    free(codes);
    free(zeros);
    return 0;
}
