"""The SITS execution layer over ONNX Runtime: sessions (and, later, compile passes, FP8, KV tiers)."""
from .errors import EpError, ModelLoadError
from .session import ModelRunner, sha256_file

__all__ = ["EpError", "ModelLoadError", "ModelRunner", "sha256_file"]
