/* kernel_trace.c — an LD_PRELOAD kernel tracer for the GPU machine (a
 * measurement tool, not linked into awqd; scripts/kernel_trace.sh builds
 * and runs it). Every kernel's GPU start and end, the kernels of replayed
 * CUDA graphs included, go to $CUPTI_TRACE_OUT as
 * "start_ns,end_ns,graph_node_id,mangled name" through the CUPTI activity
 * API (CONCURRENT_KERNEL records: kernels are not serialized, so PDL's
 * overlap shows). The machine here has no Nsight Systems; CUPTI comes with
 * the CUDA toolkit. KREC is the newest CUpti_ActivityKernelN of the
 * installed headers. Costs ~10% of a decode step while on.
 * CUPTI_TRACE_DEVICE=N keeps only device N's kernels (tensor parallel: one
 * rank's timeline). */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
static FILE *out;
static int dev_only = -1;
static void CUPTIAPI buf_req(uint8_t **buf, size_t *size, size_t *max) {
    *size = 16u << 20;
    *buf = aligned_alloc(8, *size);
    *max = 0;
}
static void CUPTIAPI buf_done(CUcontext ctx, uint32_t sid, uint8_t *buf, size_t size, size_t valid) {
    CUpti_Activity *rec = NULL;
    (void)ctx; (void)sid; (void)size;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            KREC *k = (KREC *)rec;
            if (dev_only >= 0 && (int)k->deviceId != dev_only) continue;
            fprintf(out, "%llu,%llu,%llu,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, (unsigned long long)k->graphNodeId, k->name);
        }
    }
    fflush(out);
    free(buf);
}
__attribute__((constructor)) static void tr_init(void) {
    const char *p = getenv("CUPTI_TRACE_OUT");
    if (!p || !(out = fopen(p, "w"))) return;
    const char *d = getenv("CUPTI_TRACE_DEVICE");
    if (d && *d) dev_only = atoi(d);
    cuptiActivityRegisterCallbacks(buf_req, buf_done);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityFlushPeriod(200);
}
__attribute__((destructor)) static void tr_fini(void) {
    if (!out) return;
    cuptiActivityFlushAll(1);
}
