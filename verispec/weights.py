"""Read an HF checkpoint directory: config.json plus single or sharded safetensors.

Tensor names are kept as HF writes them. A Qwen3.5 release nests the text model as
`model.language_model.*` beside a vision tower; that prefix is folded to `model.*` and
the tower is skipped with one note line. `mtp.*` tensors are returned separately so the
MTP head can be left unread.
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import ModelFormatError

_NESTED_PREFIX = "model.language_model."
_VISION_PREFIXES = ("model.visual.", "visual.")


@dataclass
class Checkpoint:
    path: Path
    config: dict
    tensors: dict[str, torch.Tensor]      # backbone tensors, HF names
    mtp: dict[str, torch.Tensor]          # mtp.* tensors (empty when absent or unread)
    has_mtp: bool                         # the checkpoint holds an MTP head
    dtype_on_disk: str


def read_config(model_dir: Path) -> dict:
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise ModelFormatError(f"model directory {model_dir} does not exist")
    if not model_dir.is_dir():
        raise ModelFormatError(f"{model_dir} is not a directory")
    cfg_path = model_dir / "config.json"
    if not cfg_path.exists():
        raise ModelFormatError(f"{model_dir} has no config.json: not an HF model directory")
    if not cfg_path.is_file():
        raise ModelFormatError(f"{cfg_path} is not a file")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFormatError(f"{cfg_path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelFormatError(f"{cfg_path} is damaged: not a JSON object")
    return cfg


def _shard_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ModelFormatError(f"{index} is damaged: {e!r}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ModelFormatError(f"{index} is damaged: weight_map is not an object of tensor -> file name")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (model_dir / f).exists()]
        if missing:
            raise ModelFormatError(f"{model_dir}: shard(s) named in the index are missing: {', '.join(missing)}")
        return [model_dir / f for f in files]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise ModelFormatError(f"{model_dir} has no safetensors weights (model.safetensors or an index)")


def _check_safetensors(path: Path) -> None:
    """Catch a truncated or damaged file with a clear message before safetensors does."""
    size = path.stat().st_size
    if size < 8:
        raise ModelFormatError(f"{path} is truncated ({size} bytes)")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8:
            raise ModelFormatError(f"{path} is truncated or damaged (header claims {header_len} bytes)")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelFormatError(f"{path} is damaged: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path} is damaged: its header is not a JSON object")
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(x, int) for x in offsets)):
            raise ModelFormatError(f"{path} is damaged: tensor {name!r} has no valid data_offsets in its header")
        end = max(end, offsets[1])
    if 8 + header_len + end > size:
        raise ModelFormatError(
            f"{path} is truncated: {size} bytes on disk, {8 + header_len + end} expected"
        )


def _canonical_name(name: str) -> str | None:
    if name.startswith(_NESTED_PREFIX):
        return "model." + name[len(_NESTED_PREFIX):]
    if name.startswith(_VISION_PREFIXES):
        return None
    return name


def load_checkpoint(model_dir: str | Path, *, read_mtp: bool = True, dtype=torch.float32) -> Checkpoint:
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    files = _shard_files(model_dir)
    tensors: dict[str, torch.Tensor] = {}
    mtp: dict[str, torch.Tensor] = {}
    has_mtp = False
    skipped_vision = 0
    disk_dtype = ""
    for path in files:
        _check_safetensors(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                for raw in f.keys():
                    name = _canonical_name(raw)
                    if name is None:
                        skipped_vision += 1
                        continue
                    if name.startswith("mtp."):
                        has_mtp = True
                        if not read_mtp:
                            continue
                        target = mtp
                    else:
                        target = tensors
                    t = f.get_tensor(raw)
                    disk_dtype = disk_dtype or str(t.dtype).replace("torch.", "")
                    target[name] = t.to(dtype).contiguous()
        except ModelFormatError:
            raise
        except Exception as e:  # safetensors raises its own error types
            raise ModelFormatError(f"{path} could not be read: {e}") from None
    if skipped_vision:
        print(f"[verispec] note: {skipped_vision} vision-tower tensors ignored (text model only)", file=sys.stderr)
    return Checkpoint(model_dir, config, tensors, mtp, has_mtp, disk_dtype)
