"""Per-command ECDSA P-256 signing (COSE ES256) with a key that never leaves the TPM (TPM2_Sign).

The device key is persisted at 0x81000001 (created on first use: a primary key under the
owner hierarchy, NODA so unclean restarts never trip dictionary-attack lockout). One ESAPI
context, used from one thread at a time (ESYS is not thread-safe): the loop thread.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time

from cryptography.hazmat.primitives import serialization

from ..cose import es256_signature
from ..envelope import ALG_ECDSA_P256_SHA256, Command, assemble, key_id_of, to_be_signed
from ..errors import TpmError

DEFAULT_KEY_HANDLE = 0x81000001
MODEL_PCR = 16

os.environ.setdefault("TSS2_LOG", "all+none")  # the C library's stderr noise; errors still raise


def _tss():
    import tpm2_pytss  # imported lazily: 100 ms, and absent where no TPM is ever used

    return tpm2_pytss



def reopen(owner, handle: int, min_interval_s: float) -> tuple | None:
    """After a TPM I/O failure: a fresh ESAPI context on `owner.tcti` and the ESYS_TR of the persistent `handle`,
    at most once per `min_interval_s` (`owner._last_reopen`). The old context (`owner._esapi`) is closed and
    `owner.reconnects` counted; None while the TPM is still gone. The caller holds its lock and stores the pair."""
    now = time.monotonic()
    if now - owner._last_reopen < min_interval_s:
        return None
    owner._last_reopen = now
    t = _tss()
    try:
        esapi = t.ESAPI(owner.tcti)
    except Exception:  # TCTI load or connect failure: still gone
        return None
    try:
        obj = esapi.tr_from_tpmpublic(handle)
    except Exception:
        esapi.close()
        return None
    try:
        owner._esapi.close()
    except Exception:  # the old context's connection is already dead
        pass
    owner.reconnects += 1
    return esapi, obj

class TpmSigner:
    kind = "tpm"
    algorithm = ALG_ECDSA_P256_SHA256

    def __init__(self, tcti: str, key_handle: int = DEFAULT_KEY_HANDLE) -> None:
        if not tcti:
            raise TpmError("no TCTI given; use device:/dev/tpmrm0 for the kernel resource manager "
                           "or swtpm:path=<socket> for swtpm (the library default is never used)")
        t = _tss()
        self.tcti = tcti
        self.key_handle = key_handle
        self._lock = threading.Lock()
        self._last_reopen = 0.0
        self.reconnects = 0
        try:
            self._esapi = t.ESAPI(tcti)
        except Exception as exc:  # TSS2_Exception or TCTI load failure
            raise TpmError(f"cannot open TPM through TCTI {tcti!r}: {exc}") from exc
        try:
            self._key, self.created = self._load_or_create_key()
            pub, _, _ = self._esapi.read_public(self._key)
            self._public_pem = pub.to_pem()
        except Exception as exc:
            self._esapi.close()
            raise TpmError(f"TPM at {tcti!r}: cannot load or create the signing key at "
                           f"0x{key_handle:08x}: {exc}") from exc
        self._public_key = serialization.load_pem_public_key(self._public_pem)
        self.key_id = key_id_of(self._public_key)
        self._scheme = t.TPMT_SIG_SCHEME(scheme=t.TPM2_ALG.ECDSA)
        self._scheme.details.any.hashAlg = t.TPM2_ALG.SHA256
        self._ticket = t.TPMT_TK_HASHCHECK(tag=t.TPM2_ST.HASHCHECK, hierarchy=t.TPM2_RH.NULL)

    def _load_or_create_key(self):
        t = _tss()
        e = self._esapi
        try:
            return e.tr_from_tpmpublic(self.key_handle), False
        except t.TSS2_Exception:
            pass
        a = t.TPMA_OBJECT
        attrs = a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN | a.USERWITHAUTH | a.SIGN_ENCRYPT | a.NODA
        template = t.TPM2B_PUBLIC(publicArea=t.TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs))
        handle, *_ = e.create_primary(None, template, t.ESYS_TR.OWNER)
        try:
            persistent = e.evict_control(t.ESYS_TR.OWNER, handle, self.key_handle)
        finally:
            e.flush_context(handle)
        return persistent, True

    def public_key_pem(self) -> bytes:
        return self._public_pem

    def measure_model(self, model_sha256: bytes, pcr: int = MODEL_PCR) -> bytes:
        """Extend the model hash into a PCR; returns the new PCR value."""
        t = _tss()
        digests = t.TPML_DIGEST_VALUES([t.TPMT_HA(hashAlg=t.TPM2_ALG.SHA256, digest=t.TPMU_HA(sha256=model_sha256))])
        with self._lock:
            self._esapi.pcr_extend(getattr(t.ESYS_TR, f"PCR{pcr}"), digests)
            _, _, values = self._esapi.pcr_read(t.TPML_PCR_SELECTION.parse(f"sha256:{pcr}"))
            return bytes(values.digests[0])

    def sign_command(self, cmd: Command) -> bytes:
        t = _tss()
        signed, parts = to_be_signed(cmd, self.algorithm, self.key_id)
        digest = hashlib.sha256(signed).digest()  # TPM2_Sign takes the digest; ES256 hashes with SHA-256
        with self._lock:
            try:
                sig = self._esapi.sign(self._key, t.TPM2B_DIGEST(digest), self._scheme, self._ticket)
            except t.TSS2_Exception as exc:
                # the TPM (or its resource manager / swtpm) went away: reopen the context, at most a
                # few times a second, and retry once; the key is persistent, so it is found again
                if not self._reopen():
                    raise TpmError(f"TPM2_Sign with key 0x{self.key_handle:08x} through {self.tcti!r} failed: "
                                   f"{exc}") from exc
                try:
                    sig = self._esapi.sign(self._key, t.TPM2B_DIGEST(digest), self._scheme, self._ticket)
                except t.TSS2_Exception as exc2:
                    raise TpmError(f"TPM2_Sign with key 0x{self.key_handle:08x} through {self.tcti!r} failed "
                                   f"after reconnecting: {exc2}") from exc2
        r = int.from_bytes(bytes(sig.signature.ecdsa.signatureR), "big")
        s = int.from_bytes(bytes(sig.signature.ecdsa.signatureS), "big")
        return assemble(parts, es256_signature(r, s))  # COSE wants r||s, not DER

    def _reopen(self, min_interval_s: float = 0.2) -> bool:
        """A fresh ESAPI context and key handle after an I/O failure (caller holds the lock)."""
        fresh = reopen(self, self.key_handle, min_interval_s)
        if fresh is None:
            return False
        self._esapi, self._key = fresh
        return True

    def close(self) -> None:
        with self._lock:
            if self._esapi is not None:
                self._esapi.close()
                self._esapi = None
