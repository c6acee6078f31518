"""The endorsement key certificate from the TPM's NV indices (TCG EK Credential Profile), where there is one.

swtpm has none unless `swtpm_setup --create-ek-cert` made it; a missing index is an answer, not an error.
"""
from __future__ import annotations

from .signer import _tss

# TCG EK Credential Profile 2.x: RSA 2048, ECC NIST P-256 (low range), RSA 3072, ECC NIST P-384 (high range)
EK_CERT_INDICES = {0x01C00002: "RSA 2048", 0x01C0000A: "ECC P-256", 0x01C0001C: "RSA 3072", 0x01C00016: "ECC P-384"}
_CHUNK = 512  # below every TPM's TPM2_PT_NV_BUFFER_MAX (swtpm: 2048, discrete TPMs: 768..1024)


def read_ek_certificates(esapi) -> list[dict]:
    """[{"index": "0x01c00002", "kind": "RSA 2048", "der": bytes, "subject": str | None}] for each present index."""
    t = _tss()
    out = []
    for index, kind in EK_CERT_INDICES.items():
        try:
            nv = esapi.tr_from_tpmpublic(index)
        except t.TSS2_Exception:
            continue  # no such index
        try:
            pub, _ = esapi.nv_read_public(nv)
            size = int(pub.nvPublic.dataSize)
            data = b""
            while len(data) < size:
                n = min(_CHUNK, size - len(data))
                # the index's own (empty) auth: EK certificate indices are AUTHREAD with no password
                data += bytes(esapi.nv_read(nv, n, len(data), auth_handle=nv))
        except t.TSS2_Exception as exc:
            out.append({"index": f"0x{index:08x}", "kind": kind, "der": None, "subject": None,
                        "error": f"present but unreadable: {exc}"})
            continue
        finally:
            esapi.tr_close(nv)
        out.append({"index": f"0x{index:08x}", "kind": kind, "der": data, "subject": _subject(data)})
    return out


def _subject(der: bytes) -> str | None:
    from cryptography import x509

    if len(der) > 4 and der[0] == 0x30 and der[1] == 0x82:  # NV indices may be padded past the DER SEQUENCE
        der = der[:4 + int.from_bytes(der[2:4], "big")]
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    return f"issuer {cert.issuer.rfc4514_string() or '(empty)'}, serial {cert.serial_number:x}"
