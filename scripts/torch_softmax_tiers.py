"""PyTorch's CPU softmax under both tiers at n = 16 to 262,144 (docs/verdicts.md's table).

Rows: 8 per case, random normal logits at spreads 1, 3 and 10 (sigma), plus rows with one
dominant logit and rows near fp32's overflow; fp32 and bf16 (torch computes bf16 softmax in fp32
and rounds). Prints one markdown row per dtype with the worst proven, statistical and bias ratios.
Usage: PYTHONPATH=build/python python3 scripts/torch_softmax_tiers.py
"""

import torch

import sharpcheck


def rows(kind, n, generator):
    if kind == "spike":
        x = torch.randn(8, n, generator=generator)
        x[:, 0] += 30
        return x
    if kind == "near_overflow":
        return 88 + torch.rand(8, n, generator=generator)
    return float(kind) * torch.randn(8, n, generator=generator)


def main():
    generator = torch.Generator().manual_seed(20241008)
    sizes = [2**k for k in range(4, 19)]
    for dtype in (torch.float32, torch.bfloat16):
        worst = {"proven": 0.0, "statistical": 0.0, "bias": 0.0}
        cases = failed = 0
        for n in sizes:
            for kind in ("1", "3", "10", "spike", "near_overflow"):
                x = rows(kind, n, generator).to(dtype)
                try:
                    report = sharpcheck.assert_softmax_close(torch.softmax(x, -1), x)
                except AssertionError as error:
                    failed += 1
                    print(f"FAIL {dtype} n={n} {kind}: {str(error).splitlines()[2]}")
                    continue
                cases += 1
                worst["proven"] = max(worst["proven"], report.bound_ratio)
                worst["statistical"] = max(worst["statistical"], report.statistical_ratio)
                worst["bias"] = max(worst["bias"], report.bias_ratio)
        print(f"| torch.softmax {str(dtype).replace('torch.', '')} | {cases + failed} | {failed} | "
              f"{worst['proven']:.3g} | {worst['statistical']:.3g} | {worst['bias']:.3g} |")


if __name__ == "__main__":
    main()
