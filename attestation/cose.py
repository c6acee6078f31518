"""COSE_Sign1 (RFC 9052 §4) with ES256 and EdDSA (RFC 9053 §2): strict CBOR decoding, the
Sig_structure, signature conversion and verification. Knows nothing of commands; the envelope does.
"""
from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cbor2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from .errors import EnvelopeError

TAG_SIGN1 = 18
HDR_ALG, HDR_CRIT, HDR_CONTENT_TYPE, HDR_KID = 1, 2, 3, 4
ALG_ES256 = -7
ALG_EDDSA = -8  # RFC 9053's polymorphic EdDSA; with an Ed25519 key, as RFC 9053 §2.2 allows
SIGNATURE_SIZES = {ALG_ES256: 64, ALG_EDDSA: 64}
_P256_COORD = 32
_UNDERSTOOD = frozenset({HDR_ALG, HDR_CRIT, HDR_CONTENT_TYPE, HDR_KID})
_SIGNATURE1 = "Signature1"
_SIGN1_HEAD = b"\xd2"  # tag 18 in its one-byte (preferred) form


@dataclass(frozen=True, slots=True)
class Sign1:
    """A decoded COSE_Sign1; `protected` keeps the bytes as sent, since the signature covers those."""

    protected: bytes
    protected_headers: Mapping[Any, Any]
    unprotected_headers: Mapping[Any, Any]
    payload: bytes
    signature: bytes

    def header(self, label: int) -> Any:
        """A header from either bucket (a label may be in only one); None when absent."""
        if label in self.protected_headers:
            return self.protected_headers[label]
        return self.unprotected_headers.get(label)

    def to_be_signed(self, external_aad: bytes = b"") -> bytes:
        return sig_structure(self.protected, self.payload, external_aad)


# --- encoding -------------------------------------------------------------------------------

def encode_protected(headers: Mapping[Any, Any]) -> bytes:
    """The protected bucket as its bstr content; an empty one is h'' (RFC 9052 §3), never h'a0'."""
    return cbor2.dumps(dict(headers)) if headers else b""


def sig_structure(protected: bytes, payload: bytes, external_aad: bytes = b"") -> bytes:
    """The bytes an ES256 or EdDSA key signs: ["Signature1", protected, external_aad, payload]."""
    return cbor2.dumps([_SIGNATURE1, bytes(protected), bytes(external_aad), bytes(payload)])


def encode_sign1(protected: bytes, payload: bytes, signature: bytes,
                 unprotected: Mapping[Any, Any] | None = None) -> bytes:
    return cbor2.dumps(cbor2.CBORTag(TAG_SIGN1, [bytes(protected), dict(unprotected or {}),
                                                bytes(payload), bytes(signature)]))


def es256_signature(r: int, s: int) -> bytes:
    """ES256 wants r and s as two 32-byte big-endian integers (RFC 9053 §2.1), not DER."""
    return r.to_bytes(_P256_COORD, "big") + s.to_bytes(_P256_COORD, "big")


def es256_from_der(der: bytes) -> bytes:
    """Converts what `cryptography` signs (DER) to the COSE form."""
    return es256_signature(*decode_dss_signature(der))


# --- strict decoding -------------------------------------------------------------------------

class _TagPolicy(Mapping):
    """Claims every tag as a semantic decoder, so cbor2 never turns a hostile tag into a datetime,
    bignum or shared reference; only the allowed tags come through, as CBORTag. `hook` is the
    same rule for cbor2's tag_hook, in case a tag ever reaches it instead."""

    def __init__(self, allowed: frozenset[int]) -> None:
        self._allowed = allowed

    def __getitem__(self, tag: int):
        return lambda value, _immutable=False: self._admit(tag, value)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def hook(self, tag: cbor2.CBORTag, _immutable: bool = False) -> cbor2.CBORTag:
        return self._admit(tag.tag, tag.value)

    def _admit(self, tag: int, value: Any) -> cbor2.CBORTag:
        if tag not in self._allowed:
            raise ValueError(f"CBOR tag {tag} is not allowed here")
        return cbor2.CBORTag(tag, value)


_NO_TAGS = _TagPolicy(frozenset())
_SIGN1_TAG_ONLY = _TagPolicy(frozenset({TAG_SIGN1}))


def loads_strict(data: bytes, what: str, *, max_depth: int = 8, allow_sign1_tag: bool = False) -> Any:
    """Decode exactly one CBOR item: definite lengths, no duplicate map keys, no tags (but 18 where
    allowed), nothing after it. Any failure is EnvelopeError('malformed') naming `what`."""
    tags = _SIGN1_TAG_ONLY if allow_sign1_tag else _NO_TAGS
    decoder = cbor2.CBORDecoder(io.BytesIO(data), semantic_decoders=tags, tag_hook=tags.hook, max_depth=max_depth,
                                allow_indefinite=False, allow_duplicate_keys=False)
    try:
        item = decoder.decode()
    except Exception as exc:  # cbor2's error classes are not a contract; hostile bytes may raise anything
        raise EnvelopeError(f"{what} is not valid CBOR: {_cause(exc)}", "malformed") from None
    if _has_more(decoder):
        raise EnvelopeError(f"{what} has bytes after its CBOR item", "malformed")
    return item


def _has_more(decoder: cbor2.CBORDecoder) -> bool:
    # the decoder reads ahead into its own buffer, so the stream position says nothing; ask it
    try:
        return bool(decoder.read(1))
    except cbor2.CBORDecodeEOF:
        return False


def _cause(exc: BaseException) -> str:
    """cbor2 wraps a hook's error; the inner message is the one that says what was wrong."""
    inner = exc.__cause__ or exc.__context__
    text = str(exc) if inner is None else f"{exc} ({inner})"
    return text[:200]


def decode_sign1(data: bytes) -> Sign1:
    """Parse a tagged COSE_Sign1 with an attached payload; checks structure and headers, not the signature."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EnvelopeError(f"a COSE_Sign1 must be bytes, got {type(data).__name__}", "malformed")
    data = bytes(data)
    if data[:1] != _SIGN1_HEAD:  # said up front: the tag filter below would only name the wrong tag
        first = f"byte 0x{data[0]:02x}" if data else "nothing"
        raise EnvelopeError(f"not a COSE_Sign1: expected CBOR tag {TAG_SIGN1} (byte 0xd2) first, got {first}",
                            "malformed")
    item = loads_strict(data, "COSE_Sign1", max_depth=16, allow_sign1_tag=True)
    protected, unprotected, payload, signature = _sign1_parts(item)
    protected_headers = _decode_protected(protected)
    _check_headers(protected_headers, unprotected)
    return Sign1(protected, protected_headers, unprotected, payload, signature)


def _sign1_parts(item: Any) -> tuple[bytes, dict, bytes, bytes]:
    """The four slots of the tagged array, each of the type RFC 9052 §4.2 gives it."""
    if not isinstance(item, cbor2.CBORTag) or item.tag != TAG_SIGN1:
        raise EnvelopeError(f"not a COSE_Sign1: expected CBOR tag {TAG_SIGN1} around the message", "malformed")
    parts = item.value  # cbor2 may hand a tag's content over immutable: tuple and frozendict
    if not isinstance(parts, (list, tuple)) or len(parts) != 4:
        raise EnvelopeError("COSE_Sign1 must be an array of 4: protected, unprotected, payload, signature",
                            "malformed")
    protected, unprotected, payload, signature = parts
    if not isinstance(protected, bytes):
        raise EnvelopeError("COSE_Sign1 protected header must be a byte string", "malformed")
    if not isinstance(unprotected, Mapping):
        raise EnvelopeError("COSE_Sign1 unprotected header must be a map", "malformed")
    if payload is None:
        raise EnvelopeError("COSE_Sign1 with a detached payload is not supported", "malformed")
    if not isinstance(payload, bytes):
        raise EnvelopeError("COSE_Sign1 payload must be a byte string", "malformed")
    if not isinstance(signature, bytes):
        raise EnvelopeError("COSE_Sign1 signature must be a byte string", "malformed")
    return protected, dict(unprotected), payload, signature


def _decode_protected(protected: bytes) -> dict:
    if not protected:
        return {}
    headers = loads_strict(protected, "COSE protected header")
    if not isinstance(headers, Mapping):
        raise EnvelopeError("COSE protected header must encode a map", "malformed")
    return dict(headers)


def _show(label: Any) -> str:
    """A label for an error message; hostile text labels can be long."""
    text = repr(label)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_label(label: Any) -> bool:
    # bool is an int to Python, and 1.0 hashes like 1: only a real int or text is a COSE label
    return type(label) is int or type(label) is str


def _check_headers(protected: dict, unprotected: dict) -> None:
    """RFC 9052 §3: labels are int or tstr, in one bucket only; crit is protected, and names only
    headers that are present and that this code understands."""
    for bucket, name in ((protected, "protected"), (unprotected, "unprotected")):
        bad = next((k for k in bucket if not _is_label(k)), None)
        if bad is not None:
            raise EnvelopeError(f"COSE {name} header has a label of type {type(bad).__name__}", "malformed")
    both = protected.keys() & unprotected.keys()
    if both:
        raise EnvelopeError(f"COSE header label {_show(sorted(both, key=str)[0])} is in both buckets", "malformed")
    if HDR_CRIT in unprotected:
        raise EnvelopeError("COSE crit header must be protected", "malformed")
    _check_crit(protected)
    _check_common(protected, unprotected)


def _check_crit(protected: dict) -> None:
    if HDR_CRIT not in protected:
        return
    crit = protected[HDR_CRIT]
    if not isinstance(crit, (list, tuple)) or not crit or not all(_is_label(label) for label in crit):
        raise EnvelopeError("COSE crit header must be a non-empty array of labels", "malformed")
    for label in crit:
        if label not in protected:
            raise EnvelopeError(f"COSE crit names header {_show(label)}, which is not in the protected bucket",
                                "malformed")
        if label not in _UNDERSTOOD:
            raise EnvelopeError(f"COSE header {_show(label)} is marked critical and is not understood", "malformed")


def _check_common(protected: dict, unprotected: dict) -> None:
    """The types RFC 9052 §3.1 gives the headers this code reads."""
    merged = {**unprotected, **protected}
    alg = merged.get(HDR_ALG)
    if alg is not None and not _is_label(alg):
        raise EnvelopeError("COSE alg header must be an integer or text", "malformed")
    kid = merged.get(HDR_KID)
    if kid is not None and not isinstance(kid, bytes):
        raise EnvelopeError("COSE kid header must be a byte string", "malformed")
    cty = merged.get(HDR_CONTENT_TYPE)
    if cty is not None and not (type(cty) is str or (type(cty) is int and cty >= 0)):
        raise EnvelopeError("COSE content type header must be text or an unsigned integer", "malformed")


# --- verification ----------------------------------------------------------------------------

def algorithm_for_key(public_key) -> int:
    """The COSE algorithm a trusted key verifies; ValueError for any other kind of key."""
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return ALG_EDDSA
    if isinstance(public_key, ec.EllipticCurvePublicKey) and public_key.curve.name == "secp256r1":
        return ALG_ES256
    raise ValueError("trusted key must be Ed25519 or ECDSA P-256")


def verify_signature(alg: int, public_key, to_be_signed: bytes, signature: bytes) -> None:
    """Raises EnvelopeError: 'key' if the key cannot make `alg` signatures, 'malformed' for a
    signature of the wrong size, 'signature' if it does not verify."""
    if algorithm_for_key(public_key) != alg:
        raise EnvelopeError(f"COSE alg {_show(alg)} does not match the trusted key", "key")
    if len(signature) != SIGNATURE_SIZES[alg]:
        raise EnvelopeError(f"COSE alg {alg} signature is {len(signature)} bytes, expected {SIGNATURE_SIZES[alg]}",
                            "malformed")
    try:
        if alg == ALG_EDDSA:
            public_key.verify(signature, to_be_signed)
        else:
            r = int.from_bytes(signature[:_P256_COORD], "big")
            s = int.from_bytes(signature[_P256_COORD:], "big")
            public_key.verify(encode_dss_signature(r, s), to_be_signed, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise EnvelopeError("COSE signature does not verify", "signature") from None


def verify_sign1(data: bytes, public_key, external_aad: bytes = b"") -> Sign1:
    """Decode a COSE_Sign1 and check its signature with `public_key` (Ed25519 or P-256)."""
    msg = decode_sign1(data)
    alg = msg.header(HDR_ALG)
    if alg is None:
        raise EnvelopeError("COSE_Sign1 has no alg header", "malformed")
    verify_signature(alg, public_key, msg.to_be_signed(external_aad), msg.signature)
    return msg
