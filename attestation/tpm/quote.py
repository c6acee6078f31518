"""TPM2_Quote with a restricted attestation key (AK), and its verification in pure Python.

The AK is an ECC P-256 ECDSA-SHA256 signing key with TPMA_OBJECT.RESTRICTED: the TPM signs with it
only structures it generated itself (TPMS_ATTEST starting with TPM_GENERATED_VALUE), never an
external digest, so a quote signed by it cannot be forged by anyone who can merely use the key.
It is a primary key under the owner hierarchy (NODA, null symmetric: a restricted signing key
refuses any other), persisted at 0x81000002 on first use.

`Quote.signature` is r||s (2 x 32 bytes big endian), the same form as a COSE ES256 signature,
not DER. `Quote.pcrs` maps each quoted PCR (SHA-256 bank) to the value read next to the quote;
the quote's pcrDigest is SHA-256 over those values concatenated in ascending PCR order.

`verify_quote` needs no TPM: `cryptography` for the signature and tpm2-pytss's marshalling
(libtss2-mu) to parse TPMS_ATTEST.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from ..cose import es256_signature
from ..errors import AttestationError, TpmError
from .signer import _tss, persist_p256_primary  # lazy import of tpm2_pytss; also sets TSS2_LOG before it loads

AK_HANDLE = 0x81000002
PCR_COUNT = 24
MAX_EXTRA_DATA = 64  # TPM2B_DATA holds at most sizeof(TPMU_HA) bytes
MAX_ATTEST_BYTES = 1024  # a one-bank quote is ~145 bytes; the cap bounds work on hostile input
_P256 = 32
_QUOTE_TRIES = 3


class QuoteError(AttestationError):
    """A quote does not verify. `reason` says what failed in words; `code` is one of: key, signature,
    malformed, magic, type, nonce (extraData), pcr-selection, pcr-digest, pcr-value."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True)
class Quote:
    attest: bytes  # the marshalled TPMS_ATTEST the AK signed
    signature: bytes  # ECDSA P-256 over SHA-256(attest), r||s
    pcrs: Mapping[int, bytes]  # PCR index -> 32-byte SHA-256 bank value, as quoted
    ak_public_pem: bytes


# --- TPM side --------------------------------------------------------------------------------

def load_or_create_ak(esapi, ak_handle: int = AK_HANDLE):
    """The AK's ESYS_TR and whether it was created now. An object already at `ak_handle` must be a
    restricted P-256 ECDSA-SHA256 signing key: anything else there (the unrestricted device key,
    say) could sign forged quotes, so it is refused, never used."""
    t = _tss()
    try:
        ak = esapi.tr_from_tpmpublic(ak_handle)
    except t.TSS2_Exception:
        ak = None
    if ak is not None:
        _check_ak(esapi, ak, ak_handle)
        return ak, False
    a = t.TPMA_OBJECT
    return persist_p256_primary(esapi, a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN | a.USERWITHAUTH
                                | a.SIGN_ENCRYPT | a.NODA | a.RESTRICTED, ak_handle), True


def _check_ak(esapi, ak, ak_handle: int) -> None:
    t = _tss()
    pub, _, _ = esapi.read_public(ak)
    area = pub.publicArea
    a = t.TPMA_OBJECT
    need = a.RESTRICTED | a.SIGN_ENCRYPT | a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN
    attrs = int(area.objectAttributes)
    ecc = area.parameters.eccDetail
    ok = (area.type == t.TPM2_ALG.ECC and attrs & int(need) == int(need) and not attrs & int(a.DECRYPT)
          and ecc.curveID == t.TPM2_ECC.NIST_P256 and ecc.scheme.scheme == t.TPM2_ALG.ECDSA
          and ecc.scheme.details.ecdsa.hashAlg == t.TPM2_ALG.SHA256)
    if not ok:
        raise TpmError(f"the object at 0x{ak_handle:08x} is not a restricted ECC P-256 ECDSA-SHA256 signing key "
                       f"(attributes 0x{attrs:08x}); it cannot serve as attestation key. Evict it or choose "
                       "another AK handle")


def ak_public_pem(esapi, ak) -> bytes:
    """The AK's SubjectPublicKeyInfo PEM, in `cryptography`'s one canonical form."""
    pub, _, _ = esapi.read_public(ak)
    pem = pub.to_pem()
    return serialization.load_pem_public_key(pem).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def pcr_selection(pcrs: Sequence[int]):
    t = _tss()
    return t.TPML_PCR_SELECTION.parse("sha256:" + ",".join(str(i) for i in pcrs))


def read_pcrs(esapi, pcrs: Sequence[int]) -> dict[int, bytes]:
    """SHA-256 bank values of `pcrs` (sorted, at most 8: one TPM2_PCR_Read)."""
    pcrs = sorted(pcrs)
    _, _, values = esapi.pcr_read(pcr_selection(pcrs))  # bind first: cffi frees unnamed results
    digests = [bytes(values.digests[i]) for i in range(len(values.digests))]
    if len(digests) != len(pcrs):
        raise TpmError(f"TPM2_PCR_Read of sha256:{pcrs} returned {len(digests)} values (is the SHA-256 bank on?)")
    return dict(zip(pcrs, digests))


def extend_pcr(esapi, pcr: int, digest: bytes) -> bytes:
    """Extend a SHA-256 digest into `pcr`; returns the new value."""
    t = _tss()
    dv = t.TPML_DIGEST_VALUES([t.TPMT_HA(hashAlg=t.TPM2_ALG.SHA256, digest=t.TPMU_HA(sha256=bytes(digest)))])
    esapi.pcr_extend(getattr(t.ESYS_TR, f"PCR{pcr}"), dv)
    return read_pcrs(esapi, [pcr])[pcr]


def quote(esapi, ak_handle, pcrs: list[int], extra_data: bytes) -> Quote:
    """One TPM2_Quote of the SHA-256 bank of `pcrs` with `extra_data` (at most 64 bytes) signed by the AK.
    `ak_handle` is the AK's ESYS_TR or its persistent handle (0x81xxxxxx). The PCRs are read next
    to the quote; should one change in between (another process extending it), the read and the
    quote are repeated, and TpmError raised if they never agree."""
    t = _tss()
    pcrs = _check_pcr_list(pcrs)
    extra_data = bytes(extra_data)
    if len(extra_data) > MAX_EXTRA_DATA:
        raise ValueError(f"quote extra data is {len(extra_data)} bytes, at most {MAX_EXTRA_DATA} fit")
    ak = ak_handle if isinstance(ak_handle, t.ESYS_TR) else esapi.tr_from_tpmpublic(ak_handle)
    pem = ak_public_pem(esapi, ak)
    selection = pcr_selection(pcrs)
    scheme = t.TPMT_SIG_SCHEME(scheme=t.TPM2_ALG.NULL)  # the AK's own: ECDSA-SHA256
    for _ in range(_QUOTE_TRIES):
        values = read_pcrs(esapi, pcrs)
        att, sig = esapi.quote(ak, selection, t.TPM2B_DATA(extra_data), scheme)
        attest = bytes(att)
        if sig.sigAlg != t.TPM2_ALG.ECDSA or sig.signature.ecdsa.hash != t.TPM2_ALG.SHA256:
            raise TpmError(f"AK signed the quote with {sig.sigAlg}, not ECDSA-SHA256")
        ecdsa = sig.signature.ecdsa
        r, s = bytes(ecdsa.signatureR), bytes(ecdsa.signatureS)
        result = Quote(attest, es256_signature(int.from_bytes(r, "big"), int.from_bytes(s, "big")), values, pem)
        if _attested_pcr_digest(attest) == _pcr_digest(values):
            return result
    raise TpmError(f"PCRs {pcrs} kept changing between TPM2_PCR_Read and TPM2_Quote ({_QUOTE_TRIES} tries)")


def _attested_pcr_digest(attest: bytes) -> bytes:
    t = _tss()
    a, _ = t.types.TPMS_ATTEST.unmarshal(attest)
    q = a.attested.quote
    return bytes(q.pcrDigest)


def _check_pcr_list(pcrs) -> list[int]:
    pcrs = sorted(set(pcrs))
    if not pcrs or len(pcrs) > 8 or not all(type(i) is int and 0 <= i < PCR_COUNT for i in pcrs):
        raise ValueError(f"quote between 1 and 8 PCRs in 0..{PCR_COUNT - 1}, got {pcrs}")
    return pcrs


def _pcr_digest(values: Mapping[int, bytes]) -> bytes:
    return hashlib.sha256(b"".join(values[i] for i in sorted(values))).digest()


# --- verifier side (no TPM) ------------------------------------------------------------------

def verify_quote(quote: Quote, ak_public_pem: bytes, expected_extra_data: bytes,
                 expected_pcrs: Mapping[int, bytes] | None = None) -> None:
    """Check, in this order: the AK's signature over the attest bytes, that they are a TPM-generated
    quote (magic, type), its extraData, that it selects exactly `quote.pcrs` in the SHA-256 bank and
    its pcrDigest is SHA-256 over their values, and that each PCR in `expected_pcrs` has the expected
    value. `quote.ak_public_pem` is not consulted: the caller says which AK it trusts. Raises QuoteError."""
    try:
        ak = serialization.load_pem_public_key(ak_public_pem)
    except Exception as exc:
        raise QuoteError(f"trusted AK public key cannot be loaded: {exc}", "key") from None
    if not isinstance(ak, ec.EllipticCurvePublicKey) or ak.curve.name != "secp256r1":
        raise QuoteError("trusted AK must be an ECDSA P-256 key", "key")
    attest, signature, pcrs = quote.attest, quote.signature, quote.pcrs
    if not isinstance(attest, bytes) or not 0 < len(attest) <= MAX_ATTEST_BYTES:
        raise QuoteError(f"quote attest must be 1..{MAX_ATTEST_BYTES} bytes", "malformed")
    if not isinstance(signature, bytes) or len(signature) != 2 * _P256:
        raise QuoteError(f"quote signature must be r||s, {2 * _P256} bytes", "malformed")
    if (not isinstance(pcrs, Mapping) or not 0 < len(pcrs) <= 8
            or not all(type(i) is int and 0 <= i < PCR_COUNT and isinstance(v, bytes) and len(v) == 32
                       for i, v in pcrs.items())):
        raise QuoteError("quote PCR values must map 1..8 PCR indices to 32-byte SHA-256 values", "malformed")
    r, s = int.from_bytes(signature[:_P256], "big"), int.from_bytes(signature[_P256:], "big")
    try:
        ak.verify(encode_dss_signature(r, s), attest, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise QuoteError("quote signature does not verify with the trusted AK", "signature") from None

    t = _tss()
    try:
        a, end = t.types.TPMS_ATTEST.unmarshal(attest)
    except Exception as exc:  # TSS2_Exception from libtss2-mu; hostile bytes may raise anything
        raise QuoteError(f"quote attest is not a TPMS_ATTEST: {exc}", "malformed") from None
    if end != len(attest):
        raise QuoteError(f"quote attest has {len(attest) - end} bytes after its TPMS_ATTEST", "malformed")
    if a.magic != t.TPM2_GENERATED.VALUE:
        raise QuoteError(f"attest magic is 0x{int(a.magic):08x}, not TPM_GENERATED_VALUE: not made by a TPM", "magic")
    if a.type != t.TPM2_ST.ATTEST_QUOTE:
        raise QuoteError(f"attest type is 0x{int(a.type):04x}, not TPM_ST_ATTEST_QUOTE", "type")
    extra = bytes(a.extraData)
    if extra != bytes(expected_extra_data):
        raise QuoteError("quote extraData is not the expected nonce/binding (made for another nonce or key)", "nonce")
    info = a.attested.quote
    selected = info.pcrSelect.marshal()
    digest = bytes(info.pcrDigest)
    if selected != pcr_selection(sorted(pcrs)).marshal():
        raise QuoteError(f"quote selects other PCRs than sha256:{sorted(pcrs)}", "pcr-selection")
    if digest != _pcr_digest(pcrs):
        raise QuoteError(f"quote pcrDigest is not SHA-256 over the PCR values given for {sorted(pcrs)}", "pcr-digest")
    for index, value in (expected_pcrs or {}).items():
        if index not in pcrs:
            raise QuoteError(f"PCR {index} is not in the quote", "pcr-selection")
        if pcrs[index] != bytes(value):
            raise QuoteError(f"PCR {index} is {pcrs[index].hex()[:16]}…, expected {bytes(value).hex()[:16]}…",
                             "pcr-value")
