"""Optional fusions of the exact path's forward on CUDA (read when a forward runs or is
captured, so a CUDA graph keeps what was set at its capture).

  LOGITS_IN_PRODUCT  the lm_head product stores the fp32 logits itself (rounded to bf16
                     first, so the bits equal the product followed by a conversion): one
                     launch fewer per forward

  NORM_ROUTER        the residual add and norm after a mixer and the MoE's router product in
                     one launch (verispec/ops/cuda_norm_router.py): one launch fewer per layer;
                     the router's logits summed in another order than the product's

  MOE_TAIL           (off unless asked for: still slower than the Triton launches, docs/cuda.md)
                     the MoE after its router (gate/up, down, the combine with the residual
                     add and the norm) as one persistent CUDA launch instead of three Triton
                     launches (verispec/ops/cuda_moe_tail.py; needs cuda-bindings): its sums
                     run in another order than the Triton kernels'

  STREAM             the mixers' input and output products by a CUDA C++ kernel that requests
                     its weights before the previous kernel is done (verispec/ops/cuda_stream_gemv.py;
                     needs cuda-bindings, else the Triton product runs): its sums run in another
                     order than the Triton product's

  STREAM_MOE         (off unless asked for: exact, but 2.9-5.3% slower than the Triton kernels in
                     the graphed forward, docs/cuda-history.md, fifteenth session)
                     the MoE's expert products (gate/up + SwiGLU, down) by CUDA C++ kernels whose
                     weights reach shared memory by TMA tiles, the shared expert's and the down
                     weights requested before the previous kernel is done, the router letting the
                     gate/up launch early (verispec/ops/cuda_stream_moe.py; needs cuda-bindings,
                     else the Triton kernels run): its sums run in another order than theirs

  REC                (off unless asked for: exact, but no faster than the Triton kernel in the
                     graphed forward, 1.002-1.025x, docs/cuda.md) the DeltaNet
                     recurrence by a CUDA C++ kernel written for latency, a warp's sums over the
                     key rows as one butterfly and the state read before the wait
                     (verispec/ops/cuda_recurrence.py; needs cuda-bindings, else the Triton kernel
                     runs): its sums run in another order than the Triton kernel's

  ROUTE_CLUSTER      (off unless asked for: an experiment, thirty-eighth session) NORM_ROUTER's
                     launch and the router (softmax, top-K, the shared expert's gate) as one
                     launch, a thread-block cluster a row whose first CTA routes once the others
                     put their logits into its shared memory (verispec/ops/cuda_norm_route.py;
                     needs cuda-bindings, else the two launches run): its sums run in another
                     order than theirs; the gate/up programs of the shared expert then wait too

`VERISPEC_FUSIONS_OFF=all` (or a comma-separated list of names) turns them off at import,
`VERISPEC_FUSIONS_ON=MOE_TAIL,STREAM_MOE,REC,ROUTE_CLUSTER` turns those on;
`bench/cuda_bench.py --sections fusions` measures each against the forward without it.
Three more were built, measured and dropped (docs/cuda-history.md, "Tried and dropped"): the gated
norm in the DeltaNet output product's loads, the router in the router product's last program,
and (ninth session) the router in the last program of NORM_ROUTER's launch for a row (a
counter per row): each made a decode step slower.
"""

import os

_off = set(os.environ.get("VERISPEC_FUSIONS_OFF", "").split(","))   # names, or "all"
LOGITS_IN_PRODUCT = not _off & {"all", "LOGITS_IN_PRODUCT"}
NORM_ROUTER = not _off & {"all", "NORM_ROUTER"}
MOE_TAIL = ("MOE_TAIL" in os.environ.get("VERISPEC_FUSIONS_ON", "").split(",")) and not _off & {"all", "MOE_TAIL"}
STREAM = not _off & {"all", "STREAM"}
STREAM_MOE = ("STREAM_MOE" in os.environ.get("VERISPEC_FUSIONS_ON", "").split(",")) and not _off & {"all", "STREAM_MOE"}
REC = ("REC" in os.environ.get("VERISPEC_FUSIONS_ON", "").split(",")) and not _off & {"all", "REC"}
ROUTE_CLUSTER = (("ROUTE_CLUSTER" in os.environ.get("VERISPEC_FUSIONS_ON", "").split(","))
                 and not _off & {"all", "ROUTE_CLUSTER", "NORM_ROUTER"})
