"""verispec: exact speculative decoding for hybrid DeltaNet / attention / MoE models."""

import os

# OpenMP threads that spin while waiting (GOMP's default) collapse when another process holds
# a core: on the 2-core machine with one core busy, decode fell from ~200 to 2.3 tok/s with 2
# threads (152 tok/s with passive waiting). Set before torch loads its OpenMP runtime; an
# explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
