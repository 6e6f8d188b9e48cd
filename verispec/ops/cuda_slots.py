"""Copy-slot address tables: one launch can write the state after each of its rows into that
row's copy slot.

The slots are separate tensors (allocated one at a time, as a verify first needs them), so a
kernel that runs every row of a verify gets their addresses as an int64 device table. A table
is built once per (kind, layer, addresses) and kept on the State: a CUDA graph captures the
table's address, and the graphed path never moves slots (commit copies instead of swapping),
so the same table serves every replay. Entries past the rows that save point at the live
tensor and are never written (the kernels mask them).
"""

from __future__ import annotations

import torch

from ..state import State

MAX_ROWS = 16


def table(state: State, kind: str, layer: int, rows: int, live: torch.Tensor) -> torch.Tensor:
    """int64 [MAX_ROWS] on live's device: the address of state.slots[r].<kind>[layer] for
    r < rows - 1 (the rows whose state a verify keeps), live's address after them."""
    ptrs = tuple(getattr(state.slots[r], kind)[layer].data_ptr() for r in range(rows - 1))
    key = (kind, layer, ptrs, live.data_ptr())
    t = state.slot_tables.get(key)
    if t is None:
        if len(state.slot_tables) > 4096:     # eager runs swap slots: addresses churn
            state.slot_tables.clear()
        vals = list(ptrs) + [live.data_ptr()] * (MAX_ROWS - len(ptrs))
        t = torch.tensor(vals, dtype=torch.int64).to(live.device)
        state.slot_tables[key] = t
    return t


def table_of(tensors: list, live: torch.Tensor) -> torch.Tensor:
    """An uncached table from a list of slot tensors (None: not saved; tests and eager callers)."""
    vals = [t.data_ptr() if t is not None else live.data_ptr() for t in tensors][:MAX_ROWS]
    vals += [live.data_ptr()] * (MAX_ROWS - len(vals))
    return torch.tensor(vals, dtype=torch.int64).to(live.device)
