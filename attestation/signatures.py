"""Detached signatures of deployable files (WASM modules, configs, models) by the offline authority key.

The authority that approves PCR states (`attestation.tpm.policy`) also signs single files: `FILE.sig`
next to `FILE` is a small JSON document naming the file's kind, name and SHA-256 and the authority's
key id, with an ECDSA P-256 signature (r||s hex) over

    SHA-256("sits2026/signature/v1" 0 || kind 0 || name 0 || sha256)

A signature made for one kind never passes as another (a signed config is not a signed module), and
the name keeps a signed `pre_filter.wat` from being presented as another module's file.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from .errors import AttestationError
from .tpm.policy import authority_id

SIGNATURE_FORMAT = "sits-signature"
SIGNATURE_SUFFIX = ".sig"
KINDS = ("module", "config", "model")
_LABEL = b"sits2026/signature/v1\0"
_P256 = 32
_KIND_BY_SUFFIX = {".wat": "module", ".wasm": "module", ".yaml": "config", ".yml": "config", ".onnx": "model"}


class SignatureError(AttestationError):
    """A file whose detached signature is missing or does not check out. `code`: missing, format, kind,
    name, digest (the file changed since it was signed), authority (signed by another key), signature."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def signature_path(path: Path) -> Path:
    """Where the detached signature of `path` lives: `path` + ".sig" (for a directory: next to it)."""
    path = Path(path)
    return path.with_name(path.name + SIGNATURE_SUFFIX)


def kind_of(path: Path) -> str:
    """module (.wat/.wasm), config (.yaml/.yml) or model (.onnx, or an artifact directory)."""
    path = Path(path)
    if path.is_dir():
        return "model"
    kind = _KIND_BY_SUFFIX.get(path.suffix.lower())
    if kind is None:
        raise SignatureError(f"{path}: cannot tell what it is from its suffix (.wat/.wasm module, .yaml/.yml "
                             "config, .onnx model or an artifact directory); pass the kind", "kind")
    return kind


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise SignatureError(f"{path}: cannot read it ({exc.strerror})", "digest") from None
    return h.hexdigest()


def _message(kind: str, name: str, sha256: str) -> bytes:
    return _LABEL + kind.encode() + b"\0" + name.encode() + b"\0" + bytes.fromhex(sha256)


@dataclass(frozen=True, slots=True)
class DetachedSignature:
    kind: str
    name: str
    sha256: str
    authority_id: str
    signature: str  # ECDSA P-256 over SHA-256(_message(...)), r||s hex
    format: str = SIGNATURE_FORMAT
    version: int = 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "signature") -> "DetachedSignature":
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != SIGNATURE_FORMAT or data.get("version") != 1:
                raise ValueError(f"not a {SIGNATURE_FORMAT} version 1 file")
            sig = cls(**data)
            if sig.kind not in KINDS:
                raise ValueError(f"kind {sig.kind!r} is not one of {', '.join(KINDS)}")
            if not isinstance(sig.name, str) or not sig.name or "/" in sig.name:
                raise ValueError("name must be a file name")
            for f in ("sha256", "authority_id"):
                if len(bytes.fromhex(getattr(sig, f))) != 32:
                    raise ValueError(f"{f} must be 32 bytes of hex")
            if len(bytes.fromhex(sig.signature)) != 2 * _P256:
                raise ValueError("signature must be r||s (64 bytes hex)")
            return sig
        except (ValueError, TypeError, AttributeError) as exc:
            raise SignatureError(f"{where}: not a valid signature file ({exc}); make one with `sitsctl sign`",
                                 "format") from None


def sign(authority: ec.EllipticCurvePrivateKey, path: Path, kind: str | None = None,
         sha256: str | None = None) -> DetachedSignature:
    """The authority's signature of `path` (its bytes' SHA-256 unless `sha256` is given: a model
    artifact directory is named by its artifact SHA-256)."""
    path = Path(path)
    kind = kind or kind_of(path)
    if kind not in KINDS:
        raise SignatureError(f"kind {kind!r} is not one of {', '.join(KINDS)}", "kind")
    sha256 = sha256 or file_sha256(path)
    r, s = decode_dss_signature(authority.sign(_message(kind, path.name, sha256), ec.ECDSA(hashes.SHA256())))
    return DetachedSignature(kind, path.name, sha256, authority_id(authority.public_key()),
                             (r.to_bytes(_P256, "big") + s.to_bytes(_P256, "big")).hex())


def write(sig: DetachedSignature, path: Path) -> Path:
    out = signature_path(path)
    out.write_text(sig.to_json())
    return out


def load(path: Path) -> DetachedSignature:
    """The signature next to `path`; SignatureError(code missing) when there is none."""
    sig_path = signature_path(path)
    try:
        text = sig_path.read_text()
    except FileNotFoundError:
        raise SignatureError(f"{path}: no signature ({sig_path.name} is missing); sign it with "
                             f"`sitsctl sign --authority-key KEY.pem {Path(path).name}` on the signing host",
                             "missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SignatureError(f"{sig_path}: cannot read it ({exc})", "format") from None
    return DetachedSignature.from_json(text, str(sig_path))


def verify(authority: ec.EllipticCurvePublicKey, path: Path, kind: str | None = None,
           sha256: str | None = None) -> DetachedSignature:
    """Checks `path` against its detached signature: kind, name, SHA-256, authority, signature.
    `sha256`: the digest to check instead of the file bytes' (a model artifact's). Raises SignatureError."""
    path = Path(path)
    kind = kind or kind_of(path)
    sig = load(path)
    where = f"{path.name}"
    if sig.kind != kind:
        raise SignatureError(f"{where}: the signature is for a {sig.kind}, this file is used as a {kind}", "kind")
    if sig.name != path.name:
        raise SignatureError(f"{where}: the signature is for {sig.name!r}, not {path.name!r}", "name")
    expected = authority_id(authority)
    if sig.authority_id != expected:
        raise SignatureError(f"{where}: signed by authority {sig.authority_id[:16]}…, the trusted authority key is "
                             f"{expected[:16]}… (signed with another key)", "authority")
    actual = sha256 or file_sha256(path)
    if actual != sig.sha256:
        raise SignatureError(f"{where}: SHA-256 {actual[:16]}… is not the signed {sig.sha256[:16]}… (the file was "
                             "changed after it was signed)", "digest")
    raw = bytes.fromhex(sig.signature)
    der = encode_dss_signature(int.from_bytes(raw[:_P256], "big"), int.from_bytes(raw[_P256:], "big"))
    try:
        authority.verify(der, _message(sig.kind, sig.name, sig.sha256), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise SignatureError(f"{where}: the signature does not verify with the authority key (the signature "
                             "file was edited or forged)", "signature") from None
    return sig


__all__ = ["DetachedSignature", "KINDS", "SIGNATURE_SUFFIX", "SignatureError", "file_sha256", "kind_of", "load",
           "sign", "signature_path", "verify", "write"]
