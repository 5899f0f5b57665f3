"""`sharpcheck compare` on tensors dumped by PyTorch, as a user would dump them.

Attention is computed the way users write it in torch (matmul + softmax, causal by a boolean
mask, GQA by repeat_interleave), from bf16 inputs with fp32 scores and probabilities and the
output rounded to bf16 (what a fused kernel does), and saved as .npy files and .npz bundles
(bf16 as int16 bits, as torch 1.13 must). Each honest dump must pass; each wrong one (mask
forgotten, causal diagonal misaligned, KV heads mapped by repeat instead of repeat_interleave,
log-sum-exp in base 2 judged as natural, softmax over the wrong axis) must fail with exit 1.

Usage: torch_dumps_test.py SHARPCHECK_BINARY WORK_DIRECTORY
"""
import os
import subprocess
import sys

import numpy as np
import torch

SHARPCHECK, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
torch.manual_seed(16)


def bits(tensor):
    """bf16 as its int16 bit patterns, fp32 as it is."""
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy()
    return tensor.contiguous().numpy()


def attention(q, k, v, causal=False, bottom_right=False, kv_map="repeat_interleave"):
    """fp32 scores and P from bf16 inputs; the output rounded to bf16; natural LSE in fp32."""
    group = q.shape[1] // k.shape[1]
    if kv_map == "repeat_interleave":
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    else:  # the wrong mapping: query head h reads KV head h % kv_heads
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    scores = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        m, n = scores.shape[-2:]
        keep = torch.ones(m, n, dtype=torch.bool).tril(diagonal=n - m if bottom_right else 0)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v.float()
    return out.to(torch.bfloat16), lse


def inputs(batch, heads, kv_heads, queries, keys, dim):
    return (torch.randn(batch, heads, queries, dim).to(torch.bfloat16),
            torch.randn(batch, kv_heads, keys, dim).to(torch.bfloat16),
            torch.randn(batch, kv_heads, keys, dim).to(torch.bfloat16))


def save(name, **arrays):
    paths = {}
    for key, array in arrays.items():
        paths[key] = os.path.join(WORK, f"{name}_{key}.npy")
        np.save(paths[key], bits(array))
    return paths


failures = []


def expect(exit_code, label, *arguments):
    result = subprocess.run([SHARPCHECK, "compare", *arguments], capture_output=True, text=True)
    status = "ok" if result.returncode == exit_code else "WRONG"
    print(f"{status}: {label}: exit {result.returncode} (expected {exit_code})")
    if result.returncode != exit_code:
        failures.append(label)
        print(result.stdout[-2000:], result.stderr[-2000:])


def compare_attention(label, exit_code, paths, *extra):
    expect(exit_code, label, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out", paths["out"],
           "--format", "bf16", *extra)


# [2, 8, 256, 64] causal MHA, from .npy files, with the LSE.
q, k, v = inputs(2, 8, 8, 256, 256, 64)
out, lse = attention(q, k, v, causal=True)
paths = save("causal", q=q, k=k, v=v, out=out, lse=lse)
compare_attention("causal MHA [2,8,256,64] with LSE", 0, paths, "--causal", "--lse", paths["lse"])
compare_attention("causal MHA judged without the mask", 1, paths)
wrong = save("nomask", out=attention(q, k, v)[0])
compare_attention("mask forgotten", 1, {**paths, "out": wrong["out"]}, "--causal")
base2 = save("base2", lse=lse / np.log(2))
compare_attention("base-2 LSE judged as natural", 1, paths, "--causal", "--lse", base2["lse"])
compare_attention("base-2 LSE judged as base 2", 0, paths, "--causal", "--lse", base2["lse"], "--lse-base2")

# The same layer as [B, S, H, D] (bshd), as many kernels take it.
bshd = save("bshd", q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2), out=out.transpose(1, 2))
compare_attention("causal MHA as bshd", 0, bshd, "--causal", "--layout", "bshd")

# GQA 8 query heads on 2 KV heads, 113 x 203, head dim 59, not causal, in an np.savez bundle.
q, k, v = inputs(1, 8, 2, 113, 203, 59)
out, lse = attention(q, k, v)
bundle = os.path.join(WORK, "gqa.npz")
np.savez(bundle, q=bits(q), k=bits(k), v=bits(v), out=bits(out), lse=bits(lse))
expect(0, "GQA 8/2 113x203 d59 from an np.savez bundle", "--bundle", bundle, "--format", "bf16")
tiled = os.path.join(WORK, "gqa_tiled.npz")
np.savez(tiled, q=bits(q), k=bits(k), v=bits(v), out=bits(attention(q, k, v, kv_map="repeat")[0]))
expect(1, "GQA with KV heads mapped by repeat", "--bundle", tiled, "--format", "bf16")

# Causal, bottom-right aligned (FlashAttention >= 2.1), 113 x 203, in an np.savez_compressed bundle.
out, lse = attention(q, k, v, causal=True, bottom_right=True)
compressed = os.path.join(WORK, "bottom_right.npz")
np.savez_compressed(compressed, q=bits(q), k=bits(k), v=bits(v), out=bits(out), lse=bits(lse))
expect(0, "bottom-right causal from a compressed bundle", "--bundle", compressed, "--format", "bf16",
       "--causal", "--align", "bottom-right")
expect(1, "bottom-right causal judged top-left", "--bundle", compressed, "--format", "bf16", "--causal")
expect(0, "members named one by one", "--q", compressed + ":q", "--k", compressed + ":k", "--v",
       compressed + ":v", "--out", compressed + ":out", "--format", "bf16", "--causal", "--align",
       "bottom-right")

# A FlashAttention-2-style port (P cast to bf16 before P V) judged by its precision model: from
# --tolerance-of, or from a budget keyed by the name the user gives; the fp32 recipe fails it, and
# with no recipe named it passes as the one it fits (flash_bf16), which the report names.
q, k, v = inputs(1, 4, 4, 64, 256, 64)
q, k = (3 * q.float()).bfloat16(), (3 * k.float()).bfloat16()  # scores of size ~10
p = torch.softmax(q.float() @ k.float().transpose(-1, -2) / 8, -1)
p_rounded = save("p_rounded", q=q, k=k, v=v, out=(p.bfloat16().float() @ v.float()).bfloat16())
compare_attention("P rounded to bf16, judged by the fp32 recipe", 1, p_rounded, "--tolerance-of", "attention_fp32")
compare_attention("P rounded to bf16, no recipe named: passes as flash_bf16", 0, p_rounded)
compare_attention("P rounded to bf16, --tolerance-of attention_p_rounded", 0, p_rounded, "--tolerance-of",
                  "attention_p_rounded")
budget = os.path.join(WORK, "budget_models.json")
with open(budget, "w") as file:
    file.write('{"kernels": {"fa2_port": {"tolerance_of": "attention_p_rounded", "max_bound_ratio": 1}}}')
compare_attention("P rounded to bf16, the model from the budget", 0, p_rounded, "--budget", budget, "--name",
                  "fa2_port")
budget_fp32 = os.path.join(WORK, "budget_fp32.json")
with open(budget_fp32, "w") as file:
    file.write('{"kernels": {"fa2_port": {"tolerance_of": "attention_p_rounded"}, '
               '"other": {"tolerance_of": "attention_fp32"}}}')
compare_attention("the budget's recipe is the one keyed by the name", 1, p_rounded, "--budget", budget_fp32,
                  "--name", "other")
with open(budget, "w") as file:
    file.write('{"kernels": {"fa2_port": {"tolerance_of": "attention_fp64"}}}')
compare_attention("a budget naming no tolerance entry", 2, p_rounded, "--budget", budget, "--name", "fa2_port")

# Softmax over axis 1 of a [4, 37, 5] fp32 tensor, and the wrong axis.
logits = torch.randn(4, 37, 5) * 4
np.save(os.path.join(WORK, "logits3d.npy"), logits.numpy())
np.save(os.path.join(WORK, "probs_dim1.npy"), torch.softmax(logits, dim=1).numpy())
np.save(os.path.join(WORK, "probs_dim2.npy"), torch.softmax(logits, dim=2).numpy())
for probs, code in (("probs_dim1.npy", 0), ("probs_dim2.npy", 1)):
    expect(code, f"softmax over dim 1 given {probs}", "--logits", os.path.join(WORK, "logits3d.npy"),
           "--probs", os.path.join(WORK, probs), "--dim", "1", "--format", "fp32")
log_probs = os.path.join(WORK, "log_probs_dim1.npy")
np.save(log_probs, torch.log_softmax(logits, dim=1).numpy())
expect(0, "log_softmax over dim 1", "--logits", os.path.join(WORK, "logits3d.npy"), "--probs", log_probs,
       "--dim", "1", "--log-softmax", "--format", "fp32")

# The attention backward: torch autograd's fp32 gradients of a causal [1, 2, 48, 32] layer pass; a
# FlashAttention-style backward whose D comes from half the columns (a partial tile) fails.
qb, kb, vb, doutb = (torch.randn(1, 2, 48, 32) for _ in range(4))
leaves = [x.clone().requires_grad_(True) for x in (qb, kb, vb)]
scores = (leaves[0] @ leaves[1].transpose(-1, -2)) / np.sqrt(32)
scores = scores.masked_fill(~torch.ones(48, 48, dtype=torch.bool).tril(), float("-inf"))
(torch.softmax(scores, dim=-1) @ leaves[2]).backward(doutb)
grads = {"q": qb, "k": kb, "v": vb, "dout": doutb, "dq": leaves[0].grad, "dk": leaves[1].grad,
         "dv": leaves[2].grad}
backward_paths = {}
for key, tensor in grads.items():
    backward_paths[key] = os.path.join(WORK, f"backward_{key}.npy")
    np.save(backward_paths[key], tensor.detach().numpy())


def compare_backward(label, exit_code, paths, *extra, causal=True):
    expect(exit_code, label, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--dout", paths["dout"],
           "--dq", paths["dq"], "--dk", paths["dk"], "--dv", paths["dv"], "--format", "fp32",
           *(["--causal"] if causal else []), *extra)


compare_backward("torch autograd's attention gradients", 0, backward_paths)
with torch.no_grad():
    p = torch.softmax(scores, dim=-1)
    out_b = p @ vb
    stale_d = (doutb[..., :16] * out_b[..., :16]).sum(-1, keepdim=True)
    ds = p * (doutb @ vb.transpose(-1, -2) - stale_d) / np.sqrt(32)
stale = os.path.join(WORK, "backward_dq_stale.npy")
np.save(stale, (ds @ kb).numpy())
compare_backward("dQ from a partial-tile D", 1, {**backward_paths, "dq": stale})
# The kernel's D (--d, laid out as the log-sum-exp, fp32): the honest one passes, the partial-tile
# one fails on D itself although dQ, dK and dV are honest.
honest_d, stale_d_path = os.path.join(WORK, "backward_d.npy"), os.path.join(WORK, "backward_d_stale.npy")
np.save(honest_d, (doutb * out_b).sum(-1).float().numpy())
np.save(stale_d_path, stale_d[..., 0].float().numpy())
compare_backward("torch's gradients with their D", 0, backward_paths, "--d", honest_d)
compare_backward("a partial-tile D given as --d", 1, backward_paths, "--d", stale_d_path)
compare_backward("torch's gradients judged without the mask", 1, backward_paths, causal=False)
compare_backward("ALiBi, which the backward does not support yet, refused", 2, backward_paths, "--alibi-slopes",
                 os.path.join(WORK, "causal_q.npy"))

if failures:
    print(f"{len(failures)} wrong verdicts: {failures}")
    sys.exit(1)
print("every verdict as expected")
