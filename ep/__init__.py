"""The SITS execution layer over ONNX Runtime: sessions, model artifacts (weight container, manifest),
and `ep.compile` (imported on its own: it needs onnx and ml_dtypes, the runtime side does not).
`ep.streaming` (the streaming transformer and its stream pool) and `ep.kv` (KV tiers) are imported
on their own too: building the streaming graph needs onnx."""
from .artifact import ArtifactError, Manifest, artifact_sha256, load_artifact, resolve_model
from .container import ContainerError, ContainerInfo, read_container, write_container
from .errors import EpError, ModelLoadError
from .providers import ProviderChoice, choose_provider
from .session import Binding, ModelRunner, Session, sha256_file

__all__ = ["ArtifactError", "Binding", "ContainerError", "ContainerInfo", "EpError", "Manifest", "ModelLoadError",
           "ModelRunner", "ProviderChoice", "Session", "artifact_sha256", "choose_provider", "load_artifact",
           "read_container", "resolve_model", "sha256_file", "write_container"]
