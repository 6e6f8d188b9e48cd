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
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch
from verispec.engine import Engine
from verispec.execution import Execution
from verispec.models import qwen3_next as Q
from verispec.random_model import preset_config, random_checkpoint

PROMPT = [(i * 7919 + 13) % 4000 + 11 for i in range(64)]
layers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
cfg = preset_config("qwen3.6-35b-a3b-shape", layers=layers)
ck = random_checkpoint(cfg, seed=0, device="cuda", mtp=False)
eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=False))
m = eng.model
rec = []
orig_add_norm = Q.add_norm
orig_moe = Q.Model.moe_add_norm


def add_norm(x, h, w, eps, rp):
    out = orig_add_norm(x, h, w, eps, rp)
    rec.append(("add_norm", out[0][-1].float().clone(), out[1][-1].float().clone()))
    return out


def moe_add_norm(self, *a, **k):
    out = orig_moe(self, *a, **k)
    rec.append(("moe_add_norm", out[0][-1].float().clone(), out[1][-1].float().clone()))
    return out


Q.add_norm = add_norm
Q.Model.moe_add_norm = moe_add_norm
t = 82076
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_vs_transformers import hf_model  # noqa: E402
with torch.no_grad():
    hf = hf_model(cfg, dict(ck.tensors))[0]
    hl = hf(torch.tensor([PROMPT + [t]], device="cuda")).logits[0, -1].float()
print("hf argmax", hl.argmax().item())
for variant in ("plain", "no_logits_fusion"):
  with torch.no_grad():
      if variant == "no_logits_fusion":
          from verispec.ops import cuda_fusions
          cuda_fusions.LOGITS_IN_PRODUCT = False
      st = m.new_state(128)
      m.forward(PROMPT, st, exact=False)
      rec.clear()
      dec = m.forward([t], st, exact=True).logits[-1].float()
      rec_dec = list(rec)
      rec.clear()
      st2 = m.new_state(128)
      bat = m.forward(PROMPT + [t], st2, exact=False).logits[-1].float()
      rec_bat = list(rec)
      print(variant, "records", len(rec_dec), len(rec_bat))
      for i, (a, b) in enumerate(zip(rec_dec, rec_bat)):
          ex = (a[1] - b[1]).norm() / b[1].norm()
          eh = (a[2] - b[2]).norm() / b[2].norm()
          print(f"  {i:2d} layer {i // 2} {a[0]:>13s}/{b[0]:<9s} resid rel {ex:.2e}  normed rel {eh:.2e}")
      print("  logits rel", ((dec - bat).norm() / bat.norm()).item(), "argmax", dec.argmax().item(), bat.argmax().item(),
            "vs hf: dec", ((dec - hl).norm() / hl.norm()).item(), "bat", ((bat - hl).norm() / hl.norm()).item())
