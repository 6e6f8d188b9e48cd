"""Qwen3-Next / Qwen3.5-MoE text model: Gated DeltaNet + gated attention + sparse MoE.

Weights keep their HF names on disk; at load the projections one row feeds are stacked
into one matrix per block (so a verify of M rows makes the same number of dense calls as
a step of one row) and the fused `in_proj_qkvz`/`in_proj_ba` layout is reordered into the
split one. `forward(ids, state)` appends any number of rows at `state.kv_len`:
rows <= EXACT_ROWS take the row-invariant path (decode, verify), longer inputs the fast
batched one (prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..errors import ModelFormatError
from ..execution import Execution
from ..ops import attention as attn_ops
from ..ops import (chunk_delta, cuda_attention, cuda_deltanet, cuda_fusions, cuda_gemv, cuda_moe, cuda_norm_route,
                   cuda_norm_router, cuda_norms, cuda_slots, cuda_stream_moe, grouped_moe)
from ..ops import deltanet as dn_ops
from ..ops import linear as lin_ops
from ..state import State, StateShapes
from .layers import (BATCH, ROWWISE, Padded, RopeTable, add_norm, apply_rope, gated_rms_norm, policy, rms_norm, rowwise,
                     silu_mul)

EXACT_ROWS = 16
FAMILIES = ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")


def _int_at_least(name: str, v, least: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ModelFormatError(f"config.json: {name} must be an integer >= {least}, got {v!r}")


@dataclass(frozen=True)
class ModelArgs:
    family: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    max_position_embeddings: int
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]
    tie_word_embeddings: bool
    mtp_layers: int
    eos_token_id: tuple[int, ...] = ()

    @staticmethod
    def from_dict(cfg: dict) -> "ModelArgs":
        if not isinstance(cfg, dict):
            raise ModelFormatError("config.json is not a JSON object")
        family = cfg.get("model_type", "")
        if not family:
            raise ModelFormatError(f"config.json has no model_type: verispec runs {', '.join(FAMILIES[:2])} configs")
        if family not in FAMILIES:
            raise ModelFormatError(
                f"unsupported model family {family!r}: verispec runs {', '.join(FAMILIES[:2])}"
            )
        top = cfg
        if "text_config" in cfg:  # a Qwen3.5 release: the text model's fields are nested
            cfg = {**cfg["text_config"]}
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise ModelFormatError(f"unsupported rope_type {rope_type!r} (only default RoPE is implemented)")
        if cfg.get("attention_bias", False):
            raise ModelFormatError("attention_bias=true is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelFormatError(f"hidden_act {cfg['hidden_act']!r} is not supported (silu only)")
        n_layers = cfg["num_hidden_layers"]
        for name in ("num_hidden_layers", "num_attention_heads", "hidden_size"):    # used before _checked
            _int_at_least(name, cfg[name], 1)
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            interval = cfg.get("full_attention_interval", 4)
            layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
        bad = {t for t in layer_types} - {"linear_attention", "full_attention"}
        if bad:
            raise ModelFormatError(f"unsupported layer types {sorted(bad)}")
        heads = cfg["num_attention_heads"]
        eos = top.get("eos_token_id", cfg.get("eos_token_id"))
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        mtp = top.get("num_nextn_predict_layers", top.get("mtp_num_hidden_layers",
                      cfg.get("num_nextn_predict_layers", cfg.get("mtp_num_hidden_layers", 0)))) or 0
        return ModelArgs(
            family="qwen3_5_moe" if family.startswith("qwen3_5") else family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types[:n_layers]),
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)),
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            linear_conv_kernel_dim=cfg.get("linear_conv_kernel_dim", 4),
            linear_key_head_dim=cfg["linear_key_head_dim"],
            linear_value_head_dim=cfg["linear_value_head_dim"],
            linear_num_key_heads=cfg["linear_num_key_heads"],
            linear_num_value_heads=cfg["linear_num_value_heads"],
            num_experts=cfg.get("num_experts", 0),
            num_experts_per_tok=cfg.get("num_experts_per_tok", 0),
            moe_intermediate_size=cfg.get("moe_intermediate_size", 0),
            shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 0),
            intermediate_size=cfg.get("intermediate_size", 0),
            norm_topk_prob=cfg.get("norm_topk_prob", True),
            decoder_sparse_step=cfg.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
            tie_word_embeddings=bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
            mtp_layers=int(mtp),
            eos_token_id=eos,
        )._checked()

    def _checked(self) -> "ModelArgs":
        """Sizes a model cannot have are a damaged config, said before anything is allocated."""
        # (layers, heads and hidden size are checked in from_dict, before they are used)
        positive = ("vocab_size", "num_key_value_heads", "head_dim", "max_position_embeddings",
                    "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                    "linear_num_value_heads")
        for name in positive:
            _int_at_least(name, getattr(self, name), 1)
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "intermediate_size", "mtp_layers"):
            _int_at_least(name, getattr(self, name), 0)
        if self.num_experts_per_tok > self.num_experts:
            raise ModelFormatError(f"config.json: num_experts_per_tok {self.num_experts_per_tok} exceeds "
                                   f"num_experts {self.num_experts}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ModelFormatError(f"config.json: {len(self.layer_types)} layer_types for "
                                   f"{self.num_hidden_layers} layers")
        return self

    def is_moe(self, layer: int) -> bool:
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    def state_shapes(self, max_len: int, execution: Execution | None = None) -> StateShapes:
        ex = execution or Execution()
        return StateShapes(
            max_len=max_len,
            attn_layers=sum(t == "full_attention" for t in self.layer_types),
            kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            linear_layers=sum(t == "linear_attention" for t in self.layer_types),
            conv_dim=2 * self.key_dim + self.value_dim,
            conv_keep=self.linear_conv_kernel_dim - 1,
            value_heads=self.linear_num_value_heads,
            key_dim=self.linear_key_head_dim,
            value_dim=self.linear_value_head_dim,
            dtype=ex.dtype,
            device=ex.device,
        )


@dataclass
class ForwardOut:
    logits: torch.Tensor        # [rows, vocab] fp32
    hidden: torch.Tensor        # [rows, hidden] after the final norm
    hidden_pre: torch.Tensor    # [rows, hidden] before it


class _Weights:
    """Pops tensors by name and fails loudly on anything missing or left over."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.t = dict(tensors)

    def pop(self, name: str, shape: tuple | None = None) -> torch.Tensor:
        if name not in self.t:
            raise ModelFormatError(f"checkpoint is missing tensor {name}")
        x = self.t.pop(name)
        if shape is not None and tuple(x.shape) != tuple(shape):
            raise ModelFormatError(f"tensor {name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
        return x

    def has(self, name: str) -> bool:
        return name in self.t

    def finish(self) -> None:
        if self.t:
            names = sorted(self.t)
            more = f" (and {len(names) - 5} more)" if len(names) > 5 else ""
            raise ModelFormatError(f"unknown tensor(s) in checkpoint: {', '.join(names[:5])}{more}")


@dataclass
class MoE:
    pre: torch.Tensor                  # [E + 1 + 2*Is, H]: router, shared gate, shared gate/up
    shared_down: torch.Tensor          # [H, Is]
    experts_gu: list[torch.Tensor]     # per expert [2I, H] (gate rows, then up rows)
    experts_down: list[torch.Tensor]   # per expert [H, I]
    gu_all: torch.Tensor               # [E, 2I, H]: the experts above are views of these
    down_all: torch.Tensor             # [E, H, I]
    n_experts: int
    top_k: int
    norm_topk: bool
    shared_inter: int


@dataclass
class DenseMLP:
    gu: torch.Tensor                   # [2I, H]
    down: torch.Tensor                 # [H, I]


@dataclass
class LinearAttn:
    index: int                         # position among the DeltaNet layers
    w_in: torch.Tensor                 # [2*key_dim + 2*value_dim + 2*Hv, H]: q|k|v|z|b|a
    conv: torch.Tensor                 # [conv_dim, K]
    a_log_exp: torch.Tensor            # [Hv] exp(A_log)
    dt_bias: torch.Tensor              # [Hv]
    norm: torch.Tensor                 # [dv]
    out: torch.Tensor                  # [H, value_dim]


@dataclass
class FullAttn:
    index: int                         # position among the attention layers
    w_qkv: torch.Tensor                # [2*heads*hd + 2*kv_heads*hd, H]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    out: torch.Tensor                  # [H, heads*hd]


@dataclass
class Layer:
    mixer: LinearAttn | FullAttn
    mlp: MoE | DenseMLP
    in_norm: torch.Tensor
    post_norm: torch.Tensor


def load_moe(w: _Weights, p: str, a: ModelArgs) -> MoE:
    h, e, inter, si = a.hidden_size, a.num_experts, a.moe_intermediate_size, a.shared_expert_intermediate_size
    router = w.pop(f"{p}.gate.weight", (e, h))
    sgate = w.pop(f"{p}.shared_expert_gate.weight", (1, h))
    sg = w.pop(f"{p}.shared_expert.gate_proj.weight", (si, h))
    su = w.pop(f"{p}.shared_expert.up_proj.weight", (si, h))
    sd = w.pop(f"{p}.shared_expert.down_proj.weight", (h, si))
    if w.has(f"{p}.experts.gate_up_proj"):   # fused expert tensors (transformers' layout)
        gu = w.pop(f"{p}.experts.gate_up_proj", (e, 2 * inter, h)).contiguous()
        dn = w.pop(f"{p}.experts.down_proj", (e, h, inter)).contiguous()
    else:
        gus, downs = [], []
        for i in range(e):
            g = w.pop(f"{p}.experts.{i}.gate_proj.weight", (inter, h))
            u = w.pop(f"{p}.experts.{i}.up_proj.weight", (inter, h))
            gus.append(torch.cat([g, u], 0))
            downs.append(w.pop(f"{p}.experts.{i}.down_proj.weight", (h, inter)))
        gu, dn = torch.stack(gus), torch.stack(downs)
    pre = torch.cat([router, sgate, sg, su], 0)
    # zero rows up to a multiple of 8, so the product's rows are 16-byte aligned (cuBLAS fell
    # back to an unaligned kernel at 2.5x the time for 256 + 1 + 2 * 512 = 1281 outputs)
    pre = torch.cat([pre, pre.new_zeros((-pre.shape[0]) % 8, h)], 0).contiguous()
    return MoE(pre, sd, [gu[i] for i in range(e)], [dn[i] for i in range(e)], gu, dn, e, a.num_experts_per_tok,
               a.norm_topk_prob, si)


def load_full_attn(w: _Weights, p: str, a: ModelArgs, index: int) -> FullAttn:
    h, nh, nkv, hd = a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim
    q = w.pop(f"{p}.q_proj.weight", (2 * nh * hd, h))
    k = w.pop(f"{p}.k_proj.weight", (nkv * hd, h))
    v = w.pop(f"{p}.v_proj.weight", (nkv * hd, h))
    return FullAttn(
        index, torch.cat([q, k, v], 0).contiguous(),
        w.pop(f"{p}.q_norm.weight", (hd,)), w.pop(f"{p}.k_norm.weight", (hd,)),
        w.pop(f"{p}.o_proj.weight", (h, nh * hd)),
    )


def _load_linear_attn(w: _Weights, p: str, a: ModelArgs, index: int) -> LinearAttn:
    h, hk, hv = a.hidden_size, a.linear_num_key_heads, a.linear_num_value_heads
    dk, dv, r = a.linear_key_head_dim, a.linear_value_head_dim, hv // hk
    kd, vd = a.key_dim, a.value_dim
    if w.has(f"{p}.in_proj_qkvz.weight"):   # Qwen3-Next: rows grouped by key head
        qkvz = w.pop(f"{p}.in_proj_qkvz.weight", (2 * kd + 2 * vd, h)).view(hk, 2 * dk + 2 * r * dv, h)
        ba = w.pop(f"{p}.in_proj_ba.weight", (2 * hv, h)).view(hk, 2 * r, h)
        q, k = qkvz[:, :dk], qkvz[:, dk:2 * dk]
        v, z = qkvz[:, 2 * dk:2 * dk + r * dv], qkvz[:, 2 * dk + r * dv:]
        parts = [q.reshape(kd, h), k.reshape(kd, h), v.reshape(vd, h), z.reshape(vd, h),
                 ba[:, :r].reshape(hv, h), ba[:, r:].reshape(hv, h)]
    else:                                     # Qwen3.5: split projections
        parts = [w.pop(f"{p}.in_proj_qkv.weight", (2 * kd + vd, h)), w.pop(f"{p}.in_proj_z.weight", (vd, h)),
                 w.pop(f"{p}.in_proj_b.weight", (hv, h)), w.pop(f"{p}.in_proj_a.weight", (hv, h))]
    conv_dim = 2 * kd + vd
    conv = w.pop(f"{p}.conv1d.weight", (conv_dim, 1, a.linear_conv_kernel_dim)).reshape(conv_dim, -1)
    if w.has(f"{p}.conv1d.bias"):
        raise ModelFormatError(f"{p}.conv1d.bias: a conv bias is not supported")
    return LinearAttn(
        index, torch.cat(parts, 0).contiguous(), conv.contiguous(),
        w.pop(f"{p}.A_log", (hv,)).float().exp(), w.pop(f"{p}.dt_bias", (hv,)),
        w.pop(f"{p}.norm.weight", (dv,)), w.pop(f"{p}.out_proj.weight", (h, vd)),
    )


def padded_linear(n: int):
    """F.linear on exactly n rows (Padded: the rows copied into an n-row buffer): cuBLAS then
    runs one algorithm for every row count, and row i's bits cannot depend on how many rows
    came with it."""
    rp = Padded(n)
    return lambda x, w: rp.reduce(lambda t: F.linear(t, w), x)


def gpu_exact_linear(n: int):
    """The exact path's products on CUDA: the fixed-order Triton kernel for up to 16 rows
    (verispec/ops/cuda_gemv.py), the padded cuBLAS product where it does not apply."""
    padded = padded_linear(n)

    def lin(x, w):
        if n == cuda_gemv.ROWS and cuda_gemv.usable(x, w):
            return cuda_gemv.linear_rows(x, w)
        return padded(x, w)
    return lin


def _partials_linear(lin):
    """lin, except that a product the fixed-order kernel splits along K returns its unsummed
    partials (cuda_gemv.Partials) for add_norm to sum; only for products add_norm consumes."""
    def out(x, w):
        if cuda_gemv.usable(x, w) and cuda_norms.usable(x) and cuda_gemv.splits(w.shape[1], w.shape[0], w):
            return cuda_gemv.Partials(cuda_gemv.linear_rows(x, w, partials=True), x.shape[0])
        return lin(x, w)
    return out


class Model:
    def __init__(self, args: ModelArgs, tensors: dict[str, torch.Tensor], execution: Execution | None = None):
        self.args = a = args
        self.exec = ex = execution or Execution()
        # weights move one at a time, so peak host memory is the checkpoint's, not twice it; a
        # tensor already on the device in the dtype is kept as it is
        tensors = {k: v.to(device=ex.torch_device, dtype=ex.dtype if v.is_floating_point() else v.dtype)
                   for k, v in tensors.items()}
        self.graphs = None          # a CUDA-graph runner for the exact path (verispec/cuda_graphs.py)
        if ex.pad_rows:
            lin = gpu_exact_linear(ex.pad_rows) if ex.is_cuda else padded_linear(ex.pad_rows)
            self.rows_exact, self.lin_exact, self.lin_fast = Padded(ex.pad_rows), lin, F.linear
        else:
            # looked up at call time, so profilers and tests can wrap the module's functions
            self.rows_exact = ROWWISE
            self.lin_exact = lambda x, w: lin_ops.linear(x, w)
            self.lin_fast = lambda x, w: lin_ops.linear_fast(x, w)
        w = _Weights(tensors)
        self.embed = w.pop("model.embed_tokens.weight", (a.vocab_size, a.hidden_size))
        self.layers: list[Layer] = []
        n_lin = n_full = 0
        for i, kind in enumerate(a.layer_types):
            p = f"model.layers.{i}"
            if kind == "linear_attention":
                mixer = _load_linear_attn(w, f"{p}.linear_attn", a, n_lin)
                n_lin += 1
            else:
                mixer = load_full_attn(w, f"{p}.self_attn", a, n_full)
                n_full += 1
            if a.is_moe(i):
                mlp = load_moe(w, f"{p}.mlp", a)
            else:
                g = w.pop(f"{p}.mlp.gate_proj.weight", (a.intermediate_size, a.hidden_size))
                u = w.pop(f"{p}.mlp.up_proj.weight", (a.intermediate_size, a.hidden_size))
                mlp = DenseMLP(torch.cat([g, u], 0).contiguous(),
                               w.pop(f"{p}.mlp.down_proj.weight", (a.hidden_size, a.intermediate_size)))
            self.layers.append(Layer(mixer, mlp, w.pop(f"{p}.input_layernorm.weight", (a.hidden_size,)),
                                     w.pop(f"{p}.post_attention_layernorm.weight", (a.hidden_size,))))
        self.norm = w.pop("model.norm.weight", (a.hidden_size,))
        if w.has("lm_head.weight"):
            self.lm_head = w.pop("lm_head.weight", (a.vocab_size, a.hidden_size))
        elif a.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            raise ModelFormatError("checkpoint is missing tensor lm_head.weight (and tie_word_embeddings is false)")
        w.finish()
        self.rope = RopeTable(a.head_dim, a.partial_rotary_factor, a.rope_theta, ex.torch_device)
        self.prompt_graphs = None   # fresh prompts' batched forwards (verispec/prompt_graphs.py)
        self.prompt_pieces = None   # and those continuing a cache (verispec/prompt_pieces.py)
        if ex.graphs and ex.is_cuda:
            from ..cuda_graphs import GraphedForward
            from ..prompt_graphs import PromptGraphs
            from .. import prompt_pieces
            self.graphs = GraphedForward(self, ex.pad_rows)
            self.prompt_graphs = PromptGraphs(self, EXACT_ROWS + 1)
            if prompt_pieces.ENABLED:
                self.prompt_pieces = prompt_pieces.ContinuationGraphs(self, EXACT_ROWS + 1)

    # ----- state -----
    def new_state(self, max_len: int) -> State:
        return State.allocate(self.args.state_shapes(max_len, self.exec))

    @property
    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for t in self._all_tensors():
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    def _all_tensors(self):
        yield self.embed
        yield self.norm
        yield self.lm_head
        for layer in self.layers:
            for obj in (layer.mixer, layer.mlp):
                for v in vars(obj).values():
                    if isinstance(v, torch.Tensor):
                        yield v
                    elif isinstance(v, list):
                        yield from v
            yield layer.in_norm
            yield layer.post_norm

    # ----- forward -----
    def forward(self, ids: Sequence[int] | torch.Tensor, state: State, *, exact: bool | None = None,
                save_slots: bool = False, last_logits: bool = False) -> ForwardOut:
        """Append len(ids) rows at state.kv_len. With save_slots, the DeltaNet state after
        row r (r < rows-1) is copied into state.slots[r] (the caller ensured the slots).
        last_logits: a batched forward (a prompt) returns the last row's logits only ([1, V]; the
        exact path ignores it): a prompt's other rows' logits are never read, and at a 248K
        vocabulary they are 1 MB a row in fp32."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        rows = ids.shape[0]
        start = state.kv_len
        if rows == 0:
            raise ValueError("forward needs at least one token")
        if start + rows > state.shapes.max_len:
            raise ValueError(f"context full: {start} + {rows} rows > {state.shapes.max_len}")
        if exact is None:
            exact = rows <= EXACT_ROWS
        if save_slots and len(state.slots) < rows - 1:
            raise ValueError("save_slots needs rows-1 copy slots")
        if exact and isinstance(self.rows_exact, Padded) and rows > self.rows_exact.n:
            raise ValueError(f"an exact forward on {self.exec.device} takes at most {self.rows_exact.n} rows")
        if exact and self.graphs is not None:
            out = self.graphs.forward(ids, state, save_slots)
        elif not exact and last_logits and not save_slots and (prompt := self._prompt_graphs(start, rows)) is not None:
            out = prompt.forward(ids, state)
        else:
            pos = None
            if exact and isinstance(self.rows_exact, Padded):   # positions on the device: no host value in the math
                pos = torch.arange(rows, device=self.embed.device) + start
            out = ForwardOut(*self.core(ids.to(self.embed.device), state, start, exact, save_slots, pos,
                                        last_logits=last_logits and not exact))
        state.kv_len = start + rows
        state.tokens.extend(ids.tolist())
        if out.logits.is_cuda:
            # the work is queued, not done: the caller's clock (the gate's costs, the report's
            # seconds) must see the forward's real time, and every caller reads the logits next
            torch.cuda.synchronize(out.logits.device)
        return out

    def _prompt_graphs(self, start: int, rows: int):
        """The graphs that take a prompt of `rows` rows at `start`, or None (the eager path)."""
        g = self.prompt_graphs if start == 0 else self.prompt_pieces
        return g if g is not None and g.bucket(rows) is not None else None

    def core(self, ids: torch.Tensor, state: State, start: int, exact: bool, save_slots: bool,
             pos: torch.Tensor | None, last_logits: bool = False, n_real: torch.Tensor | None = None,
             attend=None):
        """The forward's device work: (logits [rows, V] fp32 (last_logits: [1, V]), hidden, hidden
        before the norm).
        With `pos` (the padded policy) nothing here reads a host value that changes from step
        to step, so CUDA graphs can capture it; `start` then only sizes nothing but checks.
        n_real (a batched forward, a device count): the rows from n_real on are padding after the
        prompt (verispec/prompt_graphs.py): the DeltaNet state skips them and last_logits is row
        n_real-1's.
        attend (a batched forward continuing a cache: verispec/prompt_pieces.py): the attention
        layers' cache writes and attention are handed to it (rows rotated at its device `pos`)."""
        lin = self.lin_exact if exact else self.lin_fast
        rp = self.rows_exact if exact else BATCH
        eps = self.args.rms_norm_eps
        x = self.embed[ids]                                     # [rows, H]
        norms = [w for layer in self.layers for w in (layer.in_norm, layer.post_norm)] + [self.norm]
        h = rms_norm(x, norms[0], eps, rp)
        # on CUDA the mixers' output products hand their split-K partials to the residual add
        # and norm after them, which sums them (one launch fewer per layer)
        out_lin = _partials_linear(lin) if rp is not BATCH and self.exec.pad_rows == cuda_gemv.ROWS else None
        live = None if n_real is None else torch.arange(ids.shape[0], device=ids.device) < n_real   # [rows]
        for i, layer in enumerate(self.layers):
            if isinstance(layer.mixer, LinearAttn):
                h = self._linear_attn(layer.mixer, h, state, rp, save_slots, lin, out_lin, n_real, live)
            else:
                h = self._full_attn(layer.mixer, h, state, start, rp, lin, pos=pos, out_lin=out_lin, attend=attend)
            if (isinstance(layer.mlp, MoE) and cuda_fusions.NORM_ROUTER and self._moe_kernels(layer.mlp, x, rp)
                    and cuda_norm_router.usable(x, layer.mlp.pre)):
                x, h = self.moe_add_norm(layer.mlp, None, x, norms[2 * i + 2], eps, before=(h, norms[2 * i + 1]))
                continue
            x, h = add_norm(x, h, norms[2 * i + 1], eps, rp)
            if isinstance(layer.mlp, MoE) and self._moe_kernels(layer.mlp, h, rp):
                x, h = self.moe_add_norm(layer.mlp, h, x, norms[2 * i + 2], eps)
                continue
            h = (self.moe(layer.mlp, h, lin, rp) if isinstance(layer.mlp, MoE)
                 else self.dense(layer.mlp, h, lin, rp))
            x, h = add_norm(x, h, norms[2 * i + 2], eps, rp)   # the next layer's input norm, or the final one
        if (rp is not BATCH and cuda_fusions.LOGITS_IN_PRODUCT and self.exec.pad_rows == cuda_gemv.ROWS
                and cuda_gemv.usable(h, self.lm_head) and not cuda_gemv.splits(*reversed(self.lm_head.shape))):
            logits = cuda_gemv.linear_rows(h, self.lm_head, out_dtype=torch.float32)   # no conversion launch
        else:
            last = h[-1:] if n_real is None else h.index_select(0, (n_real - 1).reshape(1))
            logits = lin(last if last_logits else h, self.lm_head).float()
        return logits, h, x

    def _linear_attn(self, m: LinearAttn, h, state: State, exact, save_slots, lin, out_lin=None, n_real=None,
                     live=None):
        a = self.args
        rp = policy(exact)
        rows = h.shape[0]
        kd, vd, hv = a.key_dim, a.value_dim, a.linear_num_value_heads
        ring = state.recurrent.conv[m.index]
        rec = state.recurrent.rec[m.index]
        if rp is not BATCH and cuda_deltanet.usable(ring):
            fused = (self.exec.pad_rows == cuda_gemv.ROWS and cuda_gemv.usable(h, m.w_in)
                     and cuda_gemv.conv_fits(m.w_in, 2 * kd + vd, m.conv.shape[1]))
            return self._linear_attn_kernels(m, h, state, save_slots, lin, out_lin, fused)
        proj = lin(h, m.w_in)                                   # [rows, q|k|v|z|b|a]
        mixed = proj[:, :2 * kd + vd]
        z = proj[:, 2 * kd + vd:2 * kd + 2 * vd]
        ba = proj[:, 2 * kd + 2 * vd:]
        if live is not None:
            # padding rows: b = a = -inf gives beta = 0 and a decay of exp(-0) = 1, so the
            # recurrence passes the state through them unchanged, in either kernel
            ba = torch.where(live[:, None], ba, float("-inf"))
        b, a_ = ba[:, :hv], ba[:, hv:]
        if save_slots:
            def save_conv(r):
                if r < rows - 1:
                    state.slots[r].conv[m.index].copy_(ring)

            def save_rec(r):
                if r < rows - 1:
                    state.slots[r].rec[m.index].copy_(rec)
        else:
            save_conv = save_rec = None
        rec_slots = None
        if cuda_deltanet.usable(ring):   # (a batched forward here) the kernel writes the copy slots itself
            save_conv = save_rec = None
            rec_slots = [state.slots[r].rec[m.index] if save_slots and r < rows - 1 else None for r in range(rows)]
        if rp is not BATCH:
            mixed = dn_ops.conv_rows(mixed, ring, m.conv, on_row=save_conv)
        else:
            mixed = dn_ops.conv_prefill(mixed, ring, m.conv, n_real)
        prompt = rp is BATCH and not save_slots
        heads = (a.linear_num_key_heads, a.linear_key_head_dim, a.linear_value_head_dim)
        if prompt and cuda_deltanet.usable(ring) and not chunk_delta.runs(rows, ring):
            # a shorter prompt on CUDA: every row in one launch, whose fixed cost is the lower one there
            o = cuda_deltanet.delta_steps(mixed.contiguous(), ba, m.a_log_exp, m.dt_bias, rec,
                                          None, *heads, out_dtype=h.dtype)
        elif prompt and chunk_delta.runs(rows, ring) and chunk_delta.usable_raw(mixed, rec, heads):
            # the chunks with q, k, v, g and beta prepared inside the parts' launch: ~20 launches fewer
            o = chunk_delta.delta_rule_raw(mixed, ba, m.a_log_exp, m.dt_bias, rec, heads, out_dtype=h.dtype)
        else:
            q = mixed[:, :kd].reshape(rows, heads[0], heads[1])
            k = mixed[:, kd:2 * kd].reshape(rows, heads[0], heads[1])
            v = mixed[:, 2 * kd:].reshape(rows, hv, heads[2])
            beta = rowwise(torch.sigmoid, b, exact=rp)
            g = -m.a_log_exp * rowwise(F.softplus, a_.float() + m.dt_bias, exact=rp)
            if prompt and chunk_delta.runs(rows, ring):   # a prompt: the rows in chunks (verispec/ops/chunk_delta.py)
                o = chunk_delta.delta_rule(q, k, v, g, beta, rec, rp)
            else:
                o = dn_ops.delta_rule_rows(q, k, v, g, beta, rec, on_row=save_rec, rows_policy=rp, slots=rec_slots)
        o = gated_rms_norm(o.to(h.dtype), z.reshape(rows, hv, a.linear_value_head_dim), m.norm, a.rms_norm_eps, rp)
        return lin(o.reshape(rows, vd), m.out)

    def _linear_attn_kernels(self, m: LinearAttn, h, state: State, save_slots, lin, out_lin, fused: bool):
        """The DeltaNet mixer of a decode/verify forward on CUDA in four launches (fused: the
        input product with the causal conv in its epilogue) or five (the product, then the conv
        kernel a launch per row), then the recurrence for every row in one launch (state in
        registers from row to row), the gated norm, the output product. The kernels that carry
        state write each kept row's state straight into its copy slot."""
        a = self.args
        rows = h.shape[0]
        kd, vd, hv = a.key_dim, a.value_dim, a.linear_num_value_heads
        ring, rec = state.recurrent.conv[m.index], state.recurrent.rec[m.index]
        keep = save_slots and rows > 1
        rtab = cuda_slots.table(state, "rec", m.index, rows, rec) if keep else None
        if fused:
            ctab = cuda_slots.table(state, "conv", m.index, rows, ring) if keep else None
            proj = cuda_gemv.linear_rows(h, m.w_in, conv=cuda_gemv.ConvEpilogue(ring, m.conv, ctab))
            mixed = proj[:, :2 * kd + vd]
        else:
            proj = lin(h, m.w_in)
            slots = [state.slots[r].conv[m.index] if keep and r < rows - 1 else None for r in range(rows)]
            mixed = cuda_deltanet.conv_rows(proj[:, :2 * kd + vd], ring, m.conv, slots)
        o = cuda_deltanet.delta_steps(mixed, proj[:, 2 * kd + 2 * vd:], m.a_log_exp, m.dt_bias, rec,
                                      rtab, a.linear_num_key_heads, a.linear_key_head_dim, a.linear_value_head_dim,
                                      out_dtype=h.dtype)
        z = proj[:, 2 * kd + vd:2 * kd + 2 * vd]
        o = gated_rms_norm(o, z.reshape(rows, hv, a.linear_value_head_dim), m.norm, a.rms_norm_eps, self.rows_exact)
        return (out_lin or lin)(o.reshape(rows, vd), m.out)

    def _full_attn(self, m: FullAttn, h, state: State, start, exact, lin, pos_offset: int = 0,
                   pos: torch.Tensor | None = None, out_lin=None, attend=None):
        """Gated attention; rows are written to the cache at start.. and rotated at
        positions start+pos_offset.. (the MTP head's pair p sits at index p, position p+1).
        With `pos` (device positions of the rows, the padded policy) the same happens with
        shapes that never change: index writes, table gathers, attend_static."""
        a = self.args
        rp = policy(exact)
        rows = h.shape[0]
        nh, hd = a.num_attention_heads, a.head_dim
        kc, vc = state.k[m.index], state.v[m.index]
        scale = hd ** -0.5
        if attend is not None:
            # the cache writes and the attention, which read a host position, happen outside the
            # captured pieces (verispec/prompt_pieces.py); o [rows, heads, hd]
            q, gate, k, v = self.qkv(m, h, attend.pos, lin, rp)
            o = attend(m, q, k, v)
            return lin(o.reshape(rows, nh * hd) * rowwise(torch.sigmoid, gate, exact=rp), m.out)
        if pos is not None and cuda_attention.usable(h):
            # norms, RoPE, cache writes, attention up to each row's position and the gate in
            # two launches (verispec/ops/cuda_attention.py)
            self.rope.ensure(kc.shape[1])
            o = cuda_attention.gated_attention(lin(h, m.w_qkv), m.q_norm, m.k_norm, self.rope.cos, self.rope.sin,
                                               pos, kc, vc, nh, a.rms_norm_eps)
            return (out_lin or lin)(o, m.out)
        if pos is not None:
            q, gate, k, v = self.qkv(m, h, pos, lin, rp, limit=kc.shape[1])
            kc.index_copy_(1, pos, k.transpose(0, 1))
            vc.index_copy_(1, pos, v.transpose(0, 1))
            o = attn_ops.attend_static(q, kc, vc, pos, scale, rp.n)
            o = o.reshape(rows, nh * hd) * rowwise(torch.sigmoid, gate, exact=rp)
            return lin(o, m.out)
        q, gate, k, v = self.qkv(m, h, start + pos_offset, lin, rp)
        o = attn_ops.append_and_attend(q, k, v, kc, vc, start, scale, exact=rp is not BATCH)
        o = o.reshape(rows, nh * hd) * rowwise(torch.sigmoid, gate, exact=rp)
        return lin(o, m.out)

    def qkv(self, m: FullAttn, h, pos, lin, rows=BATCH, limit: int = 0):
        """q [rows, heads, hd], gate [rows, heads*hd], k and v [rows, kv_heads, hd], rotated."""
        a = self.args
        rows = h.shape[0]
        nh, nkv, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        proj = lin(h, m.w_qkv)
        qg = proj[:, :2 * nh * hd].view(rows, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(rows, nh * hd)
        k = proj[:, 2 * nh * hd:2 * nh * hd + nkv * hd].view(rows, nkv, hd)
        v = proj[:, 2 * nh * hd + nkv * hd:].view(rows, nkv, hd)
        q = rms_norm(q, m.q_norm, a.rms_norm_eps, rows)
        k = rms_norm(k, m.k_norm, a.rms_norm_eps, rows)
        if isinstance(pos, torch.Tensor):
            cos, sin = self.rope.at(pos, limit)
        else:
            cos, sin = self.rope.get(pos, rows)
        return apply_rope(q, cos, sin), gate, apply_rope(k, cos, sin), v

    def _moe_kernels(self, m: MoE, h, rp) -> bool:
        """The exact path's MoE as five launches (moe_add_norm): the fixed-order product on
        CUDA, bf16, and a shared expert as wide as the routed ones (so its pairs run in the
        experts' kernels)."""
        return (rp is not BATCH and self.exec.pad_rows == cuda_gemv.ROWS and cuda_moe.available(h.device)
                and cuda_gemv.usable(h, m.pre) and m.shared_inter == m.gu_all.shape[1] // 2)

    def moe_add_norm(self, m: MoE, h, x, norm_w, eps, before=None):
        """(x + moe(h), the next norm of it) in five launches: the router product (its split-K
        partials), the router (top K + the shared expert as slot K), gate/up + SwiGLU and down
        over every (row, slot) pair, and the combine with the residual add and the norm. Every
        program reads one row (or one pair), so nothing depends on the row count. before =
        (the mixer's output or its partials, the norm's weight): the residual add and the norm
        that make h, done in the router product's launch (cuda_fusions.NORM_ROUTER), h None."""
        e, si = m.n_experts, m.shared_inter
        router = m.pre[:e + 1 + (-(e + 1)) % 8]                 # router + shared gate rows, a view
        shared_gu = m.pre[e + 1:e + 1 + 2 * si]
        if (before is not None and cuda_fusions.ROUTE_CLUSTER and not cuda_fusions.STREAM_MOE
                and not cuda_fusions.MOE_TAIL and cuda_norm_route.fits(x, before[0], before[1], router, e, m.top_k)):
            # the router in the same launch: the gate/up launch right after it writes its input, so
            # the shared expert's programs wait too
            x, h, top_w, top_i = cuda_norm_route.add_norm_route(x, before[0], before[1], eps, router, e, m.top_k,
                                                                m.norm_topk)
            return cuda_moe.experts_add_norm(h, top_w, top_i, m.gu_all, m.down_all, shared_gu, m.shared_down, x,
                                             norm_w, eps, stream=False, shared_first=False)
        if before is not None:
            x, h, logits = cuda_norm_router.add_norm_router(x, before[0], before[1], eps, router)
        else:
            split = cuda_gemv.splits(*reversed(router.shape))
            logits = cuda_gemv.linear_rows(h, router, partials=split)   # split: the partials, summed by the router
        h = h.contiguous()
        # one answer for both: the router may let only the stream gate/up launch early (the Triton
        # gate/up's shared programs read h before their wait)
        stream = cuda_moe.stream_moe_runs(h, m.top_k + 1, m.gu_all, m.down_all, shared_gu, m.shared_down)
        top_w, top_i = cuda_moe.route_shared(logits, h.shape[0], e, m.top_k, m.norm_topk,
                                             early=stream and cuda_stream_moe.EARLY_ROUTE)
        return cuda_moe.experts_add_norm(h, top_w, top_i, m.gu_all, m.down_all, shared_gu, m.shared_down, x, norm_w,
                                         eps, stream=stream)

    def moe(self, m: MoE, h, lin, exact):
        exact = policy(exact)
        e, si = m.n_experts, m.shared_inter
        pre = lin(h, m.pre)                                     # [rows, E + 1 + 2*Is (+ zero rows to 8)]
        if exact is not BATCH and cuda_moe.available(h.device):
            # every step one program per row (router, shared SwiGLU) or per (row, slot) (experts):
            # ids stay on the device (no host sync, capturable); nothing depends on the row count
            top_w, top_i = cuda_moe.route(pre, e, m.top_k, m.norm_topk)
            shared = lin(cuda_moe.silu_mul(pre, e + 1, si), m.shared_down)
            return cuda_moe.routed_experts(h, top_w, top_i, m.gu_all, m.down_all, extra=shared,
                                           extra_gate=pre[:, e:e + 1])

        def route(logits):                                      # [rows, E] -> weights, ids [rows, top_k]
            probs = torch.softmax(logits.float(), dim=-1)
            top_w, top_i = torch.topk(probs, m.top_k, dim=-1)
            if m.norm_topk:
                top_w = top_w / top_w.sum(dim=-1, keepdim=True)
            return top_w, top_i

        top_w, top_i = exact.reduce(route, pre[:, :e])
        shared = lin(silu_mul(pre[:, e + 1:e + 1 + si], pre[:, e + 1 + si:e + 1 + 2 * si], exact), m.shared_down)
        gated = rowwise(torch.sigmoid, pre[:, e:e + 1], exact=exact) * shared
        if exact is BATCH and h.is_cuda and h.shape[0] > EXACT_ROWS:
            # a prompt: each expert's rows in one product, its weights read once (the per-pair
            # kernels below read an expert's weights once per row). A few rows (the MTP head's
            # draft rows) keep the per-pair kernels: the same bytes, fewer launches
            return grouped_moe.routed_experts(h, top_w, top_i, m.gu_all, m.down_all) + gated
        if isinstance(exact, Padded) or cuda_moe.available(h.device):
            # expert ids stay on the device: no host sync, capturable, one program per (row, slot)
            return cuda_moe.routed_experts(h, top_w, top_i, m.gu_all, m.down_all, extra=gated)
        out = torch.zeros_like(h)
        # Experts in ascending id, each adding into its rows: a row's sum order is its
        # own experts' order, whatever the other rows routed to.
        hit = torch.unique(top_i)
        for ex in hit.tolist():
            rr, slot = torch.where(top_i == ex)
            gu = lin(h[rr], m.experts_gu[ex])
            inter = gu.shape[1] // 2
            y = lin(silu_mul(gu[:, :inter], gu[:, inter:], exact), m.experts_down[ex])
            out[rr] += y * top_w[rr, slot, None]   # rr are distinct; index_add_ is slow with 2 threads
        return out + gated

    def dense(self, m: DenseMLP, h, lin, exact):
        inter = m.gu.shape[0] // 2
        gu = lin(h, m.gu)
        return lin(silu_mul(gu[:, :inter], gu[:, inter:], exact), m.down)

