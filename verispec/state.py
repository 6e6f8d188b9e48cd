"""Decoding state owned by the caller: KV cache, recurrent state, copy slots.

`commit(keep)` is the one undo: after a forward of M rows, keep the first `keep` rows
(1 <= keep <= M). Attention rows past them become a stale tail that the next forward
overwrites; the DeltaNet state and conv ring come back from copy slot keep-1, which the
forward wrote after that row (a pointer swap, nothing recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass(frozen=True)
class StateShapes:
    """Tensor shapes of one sequence's state, derived from the model's arguments."""

    max_len: int
    attn_layers: int
    kv_heads: int
    head_dim: int
    linear_layers: int
    conv_dim: int
    conv_keep: int            # K - 1 columns of the conv ring
    value_heads: int
    key_dim: int
    value_dim: int
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    @property
    def kv_bytes(self) -> int:
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.attn_layers * self.kv_heads * self.max_len * self.head_dim * elem

    @property
    def slot_bytes(self) -> int:
        """One copy slot: every DeltaNet layer's recurrent state (fp32) and conv ring."""
        elem = torch.empty(0, dtype=self.dtype).element_size()
        rec = self.value_heads * self.key_dim * self.value_dim * 4
        conv = self.conv_dim * self.conv_keep * elem
        return self.linear_layers * (rec + conv)

    @property
    def recurrent_bytes(self) -> int:
        return self.slot_bytes


@dataclass
class RecurrentState:
    """The DeltaNet part of the state: one tensor pair per linear-attention layer."""

    conv: list[torch.Tensor]   # per layer [conv_dim, K-1]
    rec: list[torch.Tensor]    # per layer [value_heads, key_dim, value_dim] fp32

    @staticmethod
    def allocate(s: StateShapes, alloc: Callable = torch.zeros) -> "RecurrentState":
        conv, rec = [], []
        on = {} if s.device == "cpu" else {"device": s.device}   # injected test allocators take (shape, dtype)
        for _ in range(s.linear_layers):
            conv.append(alloc((s.conv_dim, s.conv_keep), dtype=s.dtype, **on))
            rec.append(alloc((s.value_heads, s.key_dim, s.value_dim), dtype=torch.float32, **on))
        return RecurrentState(conv, rec)

    def copy_layer_from(self, other: "RecurrentState", layer: int) -> None:
        self.conv[layer].copy_(other.conv[layer])
        self.rec[layer].copy_(other.rec[layer])

    def copy_from(self, other: "RecurrentState") -> None:
        """Every layer's state copied from other's: the undo of a rejected draft under CUDA
        graphs. One multi-tensor copy per dtype (the conv rings and the fp32 states apart:
        a list of mixed dtypes takes torch's slow per-tensor path). On the H200, 30 layers
        (64 MB): 0.066 ms against 0.382 ms as two copies per layer (bench/cuda_bench.py undo)."""
        torch._foreach_copy_(self.conv, other.conv)
        torch._foreach_copy_(self.rec, other.rec)

    def clone(self) -> "RecurrentState":
        return RecurrentState([c.clone() for c in self.conv], [r.clone() for r in self.rec])


class SlotAllocationError(RuntimeError):
    pass


@dataclass
class State:
    shapes: StateShapes
    k: list[torch.Tensor]                  # per attention layer [kv_heads, max_len, head_dim]
    v: list[torch.Tensor]
    recurrent: RecurrentState
    kv_len: int = 0
    tokens: list[int] = field(default_factory=list)   # every fed token, in order
    slots: list[RecurrentState] = field(default_factory=list)
    # Tests inject allocation failures here; (shape, dtype) -> tensor.
    slot_alloc: Callable = torch.empty
    # CUDA graphs hold the tensors' addresses: commit then copies the slot into the live state
    # instead of swapping the two (verispec/cuda_graphs.py sets it).
    copy_commit: bool = False
    # device tables of copy-slot addresses for the GPU kernels that write every row's slot in
    # one launch (verispec/ops/cuda_slots.py); keyed by the addresses they hold
    slot_tables: dict = field(default_factory=dict)

    @staticmethod
    def allocate(s: StateShapes) -> "State":
        k = [torch.zeros(s.kv_heads, s.max_len, s.head_dim, dtype=s.dtype, device=s.device) for _ in range(s.attn_layers)]
        v = [torch.zeros(s.kv_heads, s.max_len, s.head_dim, dtype=s.dtype, device=s.device) for _ in range(s.attn_layers)]
        return State(s, k, v, RecurrentState.allocate(s))

    @property
    def allocated_bytes(self) -> int:
        ts = self.k + self.v + self.recurrent.conv + self.recurrent.rec
        for slot in self.slots:
            ts = ts + slot.conv + slot.rec
        return sum(t.numel() * t.element_size() for t in ts)

    def ensure_slots(self, n: int) -> bool:
        """Have at least n copy slots. On a failed allocation the unfinished slot is
        dropped, finished ones are kept, and False says: take a plain step instead."""
        while len(self.slots) < n:
            try:
                slot = RecurrentState.allocate(self.shapes, alloc=self.slot_alloc)
            except (RuntimeError, MemoryError, SlotAllocationError):
                return False
            self.slots.append(slot)
        return True

    def commit(self, start_len: int, rows: int, keep: int) -> None:
        """A forward of `rows` rows began at kv_len == start_len; keep the first `keep`."""
        if not 1 <= keep <= rows:
            raise ValueError(f"keep={keep} outside 1..{rows}")
        self.kv_len = start_len + keep
        del self.tokens[start_len + keep:]
        if keep < rows:
            slot = self.slots[keep - 1]
            if self.copy_commit:
                self.recurrent.copy_from(slot)
                return
            self.slots[keep - 1] = self.recurrent
            self.recurrent = slot

    def reset(self) -> None:
        """An empty sequence again, in the same tensors (so CUDA graphs bound to them stay valid)."""
        self.kv_len = 0
        self.tokens.clear()
        for t in self.recurrent.conv + self.recurrent.rec:
            t.zero_()

    def restore(self, snap: dict) -> None:
        """Bring the state back to a snapshot() of a state of the same shapes."""
        n = snap["kv_len"]
        self.kv_len = n
        self.tokens[:] = snap["tokens"]
        for dst, src in zip(self.k + self.v, snap["k"] + snap["v"]):
            dst[:, :n] = src
        for dst, src in zip(self.recurrent.conv + self.recurrent.rec, snap["conv"] + snap["rec"]):
            dst.copy_(src)

    def snapshot(self) -> dict:
        """A deep copy of everything that defines the sequence (tests and pins)."""
        n = self.kv_len
        return {
            "kv_len": n,
            "tokens": list(self.tokens),
            "k": [t[:, :n].clone() for t in self.k],
            "v": [t[:, :n].clone() for t in self.v],
            "conv": [t.clone() for t in self.recurrent.conv],
            "rec": [t.clone() for t in self.recurrent.rec],
        }
