"""AK enrollment by credential activation (TPM 2.0 Part 1 "Credential Protection"; Part 3 TPM2_MakeCredential,
TPM2_ActivateCredential): proof that the attestation key (AK) lives in the same TPM as the endorsement key (EK).

Verifier side (pure Python, `cryptography` only, no TPM, no tpm2-pytss):

- `parse_public(tpmt_public)` reads a marshalled TPMT_PUBLIC (RSA or ECC); `object_name` is its TPM Name,
  nameAlg || H_nameAlg(TPMT_PUBLIC), computed here from the public area, never taken from the device.
- `make_credential(ek_public, ak_name, secret)` encrypts `secret` to the EK, bound to the AK's Name:
  a seed is shared with the EK (ECC: ephemeral ECDH + KDFe with label "IDENTITY"; RSA: OAEP with the EK's
  nameAlg and label "IDENTITY\\0"), KDFa(seed, "STORAGE", ak_name) gives the AES-CFB key (zero IV) that
  encrypts TPM2B_DIGEST(secret), KDFa(seed, "INTEGRITY") the HMAC key of the outer HMAC over
  encIdentity || ak_name. Returns the contents of TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET.

Device side (tpm2-pytss ESAPI):

- `ek_template(kind)` is the TCG EK Credential Profile default template (L-1 RSA 2048, L-2 ECC P-256);
  `open_ek(esapi, kind)` yields the EK: the persistent one at 0x81010001 / 0x81010002 when it matches the
  template, else a primary created from the template under the endorsement hierarchy (the same key every
  time: primaries derive from the endorsement seed) and flushed on exit.
- `activate_credential(esapi, ak, ek, blob, encrypted_secret)` returns the secret; the EK's authPolicy is
  PolicySecret(TPM_RH_ENDORSEMENT), satisfied in a policy session that is always flushed.

Only a TPM holding the EK private key (to recover the seed) and an object with exactly the AK's Name (the
HMAC covers it) gets the secret back. That the EK is a genuine TPM's is a separate question: the EK
certificate chain up to the TPM manufacturer's CA answers it (docs/enroll.md).

Readers of the result (the PLC side, sitsctl deploy; pure Python):

- `seal_record(record, signing_key)` gives the enrollment record its integrity digest and, optionally, the
  enrolling verifier's signature; `load_enrollment(path, authority=, min_ek_trust=)` checks a record (digest,
  signature, that its AK is a restricted TPM-resident key whose Name the credential was bound to, its EK) and
  returns the `Enrollment`: the one AK to trust.
- `EnrolledSessionVerifier(enrollment, model_sha256, ...)` is a session verifier that trusts that AK only.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import struct
from contextlib import contextmanager
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

try:  # CFB moved to `decrepit` in cryptography 47; TPM 2.0 parameter and credential encryption is AES-CFB
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
except ImportError:  # pragma: no cover - older cryptography
    from cryptography.hazmat.primitives.ciphers.modes import CFB

from ..errors import AttestationError, TpmError

# TPM_ALG_ID values (TPM 2.0 Part 2, table 9)
ALG_RSA, ALG_SHA1, ALG_HMAC, ALG_AES, ALG_KEYEDHASH = 0x0001, 0x0004, 0x0005, 0x0006, 0x0008
ALG_SHA256, ALG_SHA384, ALG_SHA512, ALG_NULL = 0x000B, 0x000C, 0x000D, 0x0010
ALG_ECDAA, ALG_ECC, ALG_SYMCIPHER, ALG_CFB = 0x001A, 0x0023, 0x0025, 0x0043
_HASHES = {ALG_SHA1: "sha1", ALG_SHA256: "sha256", ALG_SHA384: "sha384", ALG_SHA512: "sha512"}
_CRYPTO_HASHES = {ALG_SHA1: hashes.SHA1, ALG_SHA256: hashes.SHA256, ALG_SHA384: hashes.SHA384,
                  ALG_SHA512: hashes.SHA512}
# TPM_ECC_CURVE -> (cryptography curve, coordinate bytes)
_CURVES = {0x0003: (ec.SECP256R1, 32), 0x0004: (ec.SECP384R1, 48), 0x0005: (ec.SECP521R1, 66)}
_CURVE_IDS = {"secp256r1": 0x0003, "secp384r1": 0x0004, "secp521r1": 0x0005}

# TPMA_OBJECT bits (Part 2, table 31)
FIXED_TPM, FIXED_PARENT, SENSITIVE_DATA_ORIGIN = 1 << 1, 1 << 4, 1 << 5
USER_WITH_AUTH, ADMIN_WITH_POLICY, NO_DA = 1 << 6, 1 << 7, 1 << 10
RESTRICTED, DECRYPT, SIGN_ENCRYPT = 1 << 16, 1 << 17, 1 << 18
_ATTR_NAMES = {FIXED_TPM: "fixedTPM", FIXED_PARENT: "fixedParent", SENSITIVE_DATA_ORIGIN: "sensitiveDataOrigin",
               RESTRICTED: "restricted", DECRYPT: "decrypt", SIGN_ENCRYPT: "sign"}

# TCG EK Credential Profile 2.x, low range: authPolicy = PolicySecret(TPM_RH_ENDORSEMENT) with SHA-256
EK_POLICY_SHA256 = bytes.fromhex("837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa")
EK_ATTRIBUTES = FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | ADMIN_WITH_POLICY | RESTRICTED | DECRYPT
EK_PERSISTENT = {"rsa": 0x81010001, "ecc": 0x81010002}  # TCG TPM v2.0 Provisioning Guidance
EK_CERT_INDEX = {"rsa": 0x01C00002, "ecc": 0x01C0000A}
AK_REQUIRED = FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | RESTRICTED | SIGN_ENCRYPT

LABEL_IDENTITY, LABEL_STORAGE, LABEL_INTEGRITY = b"IDENTITY\0", b"STORAGE\0", b"INTEGRITY\0"
MAX_PUBLIC_BYTES = 1024  # an RSA 4096 TPMT_PUBLIC is < 600 bytes; bounds work on hostile input


class EnrollError(AttestationError):
    """Enrollment refused or failed. `code`: malformed (a structure does not parse), ak (not a usable
    AK), ek (not an EK / does not match its certificate), certificate, integrity (the TPM refused the
    credential: wrong AK, wrong TPM or tampered), secret (the device answered another secret), tpm, record (an
    enrollment record that is malformed, edited, unsigned where a signature is required, or too weakly
    vouched for: `load_enrollment`)."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


# --- TPMT_PUBLIC in pure Python ----------------------------------------------------------------

@dataclass(frozen=True)
class PublicArea:
    raw: bytes  # the marshalled TPMT_PUBLIC
    type: int
    name_alg: int
    attributes: int
    auth_policy: bytes
    symmetric: tuple[int, int, int] | None  # (algorithm, keyBits, mode) or None for TPM_ALG_NULL
    scheme: int
    scheme_hash: int | None
    rsa_bits: int = 0
    rsa_exponent: int = 0
    rsa_modulus: bytes = b""
    curve: int = 0
    kdf: int = ALG_NULL
    x: bytes = b""
    y: bytes = b""

    @property
    def kind(self) -> str:
        return "rsa" if self.type == ALG_RSA else "ecc"

    def name(self) -> bytes:
        return object_name(self.raw)

    def public_key(self):
        """The key as a `cryptography` public key."""
        if self.type == ALG_RSA:
            n = int.from_bytes(self.rsa_modulus, "big")
            return rsa.RSAPublicNumbers(self.rsa_exponent or 65537, n).public_key()  # exponent 0 means 2^16 + 1
        curve, _ = _CURVES[self.curve]
        try:
            return ec.EllipticCurvePublicNumbers(int.from_bytes(self.x, "big"), int.from_bytes(self.y, "big"),
                                                 curve()).public_key()
        except ValueError as exc:
            raise EnrollError(f"public area: the ECC point is not on the curve ({exc})", "malformed") from None

    def public_key_pem(self) -> bytes:
        return self.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)

    def public_key_der(self) -> bytes:
        return self.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)

    def attribute_names(self) -> str:
        return "|".join(n for bit, n in _ATTR_NAMES.items() if self.attributes & bit) or "none"


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise EnrollError(f"{self.what}: truncated at byte {self.pos} (needs {n} more): not a marshalled "
                              "TPMT_PUBLIC", "malformed")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u16(self) -> int:
        return struct.unpack(">H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def tpm2b(self) -> bytes:
        return self.take(self.u16())


def parse_public(data: bytes, what: str = "public area") -> PublicArea:
    """Parse a marshalled TPMT_PUBLIC of an RSA or ECC key (the whole of `data`); EnrollError if it is not one."""
    data = bytes(data)
    if not 0 < len(data) <= MAX_PUBLIC_BYTES:
        raise EnrollError(f"{what}: {len(data)} bytes, a TPMT_PUBLIC has 1..{MAX_PUBLIC_BYTES}", "malformed")
    r = _Reader(data, what)
    kind, name_alg, attributes = r.u16(), r.u16(), r.u32()
    if kind not in (ALG_RSA, ALG_ECC):
        raise EnrollError(f"{what}: object type 0x{kind:04x} is neither RSA (0x0001) nor ECC (0x0023)", "malformed")
    if name_alg not in _HASHES:
        raise EnrollError(f"{what}: nameAlg 0x{name_alg:04x} is not SHA-1/256/384/512", "malformed")
    auth_policy = r.tpm2b()
    sym_alg = r.u16()
    symmetric = None if sym_alg == ALG_NULL else (sym_alg, r.u16(), r.u16())
    scheme = r.u16()
    scheme_hash = None
    if scheme != ALG_NULL:
        scheme_hash = r.u16()
        if scheme == ALG_ECDAA:
            r.u16()  # count
    fields: dict = {}
    if kind == ALG_RSA:
        fields["rsa_bits"], fields["rsa_exponent"] = r.u16(), r.u32()
        fields["rsa_modulus"] = r.tpm2b()
        if len(fields["rsa_modulus"]) * 8 != fields["rsa_bits"]:
            raise EnrollError(f"{what}: RSA modulus has {len(fields['rsa_modulus'])} bytes for keyBits "
                              f"{fields['rsa_bits']}", "malformed")
    else:
        fields["curve"] = r.u16()
        if fields["curve"] not in _CURVES:
            raise EnrollError(f"{what}: ECC curve 0x{fields['curve']:04x} is not NIST P-256/384/521", "malformed")
        fields["kdf"] = r.u16()
        if fields["kdf"] != ALG_NULL:
            r.u16()
        fields["x"], fields["y"] = r.tpm2b(), r.tpm2b()
    if r.pos != len(data):
        raise EnrollError(f"{what}: {len(data) - r.pos} bytes after the TPMT_PUBLIC", "malformed")
    return PublicArea(data, kind, name_alg, attributes, auth_policy, symmetric, scheme, scheme_hash, **fields)


def object_name(tpmt_public: bytes) -> bytes:
    """The TPM Name of an object: nameAlg (2 bytes) || H_nameAlg(marshalled TPMT_PUBLIC)."""
    tpmt_public = bytes(tpmt_public)
    if len(tpmt_public) < 4:
        raise EnrollError("public area too short to hold a nameAlg", "malformed")
    name_alg = struct.unpack(">H", tpmt_public[2:4])[0]
    if name_alg not in _HASHES:
        raise EnrollError(f"public area nameAlg 0x{name_alg:04x} is not SHA-1/256/384/512", "malformed")
    return tpmt_public[2:4] + hashlib.new(_HASHES[name_alg], tpmt_public).digest()


# --- KDFs (TPM 2.0 Part 1, 11.4.10: SP 800-108 counter mode with HMAC; SP 800-56A concatenation) ------

def _label(label: bytes) -> bytes:
    """A KDF label is a NUL-terminated string: one 0x00 follows it, never two."""
    return label if label.endswith(b"\0") else label + b"\0"


def kdfa(hash_alg: int, key: bytes, label: bytes, context_u: bytes, context_v: bytes, bits: int) -> bytes:
    name = _HASHES[hash_alg]
    out, counter = b"", 0
    while len(out) * 8 < bits:
        counter += 1
        msg = struct.pack(">I", counter) + _label(label) + context_u + context_v + struct.pack(">I", bits)
        out += hmac.new(key, msg, name).digest()
    return _truncate(out, bits)


def kdfe(hash_alg: int, z: bytes, label: bytes, party_u: bytes, party_v: bytes, bits: int) -> bytes:
    name = _HASHES[hash_alg]
    out, counter = b"", 0
    while len(out) * 8 < bits:
        counter += 1
        out += hashlib.new(name, struct.pack(">I", counter) + z + _label(label) + party_u + party_v).digest()
    return _truncate(out, bits)


def _truncate(out: bytes, bits: int) -> bytes:
    out = bytearray(out[:(bits + 7) // 8])
    if bits % 8:
        out[0] &= (1 << bits % 8) - 1  # the TPM keeps the low-order bits of the first byte
    return bytes(out)


# --- verifier: MakeCredential --------------------------------------------------------------------

def check_ek(ek: PublicArea) -> None:
    """The EK must be a restricted decryption (storage) key bound to its TPM with a symmetric algorithm:
    the key MakeCredential encrypts to. Anything else is refused with the reason."""
    missing = [n for bit, n in _ATTR_NAMES.items()
               if bit in (FIXED_TPM, FIXED_PARENT, RESTRICTED, DECRYPT) and not ek.attributes & bit]
    if missing or ek.attributes & SIGN_ENCRYPT:
        raise EnrollError(f"EK public area has attributes {ek.attribute_names()}: an EK is a restricted decryption "
                          f"key with fixedTPM and fixedParent and without sign" +
                          (f" (missing: {', '.join(missing)})" if missing else ""), "ek")
    if ek.symmetric is None or ek.symmetric[0] != ALG_AES or ek.symmetric[2] != ALG_CFB \
            or ek.symmetric[1] not in (128, 192, 256):
        raise EnrollError("EK public area: symmetric algorithm is not AES-CFB (the TCG EK templates use "
                          "AES-128-CFB or AES-256-CFB)", "ek")
    if ek.name_alg not in (ALG_SHA256, ALG_SHA384, ALG_SHA512):
        raise EnrollError("EK public area: nameAlg must be SHA-256/384/512", "ek")
    if ek.type == ALG_ECC and ek.kdf != ALG_NULL:
        raise EnrollError("EK public area: ECC kdf must be TPM_ALG_NULL (KDFe is implied)", "ek")


def check_ak(ak: PublicArea) -> None:
    """The AK must be a restricted signing key, fixedTPM and fixedParent (it cannot be duplicated out of the
    TPM), its private part generated in the TPM: only such a key signs nothing but TPM-made attestations."""
    problems = [f"not {n}" for bit, n in _ATTR_NAMES.items() if AK_REQUIRED & bit and not ak.attributes & bit]
    if ak.attributes & DECRYPT:
        problems.append("decrypt is set (an AK only signs)")
    if problems:
        raise EnrollError(f"AK refused: its attributes are {ak.attribute_names()}: {'; '.join(problems)}. An AK "
                          "must be a restricted signing key with fixedTPM, fixedParent and sensitiveDataOrigin "
                          "(sitsctl enroll uses the AK that TPM2_Quote signs with, attestation.ak_handle)", "ak")


def check_ak_usable(ak: PublicArea) -> None:
    """The AK must be an ECC NIST P-256 key: the quotes it signs are checked as ECDSA P-256 (the PLC side's
    session verifier, `sitsctl deploy`); an enrollment of another key type could never verify a quote."""
    if ak.type != ALG_ECC or ak.curve != 0x0003:
        what = f"RSA {ak.rsa_bits}" if ak.type == ALG_RSA else f"ECC curve 0x{ak.curve:04x}"
        raise EnrollError(f"AK refused: it is an {what} key; quotes are checked as ECDSA P-256, so the AK must be an "
                          "ECC NIST P-256 restricted signing key (the one sitsd creates at attestation.ak_handle)",
                          "ak")


def make_credential(ek_public, ak_name: bytes, secret: bytes, *, rng=os.urandom) -> tuple[bytes, bytes]:
    """TPM2_MakeCredential in software: (credential_blob, encrypted_secret), the contents of TPM2B_ID_OBJECT
    and TPM2B_ENCRYPTED_SECRET that TPM2_ActivateCredential takes. `ek_public` is a marshalled TPMT_PUBLIC
    or a PublicArea; `ak_name` the AK's Name (compute it with `object_name`); `secret` 1..digest-size bytes."""
    ek = ek_public if isinstance(ek_public, PublicArea) else parse_public(ek_public, "EK public area")
    check_ek(ek)
    digest_size = hashlib.new(_HASHES[ek.name_alg]).digest_size
    ak_name, secret = bytes(ak_name), bytes(secret)
    if not 0 < len(secret) <= digest_size:
        raise ValueError(f"credential secret is {len(secret)} bytes; the EK's nameAlg allows 1..{digest_size}")
    if len(ak_name) < 2 or struct.unpack(">H", ak_name[:2])[0] not in _HASHES \
            or len(ak_name) != 2 + hashlib.new(_HASHES[struct.unpack(">H", ak_name[:2])[0]]).digest_size:
        raise ValueError("AK name must be nameAlg (2 bytes) || digest, as object_name returns")

    # 1. a seed only the EK's private key recovers
    if ek.type == ALG_RSA:
        seed = rng(digest_size)
        h = _CRYPTO_HASHES[ek.name_alg]()
        encrypted_secret = ek.public_key().encrypt(
            seed, padding.OAEP(mgf=padding.MGF1(algorithm=h), algorithm=h, label=LABEL_IDENTITY))
    else:
        curve, size = _CURVES[ek.curve]
        ephemeral = ec.generate_private_key(curve())
        z = ephemeral.exchange(ec.ECDH(), ek.public_key())  # x coordinate of d_e * Q_EK, field-size bytes
        point = ephemeral.public_key().public_numbers()
        ex, ey = point.x.to_bytes(size, "big"), point.y.to_bytes(size, "big")
        seed = kdfe(ek.name_alg, z, LABEL_IDENTITY, ex, ek.x, digest_size * 8)
        encrypted_secret = struct.pack(">H", size) + ex + struct.pack(">H", size) + ey  # TPMS_ECC_POINT

    # 2. encIdentity: TPM2B_DIGEST(secret) under AES-CFB, key bound to the AK name, zero IV
    sym_bits = ek.symmetric[1]
    sym_key = kdfa(ek.name_alg, seed, LABEL_STORAGE, ak_name, b"", sym_bits)
    plain = struct.pack(">H", len(secret)) + secret
    enc = Cipher(algorithms.AES(sym_key), CFB(b"\0" * 16)).encryptor()
    enc_identity = enc.update(plain) + enc.finalize()

    # 3. outer integrity: HMAC(KDFa(seed, "INTEGRITY"), encIdentity || AK name)
    hmac_key = kdfa(ek.name_alg, seed, LABEL_INTEGRITY, b"", b"", digest_size * 8)
    outer = hmac.new(hmac_key, enc_identity + ak_name, _HASHES[ek.name_alg]).digest()
    return struct.pack(">H", len(outer)) + outer + enc_identity, encrypted_secret


def ek_matches_certificate(ek: PublicArea, cert_der: bytes) -> bool:
    """Whether the X.509 EK certificate certifies exactly this EK public key."""
    from cryptography import x509

    cert = x509.load_der_x509_certificate(_trim_der(cert_der))
    return cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo) == ek.public_key_der()


def _trim_der(der: bytes) -> bytes:
    """NV indices may pad a certificate past its DER SEQUENCE."""
    if len(der) > 4 and der[0] == 0x30 and der[1] == 0x82:
        return der[:4 + int.from_bytes(der[2:4], "big")]
    return der


# --- device: the EK and ActivateCredential -------------------------------------------------------

def ek_template(kind: str = "ecc") -> bytes:
    """The TCG EK Credential Profile default template, marshalled TPMT_PUBLIC: L-1 (RSA 2048) or L-2 (ECC
    NIST P-256), SHA-256, AES-128-CFB, authPolicy PolicySecret(TPM_RH_ENDORSEMENT), zero unique field."""
    head = struct.pack(">HHI", ALG_RSA if kind == "rsa" else ALG_ECC, ALG_SHA256, EK_ATTRIBUTES)
    head += struct.pack(">H", len(EK_POLICY_SHA256)) + EK_POLICY_SHA256
    sym = struct.pack(">HHH", ALG_AES, 128, ALG_CFB)
    if kind == "rsa":
        return head + sym + struct.pack(">HHI", ALG_NULL, 2048, 0) + struct.pack(">H", 256) + b"\0" * 256
    if kind == "ecc":
        return head + sym + struct.pack(">HHH", ALG_NULL, 0x0003, ALG_NULL) + (struct.pack(">H", 32) + b"\0" * 32) * 2
    raise ValueError(f"EK kind {kind!r}: use 'ecc' (P-256, template L-2) or 'rsa' (RSA 2048, template L-1)")


def _same_template(area: PublicArea, template: PublicArea) -> bool:
    """Equal but for the unique field (the public key)."""
    strip = lambda p: (p.type, p.name_alg, p.attributes, p.auth_policy, p.symmetric, p.scheme, p.rsa_bits,
                       p.rsa_exponent, p.curve, p.kdf)  # noqa: E731
    return strip(area) == strip(template)


def _tss():
    from .signer import _tss as tss  # lazy: tpm2-pytss is only needed on the device side

    return tss()


def read_public(esapi, handle) -> bytes:
    """An object's marshalled TPMT_PUBLIC."""
    pub, _, _ = esapi.read_public(handle)
    return bytes(pub.publicArea.marshal())


@contextmanager
def open_ek(esapi, kind: str = "ecc"):
    """Yields (ESYS_TR, marshalled TPMT_PUBLIC) of the EK of `kind`. A persistent EK at the TCG handle is used
    when its template is the default one; otherwise the EK is created as a primary under the endorsement
    hierarchy (empty endorsement auth) and flushed when the block ends, whatever happens in it."""
    t = _tss()
    template_bytes = ek_template(kind)
    template = parse_public(template_bytes, "EK template")
    try:
        persistent = esapi.tr_from_tpmpublic(EK_PERSISTENT[kind])
    except t.TSS2_Exception:
        persistent = None
    if persistent is not None:
        raw = read_public(esapi, persistent)
        if _same_template(parse_public(raw, "persistent EK"), template):
            yield persistent, raw
            return
        esapi.tr_close(persistent)  # another object at the EK handle: not the default EK, create our own
    area, _ = t.TPMT_PUBLIC.unmarshal(template_bytes)
    try:
        handle, pub, *_ = esapi.create_primary(None, t.TPM2B_PUBLIC(publicArea=area), t.ESYS_TR.ENDORSEMENT)
    except t.TSS2_Exception as exc:
        raise TpmError(f"TPM2_CreatePrimary of the {kind.upper()} EK (TCG default template) under the endorsement "
                       f"hierarchy failed: {exc}. A set endorsement password is not supported") from exc
    try:
        yield handle, bytes(pub.publicArea.marshal())
    finally:
        esapi.flush_context(handle)


# TPM_RC values (format 1, without parameter/handle/session number) for the activation error messages
_RC_INTEGRITY, _RC_VALUE, _RC_SIZE, _RC_ECC_POINT, _RC_POLICY_FAIL = 0x09F, 0x084, 0x095, 0x0A7, 0x09D


def activate_credential(esapi, ak, ek, credential_blob: bytes, encrypted_secret: bytes) -> bytes:
    """TPM2_ActivateCredential: the secret of a credential made for the AK (`ak`, an ESYS_TR; password
    authorization, empty) and this TPM's EK (`ek`, an ESYS_TR; its PolicySecret(TPM_RH_ENDORSEMENT) is run in a
    policy session flushed on return). Raises EnrollError code "integrity" when the TPM refuses the credential."""
    t = _tss()
    session = esapi.start_auth_session(t.ESYS_TR.NONE, t.ESYS_TR.NONE, t.TPM2_SE.POLICY,
                                       t.TPMT_SYM_DEF(algorithm=t.TPM2_ALG.NULL), t.TPM2_ALG.SHA256)
    try:
        try:
            esapi.policy_secret(t.ESYS_TR.ENDORSEMENT, session)
        except t.TSS2_Exception as exc:
            raise EnrollError(f"TPM2_PolicySecret(TPM_RH_ENDORSEMENT) for the EK's policy failed: {exc}. The "
                              "endorsement hierarchy must be enabled with an empty password (a set endorsement "
                              "password is not supported)", "tpm") from None
        out = esapi.activate_credential(ak, ek, t.TPM2B_ID_OBJECT(bytes(credential_blob)),
                                        t.TPM2B_ENCRYPTED_SECRET(bytes(encrypted_secret)),
                                        session1=t.ESYS_TR.PASSWORD, session2=session)
        return bytes(out)
    except t.TSS2_Exception as exc:
        error = exc.error & 0xFFF if exc.fmt1 else exc.rc & 0xFFF
        if error == _RC_INTEGRITY:
            raise EnrollError("TPM2_ActivateCredential: the credential's integrity HMAC does not verify: it was made "
                              "for another AK name (not the AK given here), for another TPM's EK, or it was altered "
                              "on the way. Ask the verifier for a new challenge for this device's enrollment request "
                              f"({exc})", "integrity") from None
        if error in (_RC_VALUE, _RC_SIZE, _RC_ECC_POINT):
            raise EnrollError("TPM2_ActivateCredential: the EK cannot decrypt the encrypted secret: the challenge was "
                              "made for another TPM's EK, another EK type (ecc/rsa), or it was altered. Ask the "
                              f"verifier for a new challenge ({exc})", "integrity") from None
        raise EnrollError(f"TPM2_ActivateCredential failed: {exc}", "tpm") from None
    finally:
        esapi.flush_context(session)


def secret_matches(expected: bytes, answered: bytes) -> bool:
    return hmac.compare_digest(bytes(expected), bytes(answered))


# --- the enrollment record: written by the verifier (sitsctl enroll --verify), read by the PLC side and deploy ------
#
# The record names the AK that credential activation proved to be in the TPM of one EK. Whoever trusts the
# record trusts that AK, and no other. It is a JSON object (RECORD_FIELDS) plus
#   record_sha256  SHA-256(RECORD_DOMAIN || canonical JSON of every other field but `signature`): catches a
#                  record edited or damaged after it was written (not a forgery: anyone can recompute it);
#   signature      optional: {"alg": "ecdsa-p256-sha256", "key_id": SHA-256 of the signer's SPKI (hex),
#                  "value": base64 DER ECDSA over the same bytes}, by the enrolling verifier's P-256 key
#                  (`sitsctl enroll --verify --signing-key`). A reader given that public key refuses a record
#                  it did not sign: then the record is as trustworthy as that key, wherever the file travels.
# `load_enrollment` checks a record completely: format, fields, digest, signature (when a key is given), that
# the AK public area is a restricted signing key resident in a TPM (check_ak), that the AK Name the credential
# was made for is the Name of that public area and that `ak_public_pem` is its key, that the EK is an EK
# (check_ek) whose hash the record states, and the EK trust level its reader demands.

RECORD_FORMAT = "sits-enroll-record/2"
RECORD_FORMAT_V1 = "sits-enroll-record/1"  # before records carried a digest: refused with "enroll again"
RECORD_DOMAIN = b"sits2026/enroll-record/v2\0"
RECORD_SIGNATURE_ALG = "ecdsa-p256-sha256"
ACTIVATION_METHOD = "TPM2_ActivateCredential"
DEFAULT_RECORD_NAME = "enrollment.json"  # on the device: <audit.directory>/enrollment.json, read by sitsctl deploy
EK_TRUST_LEVELS = ("certificate-chain", "pinned", "certificate-unchecked", "none")  # strongest first
MAX_RECORD_BYTES = 64 * 1024
# field -> (JSON type, may be null)
RECORD_FIELDS = {"format": (str, False), "enrolled_at": (str, False), "challenge_id": (str, False),
                 "ak_handle": (str, True), "ak_name": (str, False), "ak_public": (str, False),
                 "ak_public_pem": (str, False), "ek_kind": (str, False), "ek_public": (str, False),
                 "ek_public_sha256": (str, False), "ek_public_pem": (str, False),
                 "ek_certificate_sha256": (str, True), "ek_trust": (str, False), "request_sha256": (str, True),
                 "activation": (dict, False), "record_sha256": (str, False)}
_RECORD_HINT = ("use the file `sitsctl enroll --verify RESPONSE.json -o enrollment.json` wrote, unchanged, or "
                "enroll the device again (docs/enroll.md)")


def record_signed_bytes(record: dict) -> bytes:
    """What `record_sha256` hashes and `signature` signs: RECORD_DOMAIN || canonical JSON (sorted keys, no
    whitespace, ASCII) of every field but `record_sha256` and `signature`."""
    import json

    body = {k: v for k, v in record.items() if k not in ("record_sha256", "signature")}
    return RECORD_DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def seal_record(record: dict, signing_key=None) -> dict:
    """The record with `record_sha256` and, given a P-256 private key, its `signature`."""
    import base64

    from cryptography.hazmat.primitives.asymmetric import ec as _ec

    out = {k: v for k, v in record.items() if k not in ("record_sha256", "signature")}
    out["format"] = RECORD_FORMAT
    data = record_signed_bytes(out)
    out["record_sha256"] = hashlib.sha256(data).hexdigest()
    if signing_key is not None:
        if not isinstance(signing_key, _ec.EllipticCurvePrivateKey) or signing_key.curve.name != "secp256r1":
            raise ValueError("the enrollment record signing key must be an ECDSA P-256 private key")
        out["signature"] = {"alg": RECORD_SIGNATURE_ALG, "key_id": _key_id(signing_key.public_key()),
                            "value": base64.b64encode(signing_key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()}
    return out


def _key_id(public_key) -> str:
    return hashlib.sha256(public_key.public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def _spki_der(pem) -> bytes | None:
    from cryptography.exceptions import UnsupportedAlgorithm

    try:
        key = serialization.load_pem_public_key(pem if isinstance(pem, bytes) else str(pem).encode())
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def ak_fingerprint(ak_public_pem) -> str:
    """SHA-256 of an AK's SubjectPublicKeyInfo (hex, first 16 digits): how errors name an AK."""
    der = _spki_der(ak_public_pem)
    return hashlib.sha256(der).hexdigest()[:16] if der is not None else "(not a public key)"


@dataclass(frozen=True)
class Enrollment:
    """A checked enrollment record: the one AK its reader trusts."""

    path: str
    ak_public_pem: bytes  # derived from the AK public area whose Name the credential was bound to
    ak_name: str
    ak_handle: str | None
    ek_kind: str
    ek_trust: str
    ek_public_sha256: str
    enrolled_at: str
    challenge_id: str
    signed_by: str | None  # key id of the key whose signature was checked and verified; None otherwise
    signature_checked: bool  # True only when the reader gave the signer's public key and it verified
    claimed_signed_by: str | None = None  # the key id a signature names, when nobody checked it (no authority)

    @property
    def trust(self) -> str:
        """How far the record itself is vouched for: "enrolled" (its signature by the reader's enrollment
        authority verified) or "enrolled-unverified" (digest only: whoever could write the file chose the AK)."""
        return "enrolled" if self.signature_checked else "enrolled-unverified"

    @property
    def ak_fingerprint(self) -> str:
        return ak_fingerprint(self.ak_public_pem)

    def matches(self, ak_public_pem) -> bool:
        """Whether `ak_public_pem` (PEM, bytes or str) is the enrolled AK."""
        der = _spki_der(ak_public_pem)
        return der is not None and hmac.compare_digest(der, _spki_der(self.ak_public_pem))

    def describe(self) -> dict:
        return {"file": self.path, "ak_name": self.ak_name, "ak_sha256": self.ak_fingerprint,
                "ak_handle": self.ak_handle, "ek_kind": self.ek_kind, "ek_trust": self.ek_trust,
                "ek_public_sha256": self.ek_public_sha256, "enrolled_at": self.enrolled_at,
                "signature_checked": self.signature_checked,
                **({"signed_by": self.signed_by} if self.signature_checked else
                   {"claimed_signed_by": self.claimed_signed_by})}


def _record_error(where: str, what: str, fix: str = _RECORD_HINT) -> EnrollError:
    return EnrollError(f"enrollment record {where}: {what}; {fix}", "record")


def ek_trust_requirement_problem(min_ek_trust: str | None, authority, *, option: str = "min_ek_trust",
                                 authority_option: str = "authority") -> str | None:
    """Why requiring `min_ek_trust` without an enrollment authority key means nothing (None when it is fine):
    ek_trust is a field of the record, and an unsigned record (or one whose signature nobody checks) can be
    edited by anyone who then recomputes its digest. Only "none" (no requirement) goes without a key."""
    if min_ek_trust is None or min_ek_trust == "none" or authority is not None:
        return None
    return (f"{option} {min_ek_trust} needs {authority_option}: ek_trust is a field of the enrollment record, and "
            "without the enrolling verifier's public key to check the record's signature anyone who can write the "
            "record can set it to any level and recompute its digest. Give the verifier's public key (the record "
            "signed with `sitsctl enroll --verify --signing-key KEY.pem`), or drop the requirement")


class EnrollOptionError(EnrollError):
    """The options given to check an enrollment record do not make sense (a requirement without a key, an
    unreadable authority key); the record itself was not judged. Code "options"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, "options")


def load_enrollment_checked(path, *, authority_path=None, min_ek_trust: str | None = None,
                            ek_trust_option: str = "--require-ek-trust",
                            authority_option: str = "--enrollment-authority") -> Enrollment:
    """`load_enrollment` as the command-line tools call it: `authority_path` names the enrolling verifier's public
    key (PEM) or is None. EnrollOptionError (a subclass of EnrollError) when the options themselves are wrong,
    named by `ek_trust_option` / `authority_option`; EnrollError code "record" when the record does not check."""
    from .policy import PolicyError, load_authority_public

    problem = ek_trust_requirement_problem(min_ek_trust, authority_path, option=ek_trust_option,
                                           authority_option=f"{authority_option} PUB.pem")
    if problem is not None:
        raise EnrollOptionError(problem)
    authority = None
    if authority_path is not None:
        try:
            authority = load_authority_public(authority_path)
        except PolicyError as exc:
            raise EnrollOptionError(f"{authority_option}: {exc.reason}") from None
    return load_enrollment(path, authority=authority, min_ek_trust=min_ek_trust)


def _no_duplicate_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def load_enrollment(path, *, authority=None, min_ek_trust: str | None = None) -> Enrollment:
    """Read and check the enrollment record at `path` (see above). `authority`: the enrolling verifier's P-256
    public key; when given the record must carry its valid signature. `min_ek_trust`: the weakest EK trust
    level accepted (EK_TRUST_LEVELS, strongest first); None accepts any. A level above "none" needs `authority`
    (ValueError otherwise: the level is a field of the record, which only the signature protects). Raises
    EnrollError code "record" saying what is wrong, where, and how to fix it. `Enrollment.signed_by` is set only
    when the signature was checked (else the key id it names is `claimed_signed_by`), and `Enrollment.trust` is
    "enrolled" then, "enrolled-unverified" otherwise."""
    import json

    where = str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise _record_error(where, f"cannot read it ({exc.strerror or exc})",
                            "copy the record `sitsctl enroll --verify` wrote to this path, or give its path") from None
    if len(data) > MAX_RECORD_BYTES:
        raise _record_error(where, f"larger than {MAX_RECORD_BYTES} bytes: not an enrollment record")
    try:
        record = json.loads(data, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as exc:
        raise _record_error(where, f"key {exc.key!r} appears twice in one JSON object: readers could disagree on "
                            "which value counts; the record was edited") from None
    except ValueError as exc:
        line = f" at line {exc.lineno} column {exc.colno}" if hasattr(exc, "lineno") else ""
        raise _record_error(where, f"not JSON{line} ({getattr(exc, 'msg', exc)})") from None
    return check_enrollment(record, where, authority=authority, min_ek_trust=min_ek_trust)


def check_enrollment(record, where: str = "(in memory)", *, authority=None,
                     min_ek_trust: str | None = None) -> Enrollment:
    """`load_enrollment` on an already parsed record."""
    import base64
    import string

    problem = ek_trust_requirement_problem(min_ek_trust, authority)
    if problem is not None:
        raise ValueError(problem)
    if min_ek_trust is not None and min_ek_trust not in EK_TRUST_LEVELS:
        raise ValueError(f"min_ek_trust must be one of {EK_TRUST_LEVELS}, got {min_ek_trust!r}")
    if not isinstance(record, dict):
        raise _record_error(where, f"a JSON {type(record).__name__}, not an object")
    fmt = record.get("format")
    if fmt == RECORD_FORMAT_V1:
        raise _record_error(where, f"format {RECORD_FORMAT_V1} was written by an older sitsctl and carries no "
                            "integrity digest", "enroll the device again with this sitsctl (docs/enroll.md)")
    if fmt != RECORD_FORMAT:
        raise _record_error(where, f"format {fmt!r} is not {RECORD_FORMAT!r}: not an enrollment record (a request, "
                            "challenge or response of `sitsctl enroll`, or another file?)")
    for field, (kind, nullable) in RECORD_FIELDS.items():
        if field not in record:
            raise _record_error(where, f"field {field!r} is missing")
        value = record[field]
        if not (isinstance(value, kind) or (nullable and value is None)):
            raise _record_error(where, f"field {field!r} must be a {'string' if kind is str else 'JSON object'}"
                                f"{' or null' if nullable else ''}, got {type(value).__name__}")
    extra = sorted(set(record) - set(RECORD_FIELDS) - {"signature"})
    if extra:
        raise _record_error(where, f"unknown field(s) {', '.join(map(repr, extra))}: the record was edited")

    # integrity first: a record edited after it was written says so, whatever field was edited
    data = record_signed_bytes(record)
    claimed = record["record_sha256"]
    if len(claimed) != 64 or any(c not in string.hexdigits for c in claimed):
        raise _record_error(where, "record_sha256 is not 64 hex digits: the record was edited or damaged",
                            "restore the original file, or enroll the device again (docs/enroll.md)")
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), claimed.lower()):
        raise _record_error(where, "record_sha256 does not match its contents: the record was edited or damaged "
                            "after `sitsctl enroll --verify` wrote it",
                            "restore the original file, or enroll the device again (docs/enroll.md)")
    signature = record.get("signature")
    signed_by = None
    if signature is not None:
        if not isinstance(signature, dict) or signature.get("alg") != RECORD_SIGNATURE_ALG \
                or not isinstance(signature.get("key_id"), str) or not isinstance(signature.get("value"), str):
            raise _record_error(where, f"field 'signature' must be {{\"alg\": \"{RECORD_SIGNATURE_ALG}\", \"key_id\": "
                                "hex, \"value\": base64}")
        signed_by = signature["key_id"]
    if authority is not None:
        want = _key_id(authority)
        if signature is None:
            raise _record_error(where, f"not signed, and a signature by the enrollment key {want[:16]}… is required",
                                "have the verifier sign it: `sitsctl enroll --verify ... --signing-key KEY.pem`")
        if signed_by != want:
            raise _record_error(where, f"signed by key {signed_by[:16]}…, not by the trusted enrollment key "
                                f"{want[:16]}…", "get the record from the verifier that holds the trusted key, or "
                                "give that verifier's public key")
        try:
            authority.verify(base64.b64decode(signature["value"], validate=True), data, ec.ECDSA(hashes.SHA256()))
        except Exception:  # InvalidSignature, a bad base64 or DER
            raise _record_error(where, "the signature does not verify: the record was altered (the digest was "
                                "recomputed) or forged", "get the original record from the verifier") from None

    # the AK: a TPM-resident restricted signing key, whose Name the credential was bound to
    def b64(field: str) -> bytes:
        try:
            return base64.b64decode(record[field], validate=True)
        except ValueError:
            raise _record_error(where, f"field {field!r} is not base64") from None

    try:
        ak = parse_public(b64("ak_public"), "AK public area (field 'ak_public')")
        check_ak(ak)
        check_ak_usable(ak)
        ek = parse_public(b64("ek_public"), "EK public area (field 'ek_public')")
        check_ek(ek)
    except EnrollError as exc:
        raise _record_error(where, exc.reason) from None
    name = ak.name().hex()
    activation = record["activation"]
    if activation.get("method") != ACTIVATION_METHOD:
        raise _record_error(where, f"activation.method is {activation.get('method')!r}, not {ACTIVATION_METHOD!r}: "
                            "the record does not say the AK was bound to the EK by credential activation")
    if record["ak_name"].lower() != name or str(activation.get("ak_name", "")).lower() != name:
        raise _record_error(where, f"the AK Name the credential was made for ({activation.get('ak_name')}) or "
                            f"ak_name ({record['ak_name']}) is not the Name of the AK public area ({name})")
    if activation.get("challenge_id") != record["challenge_id"]:
        raise _record_error(where, "activation.challenge_id is not the record's challenge_id")
    if _spki_der(record["ak_public_pem"]) != ak.public_key_der():
        raise _record_error(where, "ak_public_pem is not the key of the AK public area (field 'ak_public')")
    ek_sha = hashlib.sha256(ek.public_key_der()).hexdigest()
    if record["ek_public_sha256"].lower() != ek_sha or _spki_der(record["ek_public_pem"]) != ek.public_key_der():
        raise _record_error(where, "ek_public_sha256 or ek_public_pem is not the key of the EK public area "
                            "(field 'ek_public')")
    if str(activation.get("ek_public_sha256", "")).lower() != ek_sha:
        raise _record_error(where, "the credential was encrypted to another EK (activation.ek_public_sha256) than "
                            "the record's")
    if record["ek_kind"] != ek.kind:
        raise _record_error(where, f"ek_kind {record['ek_kind']!r} is not the EK public area's type ({ek.kind})")
    trust = record["ek_trust"]
    if trust not in EK_TRUST_LEVELS:
        raise _record_error(where, f"ek_trust {trust!r} is none of {', '.join(EK_TRUST_LEVELS)}")
    if min_ek_trust is not None:
        if EK_TRUST_LEVELS.index(trust) > EK_TRUST_LEVELS.index(min_ek_trust):
            raise _record_error(where, f"the EK was enrolled with ek_trust {trust!r}, this reader requires at least "
                                f"{min_ek_trust!r}", "enroll the device again with --ek-ca (the TPM manufacturer's "
                                "CA) or --expect-ek (the EK recorded at commissioning)")
    checked = authority is not None  # and it verified: every failure above raised
    return Enrollment(where, ak.public_key_pem(), name, record["ak_handle"], ek.kind, trust, ek_sha,
                      record["enrolled_at"], record["challenge_id"], signed_by if checked else None, checked,
                      None if checked else signed_by)


class EnrolledSessionVerifier:
    """The PLC side of tpm-session for an enrolled device: an `attestation.session.SessionVerifier` that trusts
    the enrollment's AK and nothing else. A credential quoted by any other AK is refused with CredentialError
    code "ak" naming the enrollment file and both AKs. Other arguments as SessionVerifier's (model, freshness,
    device key, approval, replay_state ...); everything else is delegated to it."""

    def __init__(self, enrollment: Enrollment, expected_model_sha256: bytes, **options) -> None:
        from ..session import SessionVerifier

        self.enrollment = enrollment
        self._verifier = SessionVerifier(enrollment.ak_public_pem, expected_model_sha256, **options)

    def accept(self, credential_bytes: bytes, nonce: bytes):
        from ..session import CredentialError, SessionCredential

        try:
            return self._verifier.accept(credential_bytes, nonce)
        except CredentialError as exc:
            if exc.code != "ak":
                raise
            try:
                other = ak_fingerprint(SessionCredential.from_cbor(credential_bytes).ak_public_pem)
            except CredentialError:
                other = "(unreadable)"
            e = self.enrollment
            raise CredentialError(f"session credential quoted by AK sha256:{other}…, not by the AK enrolled in "
                                  f"{e.path} (sha256:{e.ak_fingerprint}…, name {e.ak_name[:20]}…): another TPM, or "
                                  "an AK re-created since the enrollment; refused (enroll the device again if its "
                                  "AK was legitimately replaced)", "ak") from None

    def __getattr__(self, name):
        if name == "_verifier":  # not set yet (__init__ raised): no recursion
            raise AttributeError(name)
        return getattr(self._verifier, name)
