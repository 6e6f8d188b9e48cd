"""cuda_stream_gemv.conv_fits, without a GPU: the kernel's conv runs a thread a conv column of a CTA's
tasks, so a setting with fewer threads than that must not take the conv (it would skip columns)."""

import torch

from verispec.ops import cuda_nvrtc, cuda_stream_gemv

K, N, C = 2048, 12352, 8192     # the DeltaNet input product of the 35B-A3B shape, its conv's channels


def test_conv_needs_a_thread_for_each_conv_column(monkeypatch):
    w = torch.empty(N, K, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(cuda_nvrtc, "sm_count", lambda device: 132)
    assert cuda_stream_gemv.conv_fits(w, C)             # configured: 6 tasks of 16 columns, 256 threads
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (2, 4, 256, 2))
    assert cuda_stream_gemv._tasks(N, 2, 132) * 16 == 96
    assert cuda_stream_gemv.conv_fits(w, C)             # 4 warps (the coresident arms): 96 of 128 threads
    monkeypatch.setattr(cuda_nvrtc, "sm_count", lambda device: 33)
    tasks = cuda_stream_gemv._tasks(N, 2, 33)
    assert tasks * 16 > 128 and cuda_stream_gemv._smem(2, 4, 256, 2, tasks) <= cuda_stream_gemv.SMEM_MAX
    assert not cuda_stream_gemv.conv_fits(w, C)         # shared memory would fit; the threads do not
    assert not cuda_stream_gemv.conv_fits(w, C + 8)     # not whole tasks of conv columns


def test_config_refuses_what_the_kernel_cannot_build(monkeypatch):
    """config() answers None (the Triton product runs) where cuda_stream_gemv.cu's static_asserts would
    stop NVRTC: the partial sums' reduction needs two elements a thread at most, 8 or 16 columns a task."""
    assert cuda_stream_gemv.config(K, N) == cuda_stream_gemv.CONFIG[(K, N)]
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (2, 4, 256, 2))
    assert cuda_stream_gemv.config(K, N) is not None      # 128 threads for 16 rows x 16 columns / 2
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (2, 2, 256, 2))
    assert cuda_stream_gemv.config(K, N) is None          # 64 threads
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (1, 2, 256, 2))
    assert cuda_stream_gemv.config(K, N) is not None      # 8 columns a task: 64 threads suffice
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (4, 8, 256, 1))
    assert cuda_stream_gemv.config(K, N) is None          # 32 columns a task


def test_l2_plan_names_the_rows_a_product_reads_after_its_wait(monkeypatch):
    """cuda_stream_gemv.l2_plan (bench/cuda_bench.py --sections l2next): tasks of TC columns are dealt to
    G CTAs in turn and each CTA requests its first PRE // UPW tasks before its wait, so the rows read after
    it are exactly those of tasks t >= (PRE // UPW) * G, counted here by dealing the tasks one by one."""
    sg = cuda_stream_gemv
    out = torch.empty(2048, 4096, dtype=torch.bfloat16)
    for (k, n), sms in [((K, N), 132), ((K, N), 78), ((2048, 9216), 132)]:
        nxt = torch.empty(n, k, dtype=torch.bfloat16)
        cg, warps, kc, spw = sg.CONFIG[(k, n)]
        tc, upw = 8 * cg, (k // warps) // kc
        for pre in (None, 1, 2):
            monkeypatch.setattr(sg, "PRE", pre)
            ahead = (spw if pre is None else min(pre, spw)) // upw
            g = min(n // tc, sms)
            late = [t for t in range(n // tc) if t // g >= ahead]      # CTA t % g's (t // g)-th task
            plan = sg.l2_plan([(out, nxt)], sms)
            if not late:
                assert plan == {}
                continue
            assert late == list(range(late[0], n // tc))                # the weight's last rows
            assert plan == {out.data_ptr(): (nxt.data_ptr() + late[0] * tc * k * 2, len(late) * tc * k * 2)}
            assert sg.l2_plan([(out, nxt)], sms, skip_slots=False) == {out.data_ptr(): (nxt.data_ptr(), n * k * 2)}
    # a weight the kernel does not take (no configuration, or not bf16) is left out
    assert sg.l2_plan([(out, torch.empty(100, 2048, dtype=torch.bfloat16))], 132) == {}
    assert sg.l2_plan([(out, torch.empty(N, K, dtype=torch.float32))], 132) == {}


def test_dyn_static_keeps_the_conv_and_the_first_requests_in_turn():
    """cuda_stream_gemv.dyn_static (DYN's tasks a CTA takes in turn before the tickets): every conv task
    and every task a warp may request before it has consumed its first are taken in turn (the kernel's
    conv needs them, and the first ticket, asked after the wait, is then needed a task later), some tasks
    are left for tickets, and where none would be left (the output product: a task a CTA) every task is
    taken in turn (0)."""
    sg = cuda_stream_gemv
    cases = {(K, N): C, (2048, 9216): 0, (4096, 2048): 0}
    assert sg.dyn_static(K, N, sg.CONFIG[(K, N)], 132, C) == 4        # 528 tasks in turn, 244 by tickets
    assert sg.dyn_static(2048, 9216, sg.CONFIG[(2048, 9216)], 132) == 4   # 528 in turn, 48 by tickets
    assert sg.dyn_static(4096, 2048, sg.CONFIG[(4096, 2048)], 128) == 0
    for (k, n), conv in cases.items():
        cg, warps, kc, spw = cfg = sg.CONFIG[(k, n)]
        tc, upw = 8 * cg, (k // warps) // kc
        for sms in range(8, 200):
            grid = min(n // tc, sms)
            ns0 = sg.dyn_static(k, n, cfg, grid, conv)
            if ns0:
                assert ns0 * grid < n // tc and ns0 * grid * tc >= conv and ns0 > (upw - 1 + spw) // upw, (k, n, sms)


def test_grid_cap_counts_in_the_conv_fit(monkeypatch):
    """cuda_stream_gemv.GRID (bench/cuda_bench.py --sections grid): a product on fewer CTAs deals each more
    tasks, so the conv epilogue's fit is judged at the capped grid: at 84 CTAs 10 tasks a CTA still fit,
    at 33 the conv columns would outnumber the threads."""
    sg = cuda_stream_gemv
    w = torch.empty(N, K, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(cuda_nvrtc, "sm_count", lambda device: 132)
    monkeypatch.setitem(sg.GRID, (K, N), 84)
    assert sg._ctas(K, N, sg.CONFIG[(K, N)], w.device) == 84 and sg._conv_tasks(sg.CONFIG[(K, N)], N, w.device, K) == 10
    assert sg.conv_fits(w, C)
    monkeypatch.setitem(sg.GRID, (K, N), 33)
    assert not sg.conv_fits(w, C)
    monkeypatch.setitem(sg.GRID, (K, N), 200)                  # a cap above the SMs changes nothing
    assert sg._ctas(K, N, sg.CONFIG[(K, N)], w.device) == 132
