"""Model families, registered by config.json's model_type."""

from .qwen3_next import FAMILIES, ForwardOut, Model, ModelArgs

__all__ = ["FAMILIES", "ForwardOut", "Model", "ModelArgs"]
