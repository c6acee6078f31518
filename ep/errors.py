"""Errors raised by `ep`: model loading and execution."""


class EpError(Exception):
    """Base class for every error raised by `ep`."""


class ModelLoadError(EpError):
    """A model file is missing, is not ONNX, or does not fit the signals the config declares."""
