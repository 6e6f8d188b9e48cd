"""Where an exact decode row parts from the batched (prefill) path and from transformers (GPU).

On the random 35B-A3B-shaped checkpoint of bench/cuda_vs_transformers.py (seed 0), the prompt
is prefilled, then one token is decoded on the exact path; the same token is also run as the
last row of one batched forward of prompt + token. Prints, per layer, the relative difference
of the last row's residual stream and of its normed output (after the mixer's add + norm and
after the MLP's), and the logits of both against transformers' full forward of the same ids.
A bug in one layer's exact kernels shows as a jump at that layer; bf16 noise grows smoothly.
Run with and without the fp32-logits fusion.

  python3 bench/cuda_decode_vs_prefill.py [LAYERS]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_vs_transformers import PROMPT, hf_model  # noqa: E402
from verispec.engine import Engine  # noqa: E402
from verispec.execution import Execution  # noqa: E402
from verispec.models import qwen3_next as Q  # noqa: E402
from verispec.ops import cuda_fusions  # noqa: E402
from verispec.random_model import preset_config, random_checkpoint  # noqa: E402

TOKEN = 82076   # the first token both engines generate after PROMPT on this checkpoint


def _recording(rec: list):
    """Wrap the model's add + norm steps so each appends its last row (residual, normed)."""
    add_norm, moe_add_norm = Q.add_norm, Q.Model.moe_add_norm

    def add_norm_rec(x, h, w, eps, rp):
        out = add_norm(x, h, w, eps, rp)
        rec.append(("add_norm", out[0][-1].float(), out[1][-1].float()))
        return out

    def moe_add_norm_rec(self, *a, **k):
        out = moe_add_norm(self, *a, **k)
        rec.append(("moe_add_norm", out[0][-1].float(), out[1][-1].float()))
        return out
    Q.add_norm, Q.Model.moe_add_norm = add_norm_rec, moe_add_norm_rec


def main() -> int:
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    cfg = preset_config("qwen3.6-35b-a3b-shape", layers=layers)
    ck = random_checkpoint(cfg, seed=0, device="cuda", mtp=False)
    m = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=False)).model
    with torch.no_grad():
        hl = hf_model(cfg, dict(ck.tensors))[0](torch.tensor([PROMPT + [TOKEN]], device="cuda")).logits[0, -1].float()
    print("transformers argmax", hl.argmax().item())
    rec: list = []
    _recording(rec)
    for variant in ("fusions on", "fusions off"):
        cuda_fusions.LOGITS_IN_PRODUCT = variant == "fusions on"
        with torch.no_grad():
            st = m.new_state(len(PROMPT) + 8)
            m.forward(PROMPT, st, exact=False)
            rec.clear()
            dec = m.forward([TOKEN], st, exact=True).logits[-1].float()
            rec_dec = list(rec)
            rec.clear()
            bat = m.forward(PROMPT + [TOKEN], m.new_state(len(PROMPT) + 8), exact=False).logits[-1].float()
            rec_bat = list(rec)
        print(variant, "records", len(rec_dec), len(rec_bat))
        for i, (a, b) in enumerate(zip(rec_dec, rec_bat)):
            ex = (a[1] - b[1]).norm() / b[1].norm()
            eh = (a[2] - b[2]).norm() / b[2].norm()
            print(f"  {i:2d} layer {i // 2} {a[0]:>13s}/{b[0]:<9s} resid rel {ex:.2e}  normed rel {eh:.2e}")
        rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
        print(f"  logits rel {rel(dec, bat):.4f}, argmax {dec.argmax().item()} (decode) {bat.argmax().item()} "
              f"(batched); against transformers: decode {rel(dec, hl):.4f}, batched {rel(bat, hl):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
