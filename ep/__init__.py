"""The SITS execution layer over ONNX Runtime: sessions, model artifacts (weight container, manifest),
and `ep.compile` (imported on its own: it needs onnx and ml_dtypes, the runtime side does not)."""
from .artifact import ArtifactError, Manifest, artifact_sha256, load_artifact, resolve_model
from .container import ContainerError, ContainerInfo, read_container, write_container
from .errors import EpError, ModelLoadError
from .session import ModelRunner, sha256_file

__all__ = ["ArtifactError", "ContainerError", "ContainerInfo", "EpError", "Manifest", "ModelLoadError",
           "ModelRunner", "artifact_sha256", "load_artifact", "read_container", "resolve_model", "sha256_file",
           "write_container"]
