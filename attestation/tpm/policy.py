"""A device key the TPM uses only while a PCR holds a value an offline authority approved.

The key's authPolicy is PolicyAuthorize(authority, POLICY_REF): it may be used in a policy session
whose digest, after TPM2_PolicyPCR, equals a digest the authority signed. The authority (the vendor's
offline P-256 key) signs `aHash = SHA-256(approvedPolicy || policyRef)` where approvedPolicy is the
PolicyPCR digest of the measurement PCR after the model and modules are measured. A new model needs
a new approval, never a new device key; an approval for one PCR state does not open another.

Runtime sequence (tpm2-pytss ESAPI, verified on swtpm 0.7.1, see ../shared/field-notes/tpm2.md):
load_external(authority, OWNER) -> VerifySignature (ticket) -> PolicyPCR (current values) ->
PolicyAuthorize(approved, authority name, ticket, policyRef) -> Sign (ECDSA P-256, digest).

`Approval` is the JSON file the authority hands out; `Approval.verify` checks it without a TPM.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (Prehashed, decode_dss_signature,
                                                             encode_dss_signature)

from ..errors import AttestationError
from .signer import DEFAULT_DEVICE_KEY_HANDLE, _tss, persist_p256_primary  # noqa: F401 (re-exported)

POLICY_REF = b"sits2026/deploy/v1"  # fixed in every device key's authPolicy
APPROVAL_FORMAT = "sits-approval"
CC_POLICY_PCR = 0x17F
CC_POLICY_AUTHORIZE = 0x16A
_P256 = 32
# TPM format-1 response codes (parameter/handle/session number masked out) we explain in words
_RC_WORDS = {0x084: "TPM_RC_VALUE", 0x09D: "TPM_RC_POLICY_FAIL", 0x09B: "TPM_RC_SIGNATURE", 0x0A0: "TPM_RC_TICKET",
             0x12F: "TPM_RC_AUTH_UNAVAILABLE", 0x128: "TPM_RC_PCR_CHANGED", 0x126: "TPM_RC_POLICY",
             0x921: "TPM_RC_LOCKOUT", 0x08B: "TPM_RC_HANDLE"}


class PolicyError(AttestationError):
    """An approval or a policy-bound key that does not check out. `code`: format, authority,
    signature, pcr, model, key, refused (the TPM refused the policy: PCR not in the approved state)."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


# --- the authority (offline) -----------------------------------------------------------------

def generate_authority(directory: Path) -> tuple[Path, Path]:
    """A fresh P-256 authority key pair: authority.key.pem (0600) and authority.pub.pem."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = directory / "authority.key.pem", directory / "authority.pub.pem"
    fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    pub.write_bytes(public_pem(key.public_key()))
    return priv, pub


def public_pem(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_authority_public(path: Path) -> ec.EllipticCurvePublicKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PolicyError(f"authority public key {path}: cannot read it ({exc.strerror})", "authority") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        try:  # a private key file given where the public one is expected still yields the public key
            key = serialization.load_pem_private_key(data, None).public_key()
        except (ValueError, TypeError):
            raise PolicyError(f"authority public key {path}: not a PEM public key", "authority") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise PolicyError(f"authority key {path}: must be ECDSA P-256", "authority")
    return key


def load_authority_private(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), None)
    except OSError as exc:
        raise PolicyError(f"authority private key {path}: cannot read it ({exc.strerror})", "authority") from None
    except (ValueError, TypeError) as exc:
        raise PolicyError(f"authority private key {path}: not an unencrypted PEM private key ({exc})",
                          "authority") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise PolicyError(f"authority key {path}: must be ECDSA P-256", "authority")
    return key


def authority_id(public_key) -> str:
    """SHA-256 of the authority's SubjectPublicKeyInfo (hex): names the key in approvals."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


# --- policy digests (computed offline, equal to what the TPM computes) -------------------------

def tpm_public(public_key):
    """The TPM2B_PUBLIC that load_external gets for the authority; x and y left-padded to 32 bytes
    (TPM2B_PUBLIC.from_pem drops leading zero bytes: tpm2-tss #1518)."""
    t = _tss()
    nums = public_key.public_numbers()
    area = t.TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null",
                               objectAttributes=t.TPMA_OBJECT.SIGN_ENCRYPT | t.TPMA_OBJECT.USERWITHAUTH)
    area.unique.ecc.x = t.TPM2B_ECC_PARAMETER(nums.x.to_bytes(_P256, "big"))
    area.unique.ecc.y = t.TPM2B_ECC_PARAMETER(nums.y.to_bytes(_P256, "big"))
    return t.TPM2B_PUBLIC(publicArea=area)


def authority_name(public_key) -> bytes:
    return bytes(tpm_public(public_key).get_name())


def pcr_policy_digest(pcr: int, value: bytes) -> bytes:
    """TPM2_PolicyPCR from a fresh session: H(0^32 || CC_PolicyPCR || TPML_PCR_SELECTION || H(value))."""
    from .quote import pcr_selection

    sel = pcr_selection([pcr]).marshal()
    return hashlib.sha256(bytes(32) + CC_POLICY_PCR.to_bytes(4, "big") + sel
                          + hashlib.sha256(bytes(value)).digest()).digest()


def key_auth_policy(public_key, policy_ref: bytes = POLICY_REF) -> bytes:
    """The device key's authPolicy: PolicyAuthorize(authority, policyRef) from a fresh session."""
    inner = hashlib.sha256(bytes(32) + CC_POLICY_AUTHORIZE.to_bytes(4, "big") + authority_name(public_key)).digest()
    return hashlib.sha256(inner + policy_ref).digest()


def approval_hash(approved_policy: bytes, policy_ref: bytes) -> bytes:
    return hashlib.sha256(approved_policy + policy_ref).digest()


# --- the approval file -----------------------------------------------------------------------

@dataclass(frozen=True)
class Approval:
    """An authority's signature over one PolicyPCR state. `events` are the (kind, name, sha256)
    measurements that, extended in order into a reset `pcr`, give `pcr_value`: a verifier recomputes
    both digests from them, so the signature covers the model and module hashes too."""

    pcr: int
    pcr_value: str
    approved_policy: str
    model_sha256: str
    events: tuple[tuple[str, str, str], ...]
    policy_ref: str
    authority_id: str
    signature: str  # ECDSA P-256 over approval_hash(), r||s hex
    format: str = APPROVAL_FORMAT
    version: int = 1

    def to_json(self) -> str:
        data = asdict(self)
        data["events"] = [list(e) for e in self.events]
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "approval") -> "Approval":
        try:
            data = json.loads(text)
            if data.get("format") != APPROVAL_FORMAT or data.get("version") != 1:
                raise ValueError(f"not a {APPROVAL_FORMAT} version 1 file")
            data["events"] = tuple(tuple(str(x) for x in e) for e in data["events"])
            if not all(len(e) == 3 for e in data["events"]):
                raise ValueError("each event is [kind, name, sha256]")
            approval = cls(**data)
            for f in ("pcr_value", "approved_policy", "model_sha256", "authority_id"):
                if len(bytes.fromhex(getattr(approval, f))) != 32:
                    raise ValueError(f"{f} must be 32 bytes of hex")
            if len(bytes.fromhex(approval.signature)) != 2 * _P256 or type(approval.pcr) is not int:
                raise ValueError("signature must be r||s (64 bytes hex), pcr an integer")
            bytes.fromhex(approval.policy_ref)
            return approval
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise PolicyError(f"{where}: not a valid approval file ({exc}); make one with "
                              "`sitsctl policy approve`", "format") from None

    @classmethod
    def load(cls, path: Path) -> "Approval":
        try:
            return cls.from_json(Path(path).read_text(), str(path))
        except OSError as exc:
            raise PolicyError(f"approval {path}: cannot read it ({exc.strerror})", "format") from None

    def verify(self, authority) -> None:
        """Signature, authority id, and that the signed policy digest follows from the events. Raises PolicyError."""
        from ..measurement import MeasurementError, event_digest, extend

        if authority_id(authority) != self.authority_id:
            raise PolicyError(f"approval is signed by authority {self.authority_id[:16]}…, the trusted authority "
                              f"key is {authority_id(authority)[:16]}…", "authority")
        sig = bytes.fromhex(self.signature)
        der = encode_dss_signature(int.from_bytes(sig[:_P256], "big"), int.from_bytes(sig[_P256:], "big"))
        digest = approval_hash(bytes.fromhex(self.approved_policy), bytes.fromhex(self.policy_ref))
        try:
            authority.verify(der, digest, ec.ECDSA(Prehashed(hashes.SHA256())))
        except InvalidSignature:
            raise PolicyError("approval signature does not verify with the authority key (edited, or signed by "
                              "another key)", "signature") from None
        value = bytes(32)
        try:
            for kind, name, sha in self.events:
                value = extend(value, event_digest(kind, name, sha))
        except MeasurementError as exc:
            raise PolicyError(f"approval events: {exc}", "format") from None
        if value.hex() != self.pcr_value:
            raise PolicyError("approval pcr_value does not follow from its events", "pcr")
        if pcr_policy_digest(self.pcr, value).hex() != self.approved_policy:
            raise PolicyError("approval approved_policy is not the PolicyPCR digest of its PCR value", "pcr")
        if ("model", self.model_sha256) not in {(k, s) for k, _, s in self.events}:
            raise PolicyError("approval model_sha256 is not among its measured events", "model")


def approve(authority: ec.EllipticCurvePrivateKey, pcr: int, events, policy_ref: bytes = POLICY_REF) -> Approval:
    """The authority's approval of the PCR state `events` produce from a reset PCR."""
    from ..measurement import event_digest, extend

    events = tuple((str(k), str(n), str(s)) for k, n, s in events)
    models = [s for k, _, s in events if k == "model"]
    if len(models) != 1:
        raise PolicyError(f"an approval measures exactly one model, got {len(models)}", "model")
    value = bytes(32)
    for kind, name, sha in events:
        value = extend(value, event_digest(kind, name, sha))
    approved = pcr_policy_digest(pcr, value)
    r, s = decode_dss_signature(authority.sign(approval_hash(approved, policy_ref),
                                               ec.ECDSA(Prehashed(hashes.SHA256()))))
    return Approval(pcr, value.hex(), approved.hex(), models[0], events, policy_ref.hex(),
                    authority_id(authority.public_key()), (r.to_bytes(_P256, "big") + s.to_bytes(_P256, "big")).hex())


# --- the device key (TPM) --------------------------------------------------------------------

def load_or_create_policy_key(esapi, handle: int, authority):
    """(ESYS_TR, created) of the PolicyAuthorize-bound P-256 signing key at `handle`. NODA (unclean
    restarts never count as failed authorizations), no USERWITHAUTH (no password use at all). An object
    already there must carry this authority's policy: anything else is refused, never used or replaced."""
    t = _tss()
    policy = key_auth_policy(authority)
    try:
        key = esapi.tr_from_tpmpublic(handle)
    except t.TSS2_Exception:
        key = None
    if key is not None:
        pub, _, _ = esapi.read_public(key)
        have = bytes(pub.publicArea.authPolicy)
        attrs = int(pub.publicArea.objectAttributes)
        if have != policy or attrs & int(t.TPMA_OBJECT.USERWITHAUTH):
            raise PolicyError(
                f"the key at 0x{handle:08x} is not bound to authority {authority_id(authority)[:16]}… (authPolicy "
                f"{have.hex()[:16] or 'empty'}…, attributes 0x{attrs:08x}): it was provisioned for another authority "
                f"or for password use (tpm-direct's key belongs at attestation.key_handle). Evict it "
                f"(tpm2_evictcontrol -C o -c 0x{handle:08x}) to re-provision, or set attestation.device_key_handle "
                "to a free handle", "key")
        return key, False
    a = t.TPMA_OBJECT
    return persist_p256_primary(esapi, a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN | a.SIGN_ENCRYPT | a.NODA,
                                handle, policy), True


def key_public_pem(esapi, key) -> bytes:
    pub, _, _ = esapi.read_public(key)
    return public_pem(serialization.load_pem_public_key(pub.to_pem()))


def rc_words(exc) -> str:
    rc = int(getattr(exc, "rc", 0)) & 0xFFFF
    base = (rc & 0x3F) | 0x80 if rc & 0x80 else rc
    return _RC_WORDS.get(base, f"rc 0x{rc:04x}")


def policy_sign(esapi, key, approval: Approval, authority, digest: bytes) -> bytes:
    """TPM2_Sign of a 32-byte `digest` with the policy-bound key under `approval`; r||s. The TPM, not
    this code, compares the PCR with the approved state: PolicyError(code refused) when it says no."""
    t = _tss()
    ESYS_TR = t.ESYS_TR
    approved = bytes.fromhex(approval.approved_policy)
    ref = bytes.fromhex(approval.policy_ref)
    sig = bytes.fromhex(approval.signature)
    ecdsa = t.TPMS_SIGNATURE_ECC(hash=t.TPM2_ALG.SHA256,
                                   signatureR=t.TPM2B_ECC_PARAMETER(sig[:_P256]),
                                   signatureS=t.TPM2B_ECC_PARAMETER(sig[_P256:]))
    signature = t.TPMT_SIGNATURE(sigAlg=t.TPM2_ALG.ECDSA, signature=t.TPMU_SIGNATURE(ecdsa=ecdsa))
    step = "TPM2_LoadExternal of the authority key"
    ext = session = None
    try:
        # OWNER, not NULL: a ticket from the NULL hierarchy does not satisfy PolicyAuthorize
        ext = esapi.load_external(tpm_public(authority), None, ESYS_TR.OWNER)
        step = "TPM2_VerifySignature of the approval"
        ticket = esapi.verify_signature(ext, t.TPM2B_DIGEST(approval_hash(approved, ref)), signature)
        esapi.flush_context(ext)
        ext = None
        step = "TPM2_StartAuthSession"
        session = esapi.start_auth_session(ESYS_TR.NONE, ESYS_TR.NONE, t.TPM2_SE.POLICY,
                                           t.TPMT_SYM_DEF(algorithm=t.TPM2_ALG.NULL), t.TPM2_ALG.SHA256)
        step = f"TPM2_PolicyPCR of PCR {approval.pcr}"
        from .quote import pcr_selection

        esapi.policy_pcr(session, t.TPM2B_DIGEST(b""), pcr_selection([approval.pcr]))  # the TPM's current value
        step = "TPM2_PolicyAuthorize"
        esapi.policy_authorize(session, t.TPM2B_DIGEST(approved), t.TPM2B_NAME(authority_name(authority)), ticket,
                               t.TPM2B_NONCE(ref))
        step = "TPM2_Sign"
        scheme = t.TPMT_SIG_SCHEME(scheme=t.TPM2_ALG.ECDSA)
        scheme.details.any.hashAlg = t.TPM2_ALG.SHA256
        hashcheck = t.TPMT_TK_HASHCHECK(tag=t.TPM2_ST.HASHCHECK, hierarchy=t.TPM2_RH.NULL)
        out = esapi.sign(key, t.TPM2B_DIGEST(bytes(digest)), scheme, hashcheck, session1=session)
    except t.TSS2_Exception as exc:
        words = rc_words(exc)
        if step in ("TPM2_PolicyAuthorize", "TPM2_Sign") and words in ("TPM_RC_VALUE", "TPM_RC_POLICY_FAIL"):
            raise PolicyError(f"the TPM refused the device key ({step}: {words}): PCR {approval.pcr} is not in the "
                              f"state the approval covers (expected {approval.pcr_value[:16]}…): the measured model, "
                              "modules or their order differ from what the authority approved", "refused") from exc
        if step == "TPM2_VerifySignature of the approval":
            raise PolicyError(f"the TPM rejected the approval signature ({words})", "signature") from exc
        raise PolicyError(f"{step} failed: {words} ({exc})", "tpm") from exc
    finally:
        for handle in (ext, session):
            if handle is not None:
                try:
                    esapi.flush_context(handle)
                except t.TSS2_Exception:
                    pass
    ec_sig = out.signature.ecdsa
    return bytes(ec_sig.signatureR).rjust(_P256, b"\0") + bytes(ec_sig.signatureS).rjust(_P256, b"\0")


def verify_device_signature(device_public_pem: bytes, digest: bytes, signature: bytes) -> bool:
    key = serialization.load_pem_public_key(device_public_pem)
    der = encode_dss_signature(int.from_bytes(signature[:_P256], "big"), int.from_bytes(signature[_P256:], "big"))
    try:
        key.verify(der, digest, ec.ECDSA(Prehashed(hashes.SHA256())))
        return True
    except InvalidSignature:
        return False


__all__ = ["DEFAULT_DEVICE_KEY_HANDLE", "POLICY_REF", "Approval", "PolicyError", "approve", "authority_id",
           "authority_name", "generate_authority", "key_auth_policy", "key_public_pem", "load_authority_private",
           "load_authority_public", "load_or_create_policy_key", "pcr_policy_digest", "policy_sign", "public_pem", "rc_words",
           "verify_device_signature"]
