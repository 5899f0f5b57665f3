"""paged_attention: attention over a paged KV cache, judged by gathering each sequence's pages into
the packed problem. The caches here are what serving kernels read: pages in scrambled physical
order, page ids above 65,535, NaN in every slot no sequence reaches; decode (one query per
sequence) and several queries per sequence (speculative decode, chunked prefill) aligned
bottom-right; the block-table form (vLLM, FlashAttention) and FlashInfer's indptr form, NHD and
HND. Honest kernels pass; kernels with the bugs serving kernels shipped fail."""

import math

import pytest
import torch

import sharpcheck

HEADS, KV_HEADS, DIM = 4, 2, 16
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


def make_cache(lengths, page, *, pages=None, layout="NHD", seed=0, dtype=torch.bfloat16):
    """Per-sequence keys and values, written into a NaN-poisoned cache at scrambled page ids (all
    above 65,535 when the cache has more pages than that). Returns (k_cache, v_cache, block_table,
    seq_lens, contiguous k and v per sequence)."""
    g = torch.Generator().manual_seed(seed)
    used = [(n + page - 1) // page for n in lengths]
    pages = pages or sum(used) + 3
    low = 65_536 if pages > 65_536 + sum(used) else 0
    ids = low + torch.randperm(pages - low, generator=g)[: sum(used)]
    shape = (pages, page, KV_HEADS, DIM) if layout == "NHD" else (pages, KV_HEADS, page, DIM)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    table = torch.zeros(len(lengths), max(used), dtype=torch.int32)
    ks, vs, at = [], [], 0
    for b, n in enumerate(lengths):
        k = torch.randn(n, KV_HEADS, DIM, generator=g).to(dtype)
        v = torch.randn(n, KV_HEADS, DIM, generator=g).to(dtype)
        ks.append(k)
        vs.append(v)
        for i in range(used[b]):
            pid = int(ids[at])
            at += 1
            table[b, i] = pid
            rows = slice(i * page, min(n, (i + 1) * page))
            count = rows.stop - rows.start
            if layout == "NHD":
                k_cache[pid, :count] = k[rows]
                v_cache[pid, :count] = v[rows]
            else:
                k_cache[pid, :, :count] = k[rows].transpose(0, 1)
                v_cache[pid, :, :count] = v[rows].transpose(0, 1)
    return k_cache, v_cache, table, torch.tensor(lengths, dtype=torch.int32), ks, vs


def paged_kernel(q, k_cache, v_cache, table, seq_lens, q_lens, *, layout="NHD", bug=None, with_lse=False):
    """A paged decode / chunked-prefill kernel as users write it: gather each sequence's pages by
    the block table, attention in fp32 with the diagonal bottom-right, output in q's dtype (and,
    with_lse, the fp32 log-sum-exp [T, H] beside it)."""
    page = k_cache.shape[1] if layout == "NHD" else k_cache.shape[2]
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2] if layout == "NHD" else k_cache.shape[1]
    outs, lses, start = [], [], 0
    for b in range(table.shape[0]):
        n = int(seq_lens[b]) - (1 if bug == "last_page_off_by_one" else 0)
        rows = []
        for j in range(n + (1 if bug == "reads_past_the_end" else 0)):
            pid = int(table[b, j // page])
            if bug == "block_ids_16_bit":
                pid &= 0xFFFF
            rows.append((pid, j % page))
        pids = torch.tensor([p for p, _ in rows], dtype=torch.int64)
        slots = torch.tensor([s for _, s in rows], dtype=torch.int64)
        def gather(cache):  # [n, H_kv, D]
            if layout == "NHD":
                return cache[pids, slots].float()
            return cache[pids, :, slots].float()
        k = gather(k_cache).repeat_interleave(heads // kv_heads, dim=1)  # [n, H, D]
        v = gather(v_cache).repeat_interleave(heads // kv_heads, dim=1)
        m = q_lens[b]
        qb = q[start:start + m].float()  # [m, H, D]
        s = torch.einsum("mhd,nhd->hmn", qb, k) / math.sqrt(dim)
        i = torch.arange(m)[:, None]
        j = torch.arange(len(rows))[None, :]
        s = s.masked_fill(j > i + (len(rows) - m), float("-inf"))  # bottom-right causal
        p = torch.softmax(s, dim=-1)
        if bug == "batch_bucket" and table.shape[0] >= 16:  # a path chosen by batch size: P in bf16
            p = p.to(torch.bfloat16).float()
        outs.append(torch.einsum("hmn,nhd->mhd", p, v).to(q.dtype))
        if bug == "lse_batch_bucket" and table.shape[0] >= 16:  # base 2 and back, as FlashInfer keeps it
            top = s.amax(dim=-1, keepdim=True)
            lse = (top.squeeze(-1) * LOG2E + torch.log2(torch.exp2((s - top) * LOG2E).sum(-1))) * LN2
        else:
            lse = torch.logsumexp(s, dim=-1)
        lses.append(lse.transpose(0, 1))  # [m, H]
        start += m
    if with_lse:
        return torch.cat(outs), torch.cat(lses).contiguous()
    return torch.cat(outs)


def queries(q_lens, seed=1, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(q_lens), HEADS, DIM, generator=g).to(dtype)


def cu(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


@pytest.mark.parametrize("page", [1, 16, 200])
def test_an_honest_decode_kernel_passes_on_a_poisoned_scrambled_cache(page):
    lengths = [37, 1, 64, 130]
    k_cache, v_cache, table, seq_lens, _, _ = make_cache(lengths, page)
    q = queries([1] * len(lengths))
    out = paged_kernel(q, k_cache, v_cache, table, seq_lens, [1] * len(lengths))
    report = sharpcheck.judge("paged_attention", q=q, k_cache=k_cache, v_cache=v_cache, block_table=table,
                              seq_lens=seq_lens, out=out)
    assert report.passed and report.elements == len(lengths) * HEADS * DIM


def test_the_paged_judgement_equals_the_gathered_contiguous_one():
    lengths, q_lens = [40, 9, 77], [3, 1, 5]  # speculative decode / chunked prefill
    k_cache, v_cache, table, seq_lens, ks, vs = make_cache(lengths, 8, seed=3)
    q = queries(q_lens, seed=4)
    out = paged_kernel(q, k_cache, v_cache, table, seq_lens, q_lens)
    paged = sharpcheck.judge("paged_attention", q=q, k_cache=k_cache, v_cache=v_cache, block_table=table,
                             seq_lens=seq_lens, out=out, cu_seqlens_q=cu(q_lens), causal=True)
    packed = sharpcheck.assert_attention_close(out, q, torch.cat(ks), torch.cat(vs), layout="packed",
                                               cu_seqlens_q=cu(q_lens), cu_seqlens_k=cu(lengths),
                                               causal=True, align="bottom-right")
    assert paged.passed
    for field in ("bound_ratio", "statistical_ratio", "max_ulp", "mean_ulp", "max_abs_error", "elements",
                  "recipe", "row_scale_ratio"):
        assert getattr(paged, field) == getattr(packed, field), field


def test_flashinfer_form_and_hnd_pages_with_ids_above_65535():
    lengths = [5, 3, 9]
    k_cache, v_cache, table, seq_lens, _, _ = make_cache(lengths, 4, pages=66_000, layout="HND", seed=5)
    assert int(table[table > 0].min()) > 65_535  # every page a sequence uses
    q = queries([1] * 3, seed=6)
    out = paged_kernel(q, k_cache, v_cache, table, seq_lens, [1] * 3, layout="HND")
    used = [(n + 3) // 4 for n in lengths]
    indptr = torch.tensor(cu(used), dtype=torch.int32)
    indices = torch.cat([table[b, :used[b]] for b in range(3)]).to(torch.int64)
    last = torch.tensor([n - (u - 1) * 4 for n, u in zip(lengths, used)], dtype=torch.int32)
    report = sharpcheck.judge("paged_attention", q=q, k_cache=k_cache, v_cache=v_cache, kv_indptr=indptr,
                              kv_indices=indices, kv_last_page_len=last, out=out, page_layout="HND")
    assert report.passed


@pytest.mark.parametrize("bug", ["block_ids_16_bit", "last_page_off_by_one", "reads_past_the_end"])
def test_paged_twins_fail(bug):
    lengths = [37, 70, 12]
    k_cache, v_cache, table, seq_lens, _, _ = make_cache(lengths, 16, pages=70_000, seed=7)
    assert int(table[table > 0].min()) > 0xFFFF  # a 16-bit id reads another (poisoned) page
    q = queries([1] * 3, seed=8)
    out = paged_kernel(q, k_cache, v_cache, table, seq_lens, [1] * 3, bug=bug)
    with pytest.raises(AssertionError, match="paged_attention|not close"):
        sharpcheck.judge("paged_attention", q=q, k_cache=k_cache, v_cache=v_cache, block_table=table,
                         seq_lens=seq_lens, out=out)


def test_bad_tables_are_refused_by_element():
    lengths = [10, 20]
    k_cache, v_cache, table, seq_lens, _, _ = make_cache(lengths, 8, seed=9)
    q = queries([1, 1], seed=10)
    out = paged_kernel(q, k_cache, v_cache, table, seq_lens, [1, 1])
    common = dict(q=q, k_cache=k_cache, v_cache=v_cache, out=out)
    bad = table.clone()
    bad[1, 2] = k_cache.shape[0]
    with pytest.raises(ValueError, match=r"block_table at \[1, 2\] = \d+, but the caches hold \d+ pages"):
        sharpcheck.judge("paged_attention", block_table=bad, seq_lens=seq_lens, **common)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 40 needs 5 pages of 8, block_table has 3 columns"):
        sharpcheck.judge("paged_attention", block_table=table, seq_lens=torch.tensor([10, 40]), **common)
    with pytest.raises(ValueError, match="no page table given"):
        sharpcheck.judge("paged_attention", **common)
    with pytest.raises(ValueError, match="not both"):
        sharpcheck.judge("paged_attention", block_table=table, seq_lens=seq_lens,
                         kv_indptr=torch.tensor([0, 2, 5]), kv_indices=table.flatten(),
                         kv_last_page_len=torch.tensor([2, 4]), **common)
    with pytest.raises(ValueError, match="non-negative integers"):
        sharpcheck.judge("paged_attention", block_table=table.float() - 0.5, seq_lens=seq_lens, **common)
    with pytest.raises(ValueError, match="give cu_seqlens_q"):
        sharpcheck.judge("paged_attention", block_table=table, seq_lens=seq_lens, **dict(common, q=queries([2, 1])))
    poisoned = k_cache.clone()
    poisoned[int(table[0, 1]), 1, 0, 3] = float("nan")  # key 9 of sequence 0: a slot it reaches
    with pytest.raises(ValueError, match=r"k_cache page \d+ slot 1 head 0 dim 3 \(sequence 0, key 9\) is NaN"):
        sharpcheck.judge("paged_attention", block_table=table, seq_lens=seq_lens, **dict(common, k_cache=poisoned))


def test_the_lse_is_judged_in_tokens_by_heads_order():
    lengths = [33, 17]
    k_cache, v_cache, table, seq_lens, ks, vs = make_cache(lengths, 8, seed=11, dtype=torch.float32)
    q = queries([1, 1], seed=12, dtype=torch.float32)
    out = paged_kernel(q, k_cache, v_cache, table, seq_lens, [1, 1])
    lse = []
    for b in range(2):
        k = ks[b].double().repeat_interleave(2, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].double(), k) / math.sqrt(DIM)
        lse.append(torch.logsumexp(s, dim=-1))
    lse = torch.stack(lse).float()  # [T, H]
    common = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=table, seq_lens=seq_lens, out=out)
    assert sharpcheck.judge("paged_attention", lse=lse, **common).passed
    wrong = lse.clone()
    wrong[1, 3] += 1e-3
    with pytest.raises(AssertionError, match=r"lse at index \(1, 3\)"):
        sharpcheck.judge("paged_attention", lse=wrong, **common)


def test_compare_reads_int32_and_int64_tables_from_npy_files(tmp_path):
    import json
    import os
    import subprocess

    import numpy as np

    program = os.environ.get("SHARPCHECK_PROGRAM")
    if not program:
        pytest.skip("SHARPCHECK_PROGRAM is set by ctest")
    lengths = [21, 6]
    k_cache, v_cache, table, seq_lens, _, _ = make_cache(lengths, 4, seed=13, dtype=torch.float32)
    q = queries([1, 1], seed=14, dtype=torch.float32)
    out = paged_kernel(q, k_cache, v_cache, table, seq_lens, [1, 1])
    arrays = {"q": q.numpy(), "kc": k_cache.numpy(), "vc": v_cache.numpy(), "out": out.numpy(),
              "bt": table.numpy().astype(np.int32), "sl": seq_lens.numpy().astype(np.int64)}
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array)
    command = [program, "compare", "--op", "paged_attention", f"q={tmp_path / 'q.npy'}",
               f"k_cache={tmp_path / 'kc.npy'}", f"v_cache={tmp_path / 'vc.npy'}", f"block_table={tmp_path / 'bt.npy'}",
               f"seq_lens={tmp_path / 'sl.npy'}", f"out={tmp_path / 'out.npy'}", "--json", str(tmp_path / "r.json")]
    assert subprocess.run(command, capture_output=True).returncode == 0
    arrays["out"][1, 2, 7] += 0.25
    np.save(tmp_path / "out.npy", arrays["out"])
    assert subprocess.run(command, capture_output=True).returncode == 1
    worst = json.loads((tmp_path / "r.json").read_text())["cases"][0]["worst"]
    assert worst["full_index"] == [1, 2, 7]


def sweep_kernel(bug=None, with_lse=False):
    """paged_kernel with the sweep's calling convention (q, caches, tables, then options by name),
    for either table form and layout."""
    def kernel(q, k_cache, v_cache, block_table=None, seq_lens=None, kv_indptr=None, kv_indices=None,
               kv_last_page_len=None, page_layout="NHD", causal=False, cu_seqlens_q=None):
        page = k_cache.shape[1] if page_layout == "NHD" else k_cache.shape[2]
        if block_table is None:  # FlashInfer's form as a block table
            rows = [kv_indices[kv_indptr[b]:kv_indptr[b + 1]] for b in range(len(kv_indptr) - 1)]
            width = max(len(r) for r in rows)
            block_table = torch.zeros(len(rows), width, dtype=torch.int64)
            for b, r in enumerate(rows):
                block_table[b, :len(r)] = r
            seq_lens = [(len(r) - 1) * page + int(kv_last_page_len[b]) for b, r in enumerate(rows)]
        q_lens = [cu_seqlens_q[b + 1] - cu_seqlens_q[b] for b in range(len(cu_seqlens_q) - 1)]
        return paged_kernel(q, k_cache, v_cache, block_table, seq_lens, q_lens, layout=page_layout, bug=bug,
                            with_lse=with_lse)
    return kernel


def test_the_paged_sweep_runs_a_python_kernel_and_catches_its_twin():
    cases = sharpcheck.cases("paged_attention", format="bf16")
    assert len(cases) == 4 and any("ids_above_65535" in c.id for c in cases)
    assert [len(c.reruns) for c in cases if "invariance" in c.id] == [22]
    assert all(c.inputs[name].dtype == torch.int64 for c in cases for name in c.inputs
               if name in ("block_table", "seq_lens", "kv_indptr", "kv_indices", "kv_last_page_len"))
    sharpcheck.sweep(sweep_kernel(), "paged_attention", format="bf16").check()
    broken = sharpcheck.sweep(sweep_kernel("block_ids_16_bit"), "paged_attention", format="bf16")
    assert [r.id for r in broken.results if r.status != "pass"] == [c.id for c in cases if "65535" in c.id]


def test_the_paged_sweep_reports_a_kernel_whose_path_follows_the_batch():
    """The invariance case reruns its 17 requests alone, again, in batches of 15 and 16, reversed
    and in other pages: a kernel that rounds P to bf16 from 16 sequences on is accurate everywhere
    but changes the bits of requests between batches, and the sweep names them."""
    case = sharpcheck.cases("paged_attention", format="bf16", match="invariance")
    honest = sharpcheck.sweep(sweep_kernel(), "paged_attention", format="bf16", match="invariance")
    assert honest.passed and honest.results[0].report.record["invariance"]["invariant"]
    bucket = sharpcheck.sweep(sweep_kernel("batch_bucket"), "paged_attention", format="bf16", match="invariance")
    (result,) = bucket.results
    assert result.status == "fail" and "not batch-invariant" in result.message, result.message
    record = result.report.record["invariance"]
    changed = {c["run"] for c in record["changed"]}
    # the first call (17 sequences) took the bf16 path, as 16 do; 15 and fewer did not
    assert {"request 3 alone", "batch of 15 (requests 2-16)"} <= changed
    assert "batch of 16 (requests 1-16)" not in changed and "batch of 17 again" not in changed
    judged = [r for r in record["runs"] if r["judged"]]
    assert all(r["max_bound_ratio"] <= 1 for r in judged)  # accurate in every batch
    assert len(case) == 1
    with pytest.raises(ValueError, match="batch-invariance case: its 22 reruns must run too"):
        case[0].judge(sweep_kernel()(*case[0].args, **case[0].kwargs))  # judge() alone would skip the check


def test_the_invariance_case_compares_the_lse_a_kernel_returns():
    """An LSE returned beside the output is judged and compared bit for bit too: a kernel whose LSE
    takes another path from 16 sequences on (its output unchanged) is named, each change marked as
    the LSE's; a kernel returning no LSE is judged on its output, and the record says so."""
    honest = sharpcheck.sweep(sweep_kernel(with_lse=True), "paged_attention", format="bf16", match="invariance")
    (result,) = honest.results
    assert result.status == "pass", result.message
    assert not result.report.record.get("notes"), result.report.record.get("notes")
    bucket = sharpcheck.sweep(sweep_kernel("lse_batch_bucket", with_lse=True), "paged_attention", format="bf16",
                              match="invariance")
    (result,) = bucket.results
    assert result.status == "fail" and "not batch-invariant" in result.message, result.message
    assert "(lse only: " in result.message, result.message
    changed = result.report.record["invariance"]["changed"]
    assert changed and {c["output"] for c in changed} == {"lse"}
    (out_only,) = sharpcheck.sweep(sweep_kernel(), "paged_attention", format="bf16", match="invariance").results
    assert out_only.status == "pass" and "lse not returned (NaN throughout): not judged" in out_only.report.record["notes"]


def test_an_lse_returned_nan_throughout_is_judged_not_taken_for_absent():
    def kernel(*args, **kwargs):
        out, lse = sweep_kernel(with_lse=True)(*args, **kwargs)
        return out, torch.full_like(lse, float("nan"))
    (result,) = sharpcheck.sweep(kernel, "paged_attention", format="bf16", match="invariance").results
    assert result.status == "fail", result.message


def test_an_lse_returned_by_some_calls_only_is_an_error_naming_the_call():
    calls = []
    def kernel(*args, **kwargs):
        calls.append(1)
        return sweep_kernel(with_lse=len(calls) == 1)(*args, **kwargs)
    (result,) = sharpcheck.sweep(kernel, "paged_attention", format="bf16", match="invariance").results
    assert result.status == "error", result.message
    assert "the batch of 17 again: the kernel returned no lse" in result.message, result.message


def test_a_wrong_lse_fails_the_paged_sweep():
    def kernel(*args, **kwargs):
        out, lse = sweep_kernel(with_lse=True)(*args, **kwargs)
        return out, lse * LOG2E  # log2 units where the natural log is asked
    failed = [r for r in sharpcheck.sweep(kernel, "paged_attention", format="bf16").results if r.status != "pass"]
    assert len(failed) == 4, [r.message for r in failed]
    assert all(r.report.record["worst"]["array"] == "lse" for r in failed), [r.message for r in failed]


def test_a_kernel_that_raises_in_a_rerun_is_that_cases_crash():
    calls = []
    def kernel(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("out of shared memory")
        return sweep_kernel()(*args, **kwargs)
    (result,) = sharpcheck.sweep(kernel, "paged_attention", format="bf16", match="invariance").results
    assert result.status == "crash" and "RuntimeError in the request 2 alone: out of shared memory" in result.message


def test_a_kernel_reusing_one_output_buffer_is_judged_on_each_calls_result():
    """CUDA-graph and out= kernels return a view of one buffer that the next call overwrites."""
    buffer = {}
    def kernel(*args, **kwargs):
        out = sweep_kernel()(*args, **kwargs)
        held = buffer.setdefault("out", torch.empty(0, dtype=out.dtype))
        held.resize_(out.shape).copy_(out)
        return held
    (result,) = sharpcheck.sweep(kernel, "paged_attention", format="bf16", match="invariance").results
    assert result.status == "pass", result.message
