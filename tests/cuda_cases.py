"""Inputs shared by the GPU tests of the MoE kernels (imported only where a GPU is present)."""

import torch

BF = torch.bfloat16


def moe_case():
    """A real-shaped MoE layer on the GPU and 16 rows: 256 experts of width 512, top 8, hidden
    2048; the router and the shared expert's gate/up rows in one block as Model holds them.
    -> (e, inter, h, k, router [264, h], shared gate/up [2 inter, h], x [16, h], resid [16, h],
    gate/up [e, 2 inter, h], down [e, h, inter], shared down [h, inter], norm weight [h])."""
    def rand(*shape):
        return torch.randn(*shape, device="cuda").to(BF)
    e, inter, h, k = 256, 512, 2048, 8
    pre = rand(1288, h) * h ** -0.5 * 4
    router, sgu = pre[:264], pre[e + 1:e + 1 + 2 * inter]
    hx, resid = rand(16, h), rand(16, h)
    gu, dn = rand(e, 2 * inter, h) * h ** -0.5, rand(e, h, inter) * inter ** -0.5
    sdown, nw = rand(h, inter) * inter ** -0.5, rand(h) * 0.1
    return e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw
