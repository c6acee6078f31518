"""attestation.require_signatures in the daemon: which modules, configs and models must carry the
authority's signature (attestation.signatures), checked at startup, at each hot swap's stage step and
at each config reload. A model's signature is the authority's approval of it (attestation.approval)
or a detached `.sig` next to it.

off: nothing is checked. modules: every WASM module. all: modules, the model and the config file.
"""
from __future__ import annotations

from pathlib import Path

from attestation.signatures import SignatureError, file_sha256, verify

REQUIRED = {"off": (), "modules": ("module",), "all": ("module", "model", "config")}


class SignaturePolicy:
    def __init__(self, level: str, authority_key: Path | None, approval: Path | None = None) -> None:
        self.level = level
        self.kinds = REQUIRED[level]
        self.authority_path = authority_key
        self.approval_path = approval
        self._authority = None

    @classmethod
    def from_config(cls, cfg) -> "SignaturePolicy":
        a = cfg.attestation
        return cls(getattr(a, "require_signatures", "off"), a.authority_key, a.approval)

    def requires(self, kind: str) -> bool:
        return kind in self.kinds

    @property
    def authority(self):
        if self._authority is None:
            from attestation.tpm.policy import PolicyError, load_authority_public

            if self.authority_path is None:
                raise SignatureError(f"attestation.require_signatures is {self.level} but attestation.authority_key "
                                     "is not set: nothing to check signatures against", "authority")
            try:
                self._authority = load_authority_public(self.authority_path)
            except PolicyError as exc:
                raise SignatureError(str(exc), "authority") from None
        return self._authority

    def check(self, kind: str, path: Path, sha256: str | None = None) -> str:
        """'unchecked' when `kind` needs no signature, else 'signed' or (model) 'approved'; raises
        SignatureError for a missing or wrong signature of a kind that needs one."""
        if not self.requires(kind):
            return "unchecked"
        path = Path(path)
        if kind == "model":
            sha256 = sha256 or model_sha256(path)
            if self._approved(sha256):
                return "approved"
        try:
            verify(self.authority, path, kind, sha256)
        except SignatureError as exc:
            extra = " and attestation.approval does not approve this model" if kind == "model" else ""
            raise SignatureError(f"{kind} {path}: {exc.reason}{extra} (attestation.require_signatures: "
                                 f"{self.level})", exc.code) from None
        return "signed"

    def _approved(self, sha256: str) -> bool:
        if self.approval_path is None:
            return False
        from attestation.tpm.policy import Approval, PolicyError

        try:
            approval = Approval.load(self.approval_path)
            approval.verify(self.authority)
        except PolicyError:
            return False
        return approval.model_sha256 == sha256


def model_sha256(path: Path) -> str:
    """The model's SHA-256 as ep names it: the file's bytes, or an artifact directory's artifact SHA-256."""
    path = Path(path)
    if path.is_dir():
        from ep.artifact import resolve_model
        from ep.errors import ModelLoadError

        try:
            return resolve_model(path)[1].hex()
        except ModelLoadError as exc:
            raise SignatureError(str(exc), "digest") from None
    return file_sha256(path)


def check_startup(cfg, config_path: Path | None) -> dict:
    """What sitsd checks before it loads anything: {file: 'signed'|'approved'|'unchecked'}; raises
    StartupError naming the first file that needs a signature and lacks a good one."""
    from .errors import StartupError

    policy = SignaturePolicy.from_config(cfg)
    if policy.level == "off":
        return {}
    out = {}
    try:
        for m in cfg.modules:
            out[str(m.path)] = policy.check("module", m.path)
        if cfg.model.artifact is not None:
            out[str(cfg.model.artifact)] = policy.check("model", Path(cfg.model.artifact), cfg.model.sha256)
        elif policy.requires("model"):  # a streaming model built from its seed: no file carries a signature
            raise SignatureError("the streaming model is built from model.streaming.seed and has no file to sign; "
                                 "export and compile it (sitsctl compile --kv-cache-policy ...), point "
                                 "model.artifact at the artifact and approve or sign that", "missing")
        if policy.requires("config"):
            if config_path is None:
                raise SignatureError("attestation.require_signatures is all, but this daemon was not started from "
                                     "a config file whose signature could be checked", "missing")
            out[str(config_path)] = policy.check("config", Path(config_path))
    except SignatureError as exc:
        raise StartupError(f"refusing to start: {exc}\n  fix: sign it on the signing host (`sitsctl sign "
                           "--authority-key KEY.pem FILE`) and install FILE.sig next to it, or set "
                           "attestation.require_signatures: off for development") from None
    return out
