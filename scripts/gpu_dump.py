"""Dump torch's CUDA softmax and attention (forward and backward, bf16 and fp16) for sharpcheck.

Runs on a machine with a GPU and torch alone (sharpcheck is not needed there): every tensor is
saved as .npz members (bf16 as int16 bits, fp16 as float16, fp32 as float32) and judged later on
any machine with `sharpcheck compare` (scripts/gpu_judge.sh). Inputs are drawn on the CPU with a
fixed seed, so a rerun dumps the same inputs.

Usage: python3 scripts/gpu_dump.py OUTPUT_DIRECTORY
"""
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
DEV = "cuda"
log = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "runs": []}


def bits(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    if t.dtype == torch.float16:
        return t.numpy()
    return t.float().numpy()


def backends():
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def sdpa_lse(q, k, v, causal, name):
    """The log-sum-exp the fused kernels return (natural log, [B,H,S] fp32), where torch exposes it."""
    try:
        if name == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[1]
        if name == "efficient":
            return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)[1]
    except Exception as error:  # noqa: BLE001 - recorded, not fatal
        log["runs"].append({"lse_error": f"{name}: {error}"[:300]})
    return None


def attention_file(dtype, causal, shape, kv_heads=None):
    from torch.nn.attention import sdpa_kernel
    b, h, s, d = shape
    g = torch.Generator().manual_seed(7 + int(causal))
    hk = kv_heads or h
    q = torch.randn(b, h, s, d, generator=g).to(dtype)
    k = torch.randn(b, hk, s, d, generator=g).to(dtype)
    v = torch.randn(b, hk, s, d, generator=g).to(dtype)
    dout = torch.randn(b, h, s, d, generator=g).to(dtype)
    members = {"q": bits(q), "k": bits(k), "v": bits(v), "dout": bits(dout)}
    for name, backend in backends().items():
        entry = {"dtype": str(dtype), "causal": causal, "shape": shape, "kv_heads": hk, "backend": name}
        try:
            qc, kc, vc = (t.to(DEV).requires_grad_(True) for t in (q, k, v))
            with sdpa_kernel([backend]):
                start = time.time()
                out = F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal, enable_gqa=hk != h)
                out.backward(dout.to(DEV))
                torch.cuda.synchronize()
                entry["seconds"] = time.time() - start
                lse = None if hk != h else sdpa_lse(qc.detach(), kc.detach(), vc.detach(), causal, name)
            for key, tensor in {"out": out, "dq": qc.grad, "dk": kc.grad, "dv": vc.grad, "lse": lse}.items():
                if tensor is not None:
                    members[f"{name}_{key}"] = bits(tensor)
            entry["ok"] = True
        except Exception as error:  # noqa: BLE001 - a backend this build lacks is recorded
            entry["ok"] = False
            entry["error"] = str(error)[:300]
        log["runs"].append(entry)
    tag = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    file = f"attn_{tag}_{'causal' if causal else 'full'}{'_gqa' if kv_heads else ''}.npz"
    np.savez(os.path.join(OUT, file), **members)


def softmax_file():
    members = {}
    g = torch.Generator().manual_seed(11)
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        x = (3 * torch.randn(64, 4096, generator=g)).to(dtype)
        dy = torch.randn(64, 4096, generator=g).to(dtype)
        for op in ("softmax", "log_softmax"):
            xc = x.to(DEV).requires_grad_(True)
            y = getattr(torch, op)(xc, dim=-1)
            y.backward(dy.to(DEV))
            members[f"{tag}_logits"] = bits(x)
            members[f"{tag}_dy"] = bits(dy)
            members[f"{tag}_{op}"] = bits(y)
            members[f"{tag}_{op}_dx"] = bits(xc.grad)
    np.savez(os.path.join(OUT, "softmax.npz"), **members)


softmax_file()
for dtype in (torch.bfloat16, torch.float16):
    for causal in (False, True):
        attention_file(dtype, causal, (1, 2, 1024, 128))
attention_file(torch.bfloat16, True, (1, 8, 512, 64), kv_heads=2)
with open(os.path.join(OUT, "gpu_dump.json"), "w") as f:
    json.dump(log, f, indent=1)
print(json.dumps(log, indent=1))
