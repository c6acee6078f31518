"""Errors raised by `ep`: model loading and execution."""


class EpError(Exception):
    """Base class for every error raised by `ep`."""


class ModelLoadError(EpError):
    """A model file is missing, is not ONNX, or does not fit the signals the config declares."""


class CompileError(EpError):
    """`sitsctl compile` cannot proceed: missing or non-ONNX input, bad calibration data, an
    unsupported target or a pass that failed; the message says which and what to do."""


class KvError(EpError):
    """KV state that cannot be encoded, stored, found or recovered; the message names the stream, the
    page or the slot (and the file) at fault."""
