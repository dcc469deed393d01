#!/usr/bin/env python3
"""hf_reference.py — reference logits and greedy tokens for any awqd-readable
AWQ checkpoint, from Hugging Face transformers running the same weights.

Runs where torch + transformers are installed (the GPU machine; no network).
It builds the matching transformers model (Qwen3ForCausalLM, Qwen2ForCausalLM,
LlamaForCausalLM) from config.json alone, dequantizes every AWQ linear
(qweight / qzeros / scales, AutoAWQ packing, docs: shared/design/AWQ_FORMAT.md)
exactly as AutoAWQ does — (q - z) * s rounded to fp16 — loads it, and runs the
prompts in fp32 (TF32 off), writing:

  OUT.safetensors   logits_i  F32 [len_i, vocab]  logits at every prompt position
                    greedy_i  I32 [N]             N greedy tokens (no EOS stop)
  OUT.json          {"model", "prompts", "greedy"}

Usage:
  python3 scripts/hf_reference.py --model DIR --prompts reference.json --out OUT
  python3 scripts/hf_reference.py --model DIR --prompt-ids 1,2,3 --prompt-ids 4,5 --out OUT
Checks:
  --check REF.safetensors   compare with another reference (e.g. a fixture's):
                            max |diff| / max |logit| per prompt, greedy equality
  --compare-awqd FILE       compare `awqd generate --logits-out FILE` (tensor
                            `logits` [len, vocab], prompt 0) with these logits
  --tol T                   pass/fail threshold for both (default 2e-2, fp16)
Exit status 1 when a check fails.
"""
import argparse
import json
import os
import sys

import torch

AWQ_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # column j of a group of 8 sits at nibble AWQ_ORDER[j]


def load_tensors(model_dir):
    """All tensors of the checkpoint (single file or sharded with an index)."""
    from safetensors import safe_open
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(model_dir, fn), framework="pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def unpack_int4(packed):
    """int32 [R, C/8] (AWQ order) -> int32 [R, C] of values 0..15."""
    p = packed.to(torch.int32)
    cols = [(p >> (4 * AWQ_ORDER[j])) & 0xF for j in range(8)]
    return torch.stack(cols, dim=-1).reshape(p.shape[0], p.shape[1] * 8)


def dequant(qweight, qzeros, scales, group):
    """AWQ linear -> nn.Linear weight [N, K] (fp16 values, as AutoAWQ)."""
    q = unpack_int4(qweight)                       # [K, N]
    z = unpack_int4(qzeros)                        # [K/G, N]
    k = q.shape[0]
    z = z.repeat_interleave(group, dim=0)[:k]
    s = scales.to(torch.float16).repeat_interleave(group, dim=0)[:k]
    w = (q - z).to(torch.float16) * s              # fp16 product, rounded like AutoAWQ
    return w.t().contiguous()


def build_model(model_dir, device, dtype):
    import transformers
    with open(os.path.join(model_dir, "config.json")) as f:
        cfgd = json.load(f)
    qc = cfgd.pop("quantization_config", None)
    group = 128
    if qc:
        if qc.get("quant_method", "awq") != "awq" or str(qc.get("version", "gemm")).lower() != "gemm":
            sys.exit("hf_reference: only AWQ gemm checkpoints are supported")
        group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    mt = cfgd.get("model_type", "")
    classes = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }
    if mt not in classes:
        sys.exit("hf_reference: unsupported model_type %r" % mt)
    ccls, mcls = classes[mt]
    cfgd.pop("torch_dtype", None)
    cfgd.pop("dtype", None)
    cfg = ccls(**cfgd)
    with torch.device("meta"):
        model = mcls(cfg)  # no random init: every parameter comes from the checkpoint
    tensors = load_tensors(model_dir)
    state = {}
    for name, t in tensors.items():
        if name.endswith(".qweight"):
            base = name[: -len(".qweight")]
            state[base + ".weight"] = dequant(t, tensors[base + ".qzeros"], tensors[base + ".scales"], group)
        elif name.endswith(".qzeros") or name.endswith(".scales"):
            continue
        else:
            state[name] = t
    del tensors
    state = {k: v.to(dtype) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)]
    if unexpected:
        sys.exit("hf_reference: tensors the model does not know: %s" % unexpected[:8])
    if missing:
        sys.exit("hf_reference: tensors missing from the checkpoint: %s" % missing[:8])
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # the rotary embedding's buffers are computed, not loaded: build it for real
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg, device="cpu")
    meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if meta:
        sys.exit("hf_reference: left uninitialised: %s" % meta[:8])
    model.to(device)
    model.eval()
    return model, cfg


@torch.no_grad()
def run_prompt(model, ids, n_greedy, device):
    x = torch.tensor([ids], dtype=torch.long, device=device)
    out = model(input_ids=x, use_cache=True)
    logits = out.logits[0].float().cpu()
    toks = []
    past = out.past_key_values
    nxt = int(out.logits[0, -1].argmax())
    for _ in range(n_greedy):
        toks.append(nxt)
        o = model(input_ids=torch.tensor([[nxt]], device=device), past_key_values=past, use_cache=True)
        past = o.past_key_values
        nxt = int(o.logits[0, -1].argmax())
    return logits, toks


def rel_diff(a, b):
    """max over positions of max|a - b| / max|b|"""
    d = (a - b).abs().amax(dim=1)
    m = b.abs().amax(dim=1).clamp_min(1e-30)
    return float((d / m).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", help="JSON file with {\"prompts\": [[ids...], ...]}")
    ap.add_argument("--prompt-ids", action="append", default=[], help="comma-separated ids (repeatable)")
    ap.add_argument("--greedy", type=int, default=24)
    ap.add_argument("--out", help="output prefix (OUT.safetensors, OUT.json)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--check", help="reference safetensors to compare with")
    ap.add_argument("--compare-awqd", help="awqd generate --logits-out file (prompt 0)")
    ap.add_argument("--tol", type=float, default=2e-2)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    prompts = []
    if a.prompts:
        with open(a.prompts) as f:
            prompts += json.load(f)["prompts"]
    prompts += [[int(t) for t in p.split(",")] for p in a.prompt_ids]
    if not prompts:
        sys.exit("hf_reference: no prompts (--prompts or --prompt-ids)")
    dtype = getattr(torch, a.dtype)
    model, cfg = build_model(a.model, a.device, dtype)
    results = {}
    greedy = []
    for i, p in enumerate(prompts):
        lg, toks = run_prompt(model, p, a.greedy, a.device)
        results["logits_%d" % i] = lg.contiguous()
        results["greedy_%d" % i] = torch.tensor(toks, dtype=torch.int32)
        greedy.append(toks)
        print("prompt %d: %d tokens -> greedy %s" % (i, len(p), toks[:12]), flush=True)
    if a.out:
        from safetensors.torch import save_file
        save_file(results, a.out + ".safetensors")
        with open(a.out + ".json", "w") as f:
            json.dump({"model": os.path.basename(os.path.normpath(a.model)), "prompts": prompts,
                       "greedy": greedy}, f)
    ok = True
    if a.check:
        from safetensors.torch import load_file
        ref = load_file(a.check)
        for i in range(len(prompts)):
            r = rel_diff(results["logits_%d" % i], ref["logits_%d" % i].float())
            same = results["greedy_%d" % i].tolist() == ref["greedy_%d" % i].tolist()
            print("check prompt %d: max|diff|/max|logit| %.2e, greedy %s" % (i, r, "equal" if same else "DIFFERENT"))
            ok &= r <= a.tol and same
    if a.compare_awqd:
        from safetensors.torch import load_file
        got = load_file(a.compare_awqd)["logits"].float()
        ref = results["logits_0"]
        if got.shape != ref.shape:
            print("compare-awqd: shape %s != %s" % (tuple(got.shape), tuple(ref.shape)))
            ok = False
        else:
            r = rel_diff(got, ref)
            agree = int((got.argmax(1) == ref.argmax(1)).sum())
            print("compare-awqd: max|diff|/max|logit| %.2e (tol %.0e), argmax agrees at %d/%d positions"
                  % (r, a.tol, agree, ref.shape[0]))
            ok &= r <= a.tol
    print("hf_reference: %s" % ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
