"""Train verispec's bundled default model: a small Qwen3-Next (Gated DeltaNet + gated attention
3:1, MoE with a shared expert, tied embeddings) with an MTP head, on the Python stdlib.

Two modes:

* ``train`` runs ON THE GPU machine (``run`` tool, python3 with torch + transformers, no
  network); it reads ``.devcarry/{train,heldout}.npy`` (from ``tools/make_corpus.py``), trains
  for a wall-clock budget, evaluates, and writes the weights in the in-memory layout
  (``raw-*.safetensors``, bf16, each < 16 MiB), ``raw-config.json`` and ``train-log.json`` to
  ``--out``. ``--probe N`` runs N steps per variant and prints timings instead.
* ``pack`` runs here: it turns the raw files into the release directory
  ``verispec/data/default_model/`` (backbone via ``save_pretrained``, ``mtp.*`` added in the
  release layout with one tensor per expert, shards of at most 16 MiB with an index).

The MTP head (DESIGN.md section 3) as trained here, for pair p = (h_p, x_{p+1}):
  e = pre_fc_norm_embedding(embed(x_{p+1})); h = pre_fc_norm_hidden(h_p)   # h_p after model.norm
  u = fc(cat([e, h]))                                   # fc: [H, 2H], embedding half first
  u = Qwen3NextDecoderLayer(full attention)(u)          # causal over pairs, RoPE position p+1
  logits = lm_head(mtp.norm(u))                         # target x_{p+2}
A second-depth loss feeds out_p = mtp.norm(u_p) (not detached) with x_{p+2}, target x_{p+3},
at RoPE position p+2, attending to the depth-1 rows 0..p and to itself -- the rows the
engine's head KV cache holds when it drafts at depth 2.

Train:  python3 tools/train_default_model.py train --data .devcarry --out $OUT --minutes 7
Probe:  python3 tools/train_default_model.py train --data .devcarry --out $OUT --probe 30
CPU check (here):  python tools/train_default_model.py train --tiny --device cpu --probe 3 --out /tmp/t
Pack:   python tools/train_default_model.py pack --raw <dir with raw-*> --dest verispec/data/default_model
Plot:   python tools/train_default_model.py plot --log verispec/data/default_model/train-log.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

EOT_ID = 0  # <|endoftext|>, id 0 in tools/make_corpus.py's tokenizer
SEED = 1234


# ----------------------------------------------------------------------------- model config
def model_config(tiny: bool = False):
    from transformers import Qwen3NextConfig

    H, L = (64, 4) if tiny else (256, 8)
    kw = dict(
        vocab_size=8192, hidden_size=H, num_hidden_layers=L,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
        num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4,
        linear_num_key_heads=4, linear_key_head_dim=H // 4,
        linear_num_value_heads=8, linear_value_head_dim=H // 4, linear_conv_kernel_dim=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=H // 2,
        shared_expert_intermediate_size=H, intermediate_size=4 * H, decoder_sparse_step=1,
        norm_topk_prob=True, tie_word_embeddings=True, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        rms_norm_eps=1e-6, initializer_range=0.02, hidden_act="silu",
        bos_token_id=EOT_ID, eos_token_id=EOT_ID, pad_token_id=None,
    )
    return Qwen3NextConfig(**kw)


# ------------------------------------------------- gated delta rule, chunked (training path)
def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """transformers' torch fallback (5.24: triangular solve, fp32), copied so every version
    trains with the same math; q/k [B, S, Hk, Dk], v [B, S, Hv, Dv], g/beta [B, S, Hv]."""
    chunk_gated_delta_rule.calls += 1
    in_dtype = query.dtype
    B, S, Hk, Dk = key.shape
    Hv, Dv = value.shape[-2:]
    if Hk != Hv:
        query = query.repeat_interleave(Hv // Hk, dim=2)
        key = key.repeat_interleave(Hv // Hk, dim=2)
    q, k, v, beta, g = (x.transpose(1, 2).float().contiguous() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * Dk**-0.5
    pad = (chunk_size - S % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    C = (S + pad) // chunk_size
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(B, Hv, C, chunk_size, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    cum = g.reshape(B, Hv, C, chunk_size).cumsum(-1)                      # [B, Hv, C, c]
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    ut = (k_beta @ k.transpose(-1, -2)) * decay                           # [B, Hv, C, c, c]
    intra = (q @ k.transpose(-1, -2)) * decay
    new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(ut, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    state = (torch.zeros(B, Hv, Dk, Dv, device=q.device) if initial_state is None
             else initial_state.to(new_v))
    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]
    outs = []
    for i in range(C):
        v_new = new_v[:, :, i] - k_cum[:, :, i] @ state
        outs.append(q[:, :, i] @ state + intra[:, :, i] @ v_new)
        state = state * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    out = torch.stack(outs, 2).reshape(B, Hv, -1, Dv)[:, :, :S]
    return out.transpose(1, 2).to(in_dtype).contiguous(), (state if output_final_state else None)


chunk_gated_delta_rule.calls = 0


def patch_gated_delta_rule(model) -> None:
    import transformers.models.qwen3_next.modeling_qwen3_next as m

    m.torch_chunk_gated_delta_rule = chunk_gated_delta_rule
    if hasattr(m, "chunk_gated_delta_rule"):
        m.chunk_gated_delta_rule = chunk_gated_delta_rule
    for mod in model.modules():
        if hasattr(mod, "chunk_gated_delta_rule"):
            mod.chunk_gated_delta_rule = chunk_gated_delta_rule


# ------------------------------------------------------------------------------ MTP head
class MTPHead(nn.Module):
    """Parameter names are the release layout's minus the ``mtp.`` prefix."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRMSNorm

        H, eps = config.hidden_size, config.rms_norm_eps
        cfg = copy.deepcopy(config)
        cfg.layer_types = ["full_attention"] + list(cfg.layer_types[1:])
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(H, eps=eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(cfg, layer_idx=0)])
        assert self.layers[0].block_type == "full_attention"
        self.norm = Qwen3NextRMSNorm(H, eps=eps)
        std = config.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.zeros_(p)          # zero-centred RMSNorm: (1 + w)
            else:
                nn.init.normal_(p, std=std)

    def embed_pairs(self, hidden, next_emb):
        """hidden [B, n, H] (post model.norm), next_emb [B, n, H] -> fc input rows [B, n, H]."""
        e = self.pre_fc_norm_embedding(next_emb)
        h = self.pre_fc_norm_hidden(hidden)
        return self.fc(torch.cat([e, h], dim=-1))

    def run_layer(self, u, position_embeddings, attention_mask=None):
        out = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=attention_mask)
        out = out[0] if isinstance(out, tuple) else out
        return self.norm(out)


def depth2_mask(n: int, device) -> torch.Tensor:
    """[1, 1, 2n, 2n] bool, True = attend. Rows 0..n-1: depth-1 pairs, causal. Row n+p: the
    depth-2 row of pair p, attending to depth-1 rows 0..p and to itself."""
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=device)
    top = torch.cat([causal, torch.zeros_like(causal)], 1)
    bottom = torch.cat([causal, eye], 1)
    return torch.cat([top, bottom], 0)[None, None]


def forward_losses(model, mtp, ids, depth2: bool = True, aux=None):
    """ids [B, T] -> dict of mean CE losses (lm, mtp1, mtp2) and greedy agreement counts."""
    B, T = ids.shape
    base = model.model
    hidden = base(input_ids=ids).last_hidden_state                      # [B, T, H], after model.norm
    logits = model.lm_head(hidden[:, :-1])
    out = {"lm": F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())}
    n = T - 3 if depth2 else T - 2                                      # pairs p = 0..n-1
    emb = base.embed_tokens(ids)
    u1 = mtp.embed_pairs(hidden[:, :n], emb[:, 1:n + 1])
    pos1 = torch.arange(1, n + 1, device=ids.device)[None].expand(B, n)
    out1 = mtp.run_layer(u1, base.rotary_emb(u1, pos1))
    logits1 = model.lm_head(out1)
    out["mtp1"] = F.cross_entropy(logits1.float().flatten(0, 1), ids[:, 2:n + 2].flatten())
    with torch.no_grad():  # teacher-forced agreement of draft 1 with the LM's own greedy pick at p+1
        out["agree1"] = (logits1.argmax(-1) == logits[:, 1:n + 1].argmax(-1)).float().mean()
    if depth2:
        u2 = mtp.embed_pairs(out1, emb[:, 2:n + 2])
        pos2 = torch.cat([pos1, pos1 + 1], 1)
        uu = torch.cat([u1, u2], 1)
        out2 = mtp.run_layer(uu, base.rotary_emb(uu, pos2), depth2_mask(n, ids.device))[:, n:]
        logits2 = model.lm_head(out2)
        out["mtp2"] = F.cross_entropy(logits2.float().flatten(0, 1), ids[:, 3:n + 3].flatten())
    return out


class RouterAux:
    """Switch-style load-balancing loss over every router (backbone and MTP), via hooks."""

    def __init__(self, model, top_k: int):
        self.top_k, self.logits = top_k, []
        for name, mod in model.named_modules():
            if name.endswith("mlp.gate"):
                mod.register_forward_hook(self._hook)

    def _hook(self, mod, inp, out):
        self.logits.append(out[0] if isinstance(out, tuple) else out)

    def pop(self):
        losses = []
        for lg in self.logits:
            p = lg.float().softmax(-1)                                    # [N, E]
            E = p.shape[-1]
            chosen = F.one_hot(p.topk(self.top_k, -1).indices, E).sum(1).float()
            losses.append(E * (chosen.mean(0) * p.mean(0)).sum() / self.top_k)
        self.logits = []
        return torch.stack(losses).mean() if losses else torch.zeros(())


# ------------------------------------------------------------------------------ training
def build(tiny: bool, device, experts_impl: str | None, final_norm_spread: float = 0.0,
          freeze_final_norm: bool = False):
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(SEED)
    config = model_config(tiny)
    if experts_impl:
        config._experts_implementation = experts_impl
    model = Qwen3NextForCausalLM(config)
    mtp = MTPHead(model.config)
    if final_norm_spread:
        # A final norm with per-channel scales (as real checkpoints have) is what makes the head's
        # wiring matter: read before the norm, the head misses those scales (issue 7's margin test).
        g = torch.Generator().manual_seed(SEED + 1)
        scale = torch.exp(final_norm_spread * torch.randn(config.hidden_size, generator=g))
        with torch.no_grad():
            model.model.norm.weight.copy_(scale - 1.0)     # zero-centred RMSNorm: (1 + w)
    if freeze_final_norm:
        # training shrinks a learned spread (0.6 -> 0.31 in log-std in 7 minutes): keep the scales as drawn
        model.model.norm.weight.requires_grad_(False)
    patch_gated_delta_rule(model)
    return model.to(device), mtp.to(device)


def param_groups(modules, wd):
    decay, no_decay, seen = [], [], set()
    for mod in modules:
        for name, p in mod.named_parameters():
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            (decay if p.ndim >= 2 and "norm" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model, mtp, tokens, seq, batch, device, autocast, max_windows=None):
    """Mean losses over non-overlapping windows of `tokens` (1-D int64 tensor on device)."""
    model.eval(), mtp.eval()
    n_win = tokens.numel() // seq
    if max_windows:
        n_win = min(n_win, max_windows)
    wins = tokens[: n_win * seq].view(n_win, seq)
    sums, count = {}, 0
    for i in range(0, n_win, batch):
        ids = wins[i:i + batch]
        with autocast():
            d1 = forward_losses(model, mtp, ids, depth2=False)   # depth 1 over pairs 0..T-3
            d2 = forward_losses(model, mtp, ids, depth2=True)
        vals = {"lm": d1["lm"], "mtp1": d1["mtp1"], "agree1": d1["agree1"], "mtp2": d2["mtp2"]}
        for k, v in vals.items():
            sums[k] = sums.get(k, 0.0) + float(v) * ids.shape[0]
        count += ids.shape[0]
    model.train(), mtp.train()
    return {k: v / count for k, v in sums.items()}


def save_raw(model, mtp, out: Path, log: dict, max_bytes: int = 15 * 2**20) -> None:
    from safetensors.torch import save_file

    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    sd.update({f"mtp.{k}": v for k, v in mtp.state_dict().items()})
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        t = sd[k].detach().to(torch.bfloat16).cpu().contiguous()
        if cur and size + t.numel() * 2 > max_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k], size = t, size + t.numel() * 2
    shards.append(cur)
    for i, sh in enumerate(shards):
        save_file(sh, str(out / f"raw-{i}.safetensors"), metadata={"format": "pt"})
    (out / "raw-config.json").write_text(model.config.to_json_string())
    (out / "train-log.json").write_text(json.dumps(log, indent=1) + "\n")


def train(args) -> None:
    import transformers

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__} transformers {transformers.__version__} "
          f"device {torch.cuda.get_device_name() if cuda else 'cpu'}", flush=True)
    data = Path(args.data)
    train_ids = torch.from_numpy(np.load(data / "train.npy").astype(np.int64))
    held_ids = torch.from_numpy(np.load(data / "heldout.npy").astype(np.int64)).to(device)
    n_val = 2**18 if not args.tiny else 4096           # the train stream's tail: validation only
    val_ids, train_ids = train_ids[-n_val:].to(device), train_ids[:-n_val].to(device)
    variants = args.experts.split(",")
    for variant in variants:
        if len(variants) == 1:
            run(args, variant, device, train_ids, val_ids, held_ids, out)
            continue
        try:  # comparing variants (a probe): report a failing one and try the next
            run(args, variant, device, train_ids, val_ids, held_ids, out)
        except Exception as e:
            print(f"experts={variant} FAILED: {type(e).__name__}: {e}", flush=True)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def run(args, variant, device, train_ids, val_ids, held_ids, out: Path) -> None:
    import transformers

    cuda = device.type == "cuda"
    seq, batch = args.seq, args.batch
    gen = torch.Generator(device=device).manual_seed(SEED)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    model, mtp = build(args.tiny, device, None if variant == "default" else variant, args.final_norm_spread,
                       args.freeze_final_norm)
    moe = [f"{k} {tuple(v.shape)}" for k, v in model.state_dict().items() if k.startswith("model.layers.0.mlp.")]
    print("layer-0 mlp tensors:", "; ".join(moe), flush=True)
    n_model = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"experts={variant} ({model.config._experts_implementation}) params: backbone {n_model} "
          f"mtp {n_mtp} total {n_model + n_mtp} (bf16 {2 * (n_model + n_mtp) / 1e6:.2f} MB)", flush=True)
    aux = RouterAux(nn.ModuleList([model, mtp]), model.config.num_experts_per_tok)
    opt = torch.optim.AdamW(param_groups([model, mtp], args.wd), lr=args.lr, betas=(0.9, 0.95), fused=cuda)
    params = [p for g in opt.param_groups for p in g["params"]]
    log = {"args": vars(args), "seed": SEED, "steps": [], "evals": [], "torch": torch.__version__,
           "transformers": transformers.__version__, "params": {"backbone": n_model, "mtp": n_mtp}}
    budget, best = args.minutes * 60.0, None
    step, next_eval, t0 = 0, args.eval_every, time.time()
    while True:
        elapsed = time.time() - t0
        if (args.probe and step >= args.probe) or (not args.probe and elapsed >= budget):
            break
        # linear warm-up by step, cosine to 10% of the peak by wall-clock fraction (stop by time)
        frac = min(elapsed / budget, 1.0)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train_ids.numel() - seq, (batch,), device=device, generator=gen)
        ids = train_ids[starts[:, None] + torch.arange(seq, device=device)]              # [B, T]
        with autocast():
            losses = forward_losses(model, mtp, ids, depth2=True)
            a = aux.pop()
            loss = losses["lm"] + args.lam1 * losses["mtp1"] + args.lam2 * losses["mtp2"] + args.aux * a
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step <= 3 or args.probe:
            sync()
            rec = {"step": step, "t": round(time.time() - t0, 2), "lr": lr, "gnorm": round(float(gnorm), 4),
                   "aux": round(float(a.detach()), 4), **{k: round(float(v), 4) for k, v in losses.items()}}
            log["steps"].append(rec)
            print(json.dumps(rec), flush=True)
        if not args.probe and time.time() - t0 >= next_eval:
            next_eval += args.eval_every
            ev = evaluate(model, mtp, val_ids, seq, batch, device, autocast, max_windows=64)
            ev.update(step=step, t=round(time.time() - t0, 1))
            log["evals"].append(ev)
            print("val", json.dumps(ev), flush=True)
            if best is None or ev["lm"] < best[0]:   # keep the best weights in case of over-fitting
                best = (ev["lm"], step, [{k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
                                         for m in (model, mtp)])
    sync()
    wall = time.time() - t0
    log.update(train_wall_s=round(wall, 1), steps_done=step, tokens_seen=step * batch * seq)
    print(f"experts={variant}: {step} steps in {wall:.1f}s ({wall / max(step, 1) * 1000:.0f} ms/step, "
          f"{step * batch * seq / wall:.0f} tok/s) gdn calls {chunk_gated_delta_rule.calls}", flush=True)
    if cuda:
        print(f"max memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    if args.probe and "," in args.experts:
        return
    t1 = time.time()
    last = evaluate(model, mtp, val_ids, seq, batch, device, autocast, max_windows=64)
    log["last_val64"] = last
    if best is not None and best[0] < last["lm"]:
        print(f"restoring the weights of step {best[1]} (val lm {best[0]:.4f} < {last['lm']:.4f})", flush=True)
        for m, sd in zip((model, mtp), best[2]):
            m.load_state_dict(sd)
        log["restored_step"] = best[1]
    log["final_val"] = evaluate(model, mtp, val_ids, seq, batch, device, autocast)
    log["heldout"] = evaluate(model, mtp, held_ids, seq, batch, device, autocast)
    log["eval_wall_s"] = round(time.time() - t1, 1)
    print("final val", json.dumps(log["final_val"]), flush=True)
    print("heldout", json.dumps(log["heldout"]), flush=True)
    save_raw(model, mtp, out, log)
    print(f"saved to {out}: {sorted(os.listdir(out))}", flush=True)


# ------------------------------------------------------------------------------- packing
def pack(args) -> None:
    """raw-*.safetensors (in-memory names) -> release directory (save_pretrained + mtp.*)."""
    import tempfile

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    raw, dest = Path(args.raw), Path(args.dest)
    sd = {}
    for f in sorted(raw.glob("raw-*.safetensors")):
        sd.update(load_file(str(f)))
    config = Qwen3NextConfig.from_dict(json.loads((raw / "raw-config.json").read_text()))
    config.bos_token_id = config.eos_token_id = EOT_ID
    mtp_sd = {k: v for k, v in sd.items() if k.startswith("mtp.")}
    backbone = {k: v for k, v in sd.items() if not k.startswith("mtp.")}
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(backbone, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(str(f), "pt") as fh:
                tensors.update({k: fh.get_tensor(k) for k in fh.keys()})
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        gen_cfg = json.loads((Path(tmp) / "generation_config.json").read_text())
    names = set(tensors)
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in names, sorted(names)[:20]
    assert not any("gate_up_proj" in k for k in names)
    # mtp.*: the decoder layer's fused experts -> one tensor per expert, as save_pretrained does.
    for k, v in mtp_sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):              # [E, 2I, H]: gate rows first
            pre = k[: -len("gate_up_proj")]
            gate, up = v.chunk(2, dim=1)
            for e in range(v.shape[0]):
                tensors[f"{pre}{e}.gate_proj.weight"] = gate[e].contiguous()
                tensors[f"{pre}{e}.up_proj.weight"] = up[e].contiguous()
        elif k.endswith("mlp.experts.down_proj"):               # [E, H, I]
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                tensors[f"{pre}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            tensors[k] = v.contiguous()
    # The MTP layer's names must be the backbone's full-attention layer's names.
    full = config.layer_types.index("full_attention")
    want = {k.replace(f"model.layers.{full}.", "mtp.layers.0.") for k in names if k.startswith(f"model.layers.{full}.")}
    have = {k for k in tensors if k.startswith("mtp.layers.0.")}
    assert want == have, (want ^ have)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("model*.safetensors*"):
        old.unlink()
    shards, cur, size, limit = [], [], 0, 16 * 2**20 - 2**16
    for k in sorted(tensors):
        nbytes = tensors[k].numel() * tensors[k].element_size()
        if cur and size + nbytes > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += nbytes
    shards.append(cur)
    weight_map, total = {}, 0
    for i, keys in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, str(dest / fname), metadata={"format": "pt"})
        assert (dest / fname).stat().st_size <= 16 * 2**20
        for k in keys:
            weight_map[k] = fname
            total += tensors[k].numel() * tensors[k].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg["num_nextn_predict_layers"] = 1
    cfg["bos_token_id"] = cfg["eos_token_id"] = EOT_ID
    (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen_cfg.update(bos_token_id=EOT_ID, eos_token_id=EOT_ID, pad_token_id=EOT_ID)
    (dest / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2, sort_keys=True) + "\n")
    print(f"packed {len(tensors)} tensors ({total / 1e6:.2f} MB) into {len(shards)} shards in {dest}")


def plot(args) -> None:
    """Loss curve PNG from train-log.json (training losses every 10 steps, validation evals)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = json.loads(Path(args.log).read_text())
    steps = log["steps"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    x = [r["step"] for r in steps]
    for key, label in (("lm", "LM"), ("mtp1", "MTP depth 1"), ("mtp2", "MTP depth 2")):
        y = np.array([r[key] for r in steps])
        k = min(9, len(y))
        smooth = np.convolve(y, np.ones(k) / k, mode="valid")  # running mean over 90 steps
        ax.plot(x[k - 1:], smooth, label=f"train {label}")
    ev = log["evals"]
    for key, label, m in (("lm", "LM", "o"), ("mtp1", "MTP depth 1", "s")):
        ax.plot([e["step"] for e in ev], [e[key] for e in ev], m + "--", label=f"validation {label}")
    ax.set_xlabel(f"step (batch {log['args']['batch']} x {log['args']['seq']} tokens; "
                  f"{log['train_wall_s']:.0f} s on one H200)")
    ax.set_ylabel("cross entropy (nats/token)")
    ax.set_ylim(1.0, 5.0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("verispec default model: Qwen3-Next 15M (8 layers, MTP head), Python stdlib")
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"wrote {args.png}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", default=".devcarry")
    t.add_argument("--out", default=os.environ.get("OUT", "out"))
    t.add_argument("--device", default="cuda")
    t.add_argument("--tiny", action="store_true", help="tiny shapes, for a CPU check")
    t.add_argument("--minutes", type=float, default=7.0, help="training wall-clock budget")
    t.add_argument("--probe", type=int, default=0, help="run this many steps per variant, then stop")
    t.add_argument("--experts", default="default", help="comma list: default, grouped_mm, batched_mm, eager")
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--wd", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--lam1", type=float, default=0.5, help="weight of the depth-1 MTP loss")
    t.add_argument("--lam2", type=float, default=0.25, help="weight of the depth-2 MTP loss")
    t.add_argument("--aux", type=float, default=0.01, help="weight of the router balance loss")
    t.add_argument("--eval-every", type=float, default=60.0, help="seconds between validation evals")
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--final-norm-spread", type=float, default=1.0,
                   help="sigma of the log-normal per-channel init of the final norm's scales (0: all 1)")
    t.add_argument("--freeze-final-norm", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the final norm's scales as initialised (default on, as the shipped model)")
    p = sub.add_parser("pack")
    p.add_argument("--raw", required=True)
    p.add_argument("--dest", default=str(Path(__file__).resolve().parent.parent / "verispec/data/default_model"))
    q = sub.add_parser("plot")
    q.add_argument("--log", required=True)
    q.add_argument("--png", default="docs/default-model-loss.png")
    args = ap.parse_args()
    {"train": train, "pack": pack, "plot": plot}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
