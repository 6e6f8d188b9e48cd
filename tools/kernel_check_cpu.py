"""Check the exact path's Triton kernels on the CPU, in Triton's interpreter, before a device run.

The GPU tests (tests/test_cuda*.py) are the proof; they need the H200 and its minutes. This
runs the kernels' logic here, in fp32 (the interpreter has no bf16 dot): each kernel's rows
launched alone against the same rows in one launch (bit for bit), and against a torch
reference. A kernel edit that breaks its semantics fails here for free. What it cannot see:
the GPU's compiled code (an R-row launch that differs from R one-row launches only on the card,
as the eighth session's pipelined recurrence did), timing, and PDL.

    pip install --target /tmp/tritonpkg triton==3.6.0     # the device image's version
    PYTHONPATH=/tmp/tritonpkg:$PWD python tools/kernel_check_cpu.py

With numpy 2, triton 3.6's interpreter fails on a loop bound that is a kernel argument
(`TypeError: only 0-dimensional arrays can be converted to Python scalars`); this script
patches that one conversion in memory (`_patch_index`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

try:
    import triton  # noqa: E402
    from triton.runtime import interpreter  # noqa: E402
except ImportError:
    sys.exit("kernel_check_cpu: needs triton (see the docstring)")

from verispec.ops import cuda_deltanet, cuda_gemv, cuda_moe, cuda_norm_router, cuda_norms  # noqa: E402

RESULTS: list[tuple[str, bool, str]] = []


def _patch_index() -> None:
    """tl.tensor.__index__ as int() of a one-element array (numpy 2 refuses int() of a 1-d array)."""
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    interpreter._patch_lang_tensor = patched


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, bool(ok), detail))


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def gemv() -> None:
    for split in (1, 2):
        k, n = 512, 64
        x, w = torch.randn(16, k).half(), (torch.randn(n, k) * 0.05).half()

        def run(r):
            out = torch.empty(split, 16, n) if split > 1 else torch.empty(r, n, dtype=torch.half)
            cuda_gemv._gemv_rows[(n // 32, split)](x, w, out, r, n, x.stride(0), out, out, out, 0, K=k, ROWS_P=16,
                                                   BLOCK_N=32, BLOCK_K=64, SPLIT=split, CONV=False, KC=4, SAVE=False,
                                                   ROUND=False, PDL=False)
            return out.sum(0)[:r] if split > 1 else out.float()
        full, one = run(5), run(1)
        check(f"gemv split {split}: row alone = row in a launch", torch.equal(one[0], full[0]))
        err = rel(full, x[:5].float() @ w.float().T)
        check(f"gemv split {split}: against torch", err < 1e-3, f"{err:.1e}")


def experts() -> None:
    e, inter, h, k, r = 4, 64, 128, 3, 2
    x, w = torch.randn(r, h), torch.randn(e + 1, 2 * inter, h) * 0.05
    ids = torch.randint(0, e, (r, k), dtype=torch.int32)
    ids[:, -1] = e
    outs = {}
    for first in (False, True):
        act = torch.empty(r * k, inter)
        cuda_moe._gate_up_act[(r * k, inter // 4)](x, w, ids.flatten(), act, e * 2 * inter * h, r, inter, h, TOP_K=k,
                                                   E=e, BLOCK_N=4, BLOCK_K=64, SHARED_FIRST=first, PDL=False)
        outs[first] = act
    check("gate/up: the shared expert first = every program waiting", torch.equal(outs[True], outs[False]))
    flat = ids.flatten()
    preds = {"right": flat.clone(), "none": torch.full_like(flat, -1), "wrong": (flat + 1) % e}
    preds["none"][k - 1::k] = e      # the shared slots: their own expert
    preds["wrong"][k - 1::k] = e
    preds["half"] = torch.where(torch.arange(flat.numel()) % 2 == 0, flat, preds["wrong"]).to(torch.int32)
    for name, pred in preds.items():
        for first, blocks in ((False, 1), (True, 1), (True, 2)):
            act = torch.empty(r * k, inter)
            cuda_moe._gate_up_act[(r * k, inter // 4)](x, w, flat, act, e * 2 * inter * h, r, inter, h, TOP_K=k,
                                                       E=e, BLOCK_N=4, BLOCK_K=64, SHARED_FIRST=first, PDL=False,
                                                       pred_ptr=pred.to(torch.int32), PRED=blocks)
            check(f"gate/up: predicted ids ({name}, shared first {first}, {blocks} blocks) = none",
                  torch.equal(act, outs[False]))
    wf = w.reshape(e + 1, 2 * inter, h)
    ref = torch.stack([torch.nn.functional.silu(wf[i][:inter] @ x[p // k]) * (wf[i][inter:] @ x[p // k])
                       for p, i in enumerate(ids.flatten().tolist())])
    err = rel(outs[False], ref)
    check("gate/up: against torch", err < 1e-5, f"{err:.1e}")
    for inter in (512, 256):
        act, wd = torch.randn(5, inter), torch.randn(e, 64, inter) * 0.05
        ids1 = torch.randint(0, e, (5,), dtype=torch.int32)
        y = torch.empty(5, 64)
        cuda_moe._down_pair[(5, 8)](act, wd, ids1, y, 0, H=64, I=inter, E=e, BLOCK_N=8, BLOCK_K=128, PDL=False)
        err = rel(y, torch.stack([wd[i] @ act[p] for p, i in enumerate(ids1.tolist())]))
        check(f"down I={inter}: against torch", err < 1e-5, f"{err:.1e}")
        if inter == 512:
            y2 = torch.empty(5, 64)
            cuda_moe._down_pair[(5, 8)](act, wd, ids1, y2, 0, H=64, I=inter, E=e, BLOCK_N=8, BLOCK_K=128, PDL=False,
                                        EARLY_W=True)
            check("down: every weight read before the wait = after it", torch.equal(y2, y))


def norms_and_router() -> None:
    h, n, r = 256, 40, 3
    for split in (1, 4):
        x, nw = torch.randn(r, h), torch.randn(h) * 0.1
        hp = torch.randn(split, r, h) if split > 1 else torch.randn(r, h)
        stride = hp.stride(0) if split > 1 else 0
        s2, y2 = torch.empty(r, h), torch.empty(r, h)
        cuda_norms._add_row_norm[(r,)](x, hp, nw, s2, y2, 1e-6, stride, N=h, BLOCK=h, SPLIT=split, PDL=False)
        hs = hp.sum(0) if split > 1 else hp
        check(f"add_row_norm split {split}: the sum", torch.allclose(s2, x + hs, atol=1e-5))
        w = torch.randn(n, h) * h ** -0.5
        s, y, lg = torch.empty(r, h), torch.empty(r, h), torch.empty(r, n)
        nb = triton.cdiv(n, cuda_norm_router.BLOCK_N)
        cuda_norm_router._add_norm_router[(nb, r)](x, hp, stride, nw, w, s, y, lg, 1e-6, n, H=h, BLOCK=h, SPLIT=split,
                                                   BLOCK_N=cuda_norm_router.BLOCK_N, PDL=False)
        check(f"add_norm_router split {split}: s and y = add_row_norm's", torch.equal(s, s2) and torch.equal(y, y2))
        err = rel(lg, y2 @ w.T)
        check(f"add_norm_router split {split}: logits against torch", err < 1e-5, f"{err:.1e}")
        s1, y1, l1 = torch.empty(1, h), torch.empty(1, h), torch.empty(1, n)
        hp1 = hp[:, 1:2].contiguous() if split > 1 else hp[1:2]
        cuda_norm_router._add_norm_router[(nb, 1)](x[1:2], hp1, hp1.stride(0) if split > 1 else 0, nw, w, s1, y1, l1,
                                                   1e-6, n, H=h, BLOCK=h, SPLIT=split,
                                                   BLOCK_N=cuda_norm_router.BLOCK_N, PDL=False)
        check(f"add_norm_router split {split}: row alone = row in a launch", torch.equal(l1[0], lg[1]))


def recurrence() -> None:
    hv, hk, dk, dv, r = 4, 2, 64, 32, 4
    mixed, ba = torch.randn(r, 2 * hk * dk + hv * dv), torch.randn(r, 2 * hv)
    alog, dtb, s0 = torch.rand(hv) * 4, torch.randn(hv), torch.randn(hv, dk, dv) * 0.1

    def run(rows, ba_rows, st):
        o = torch.empty(rows.shape[0], hv, dv)
        cuda_deltanet._delta_steps[(hv, dv // 16)](rows, rows.stride(0), ba_rows, ba_rows.stride(0), alog, dtb, st, o, st,
                                                   rows.shape[0], HV=hv, REP=hv // hk, DK=dk, DV=dv, BV=16,
                                                   SCALE=dk ** -0.5, EPS=1e-6, SAVE=False, PDL=False)
        return o
    st, st1 = s0.clone(), s0.clone()
    full = run(mixed, ba, st)
    singles = torch.cat([run(mixed[i:i + 1], ba[i:i + 1], st1) for i in range(r)])
    check("delta_steps: rows one launch each = all in one", torch.equal(singles, full) and torch.equal(st1, st))


def main() -> int:
    _patch_index()
    torch.manual_seed(0)
    for fn in (gemv, experts, norms_and_router, recurrence):
        try:
            fn()
        except Exception as e:   # report and go on: one broken kernel should not hide the others
            check(fn.__name__, False, f"{type(e).__name__}: {e}")
    for name, ok, detail in RESULTS:
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f" ({detail})" if detail else ""))
    failed = sum(not ok for _, ok, _ in RESULTS)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
