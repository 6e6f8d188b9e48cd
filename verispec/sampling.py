"""Token picking from exact logits: greedy, or temperature/top-k/top-p sampling whose
randomness is keyed by (seed, absolute position), plus logprobs.

The decoder's contract (DESIGN.md section 1-2) needs the token picked at a position to be a
pure function of that position's logits, the seed and the position: then a run with drafts
and a run without pick the same tokens, because they see the same logits. So there is no
generator object and no global RNG here: the uniform draw is a hash of (seed, position).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import VerispecError

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 = off
    top_k: int = 0  # 0 = off
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if isinstance(self.seed, bool) or int(self.seed) != self.seed:
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _splitmix64(x: int) -> int:
    # One step of splitmix64 (Steele et al.): a bijective 64-bit mixer with full avalanche.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """A double in [0, 1) that depends only on (seed, position). Both are reduced mod 2^64."""
    x = _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return (x >> 11) * (1.0 / (1 << 53))  # top 53 bits -> exactly representable


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() != 1 or logits.numel() == 0:
        raise ValueError(f"logits must be a non-empty 1-D tensor [vocab], got shape {tuple(logits.shape)}")


def pick(logits: torch.Tensor, position: int, params: SamplingParams) -> int:
    """The token at `position` from `logits` [vocab] (float32).

    Greedy: argmax, the lowest id on ties. Sampled: temperature, then top-k, then top-p
    (the smallest set of most likely tokens whose mass reaches top_p, ties broken towards
    lower ids), then an inverse-CDF draw over the kept tokens in ascending id order with
    u = uniform(seed, position). All in float64 on the CPU in a fixed order, so the result
    depends on nothing but (logits, position, params).
    """
    _check_logits(logits)
    if params.greedy and logits.is_cuda:
        # one reduction and one transfer (each host read of a GPU value waits for the GPU, and
        # each launch costs the host too: bench/pick_cost.py): max propagates NaN, and returns the
        # first maximal index on ties; an id below 2^24 is exact in fp32
        top, at = torch.max(logits, 0)
        v, i = torch.stack([top, at.float()]).tolist()
        tok, bad = int(i), v != v
    else:
        tok, bad = None, bool(torch.isnan(logits).any())
    if bad:
        raise VerispecError("the model's logits contain NaN: the checkpoint's weights are likely damaged "
                            "(NaN or Inf values)")
    if params.greedy:
        return tok if tok is not None else int(torch.argmax(logits))  # torch returns the first maximal index

    x = logits.detach().to(device="cpu", dtype=torch.float64)  # [vocab]
    top = float(x.max())
    if not (float("-inf") < top < float("inf")):
        raise ValueError("logits have no finite maximum")
    x = (x - top) / params.temperature  # shift first: a tiny temperature cannot overflow
    ids = _keep(x, params.top_k, params.top_p)  # [kept], ascending ids
    probs = torch.softmax(x[ids], dim=0)  # renormalized over the kept set
    cum = torch.cumsum(probs, dim=0)
    target = torch.tensor([uniform(params.seed, position) * float(cum[-1])], dtype=torch.float64)
    # first index whose cumulative mass exceeds the target; zero-mass tokens never win
    i = int(torch.searchsorted(cum, target, right=True))
    return int(ids[min(i, ids.numel() - 1)])


def _sorted_desc(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """ids (ascending) ordered by x[ids] descending, equal values keeping ascending id order."""
    order = torch.sort(x[ids], descending=True, stable=True).indices
    return ids[order]


def _top_ids(x: torch.Tensor, m: int) -> torch.Tensor:
    """The m largest entries' ids in descending order (ties: lower id first), without
    sorting the whole vocabulary: everything >= the m-th value, then a small stable sort."""
    if m >= x.numel():
        return _sorted_desc(x, torch.arange(x.numel()))
    kth = torch.topk(x, m, sorted=False).values.min()
    cand = torch.nonzero(x >= kth).flatten()  # ascending ids, ties at the boundary included
    return _sorted_desc(x, cand)[:m]


def _keep(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Ids (ascending) that survive top-k then top-p on the tempered logits x [vocab]."""
    ids = torch.arange(x.numel())
    if 0 < top_k < x.numel():
        ids = torch.sort(_top_ids(x, top_k)).values
    if top_p >= 1.0:
        return ids
    xs = x[ids]  # [n] the top-k set
    log_z = torch.logsumexp(xs, dim=0)
    m = min(256, xs.numel())
    while True:
        # The nucleus is a prefix of the descending order; look at the m best first and
        # widen only when their mass falls short of top_p.
        best = _top_ids(xs, m)  # indices into xs, descending
        cum = torch.cumsum(torch.exp(xs[best] - log_z), dim=0)
        if float(cum[-1]) >= top_p or m >= xs.numel():
            p = torch.tensor([top_p], dtype=torch.float64)
            n_keep = min(int(torch.searchsorted(cum, p)) + 1, best.numel())  # >= 1
            return torch.sort(ids[best[:n_keep]]).values
        m = min(4 * m, xs.numel())


def _log_softmax64(logits: torch.Tensor) -> torch.Tensor:
    _check_logits(logits)
    return torch.log_softmax(logits.detach().to(device="cpu", dtype=torch.float64), dim=0)


def top_logprobs(logits: torch.Tensor, n: int) -> list[tuple[int, float]]:
    """The n most likely tokens under log-softmax(logits), as (id, logprob); ties by lower id."""
    if n <= 0:
        return []
    lp = _log_softmax64(logits)
    values, ids = torch.sort(lp, descending=True, stable=True)
    return [(int(i), float(v)) for i, v in zip(ids[:n].tolist(), values[:n].tolist())]


def logprob_of(logits: torch.Tensor, token: int) -> float:
    """log-softmax(logits)[token], computed in float64."""
    lp = _log_softmax64(logits)
    if not 0 <= token < lp.numel():
        raise ValueError(f"token {token} out of range for vocab {lp.numel()}")
    return float(lp[token])
