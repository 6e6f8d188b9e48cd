"""Which optional fusions the exact path's forward uses on CUDA (read when a forward runs or
is captured, so a CUDA graph keeps what was set at its capture).

Each fusion moves a step into a neighbouring kernel: one launch fewer per layer, the same
formula, and still one compiled kernel for every row count (so still row-invariant). Most
change no bits; the ones that fold a reduction into another kernel's layout may move a
rounding, so a model's logits with a fusion on and off can differ in the last bits while
drafted and plain decoding, which both use the same setting, stay equal bit for bit.
`bench/cuda_bench.py --sections fusions` measures each against the forward without it.

  GATED_NORM_IN_PRODUCT  the DeltaNet's gated norm done by the output product as it loads
                         its input (cuda_gemv.GatedNormPrologue); its sums may round apart
  ROUTER_IN_PRODUCT      the MoE router (softmax, top-k, the shared expert's gate) done by the
                         router product's last program to finish (cuda_gemv.RouteEpilogue);
                         its sums may round apart from the separate router kernel's
  LOGITS_IN_PRODUCT      the lm_head product stores fp32 logits itself (rounded to bf16 first,
                         so the bits equal the separate conversion's)
"""

GATED_NORM_IN_PRODUCT = True
ROUTER_IN_PRODUCT = True
LOGITS_IN_PRODUCT = True
