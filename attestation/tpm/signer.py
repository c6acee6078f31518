"""Per-command ECDSA P-256 signing (COSE ES256) with a key that never leaves the TPM (TPM2_Sign).

The signing key is persisted at attestation.key_handle, 0x81000001 by default (created on first use: a
primary key under the owner hierarchy, used by password (USERWITHAUTH, empty authPolicy), NODA so unclean
restarts never trip dictionary-attack lockout). A key found there is checked first: anything else (the
PolicyAuthorize-bound device key of `sitsctl deploy`, which lives at attestation.device_key_handle, an AK,
an RSA key) is refused at open, never used. One ESAPI context, used only from the signer's TPM thread (ESYS is not
thread-safe; attestation.tpm.worker): every call bounded, so a hung TPM costs the loop a sign error, never a stall.
"""
from __future__ import annotations

import hashlib
import os
import time

from cryptography.hazmat.primitives import serialization

from ..cose import es256_signature
from ..envelope import ALG_ECDSA_P256_SHA256, Command, assemble, key_id_of, to_be_signed
from ..errors import TpmError
from .worker import TPM_SETUP_TIMEOUT_S, BoundedEsapi, TpmLock, TpmWorker

DEFAULT_KEY_HANDLE = 0x81000001  # tpm-direct: the password signing key (attestation.key_handle)
DEFAULT_DEVICE_KEY_HANDLE = 0x81000003  # the PolicyAuthorize-bound device key (attestation.device_key_handle)
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

class WrongKeyError(TpmError):
    """The object at tpm-direct's key handle is not a password ECC P-256 signing key."""


def describe_key(area) -> str:
    """What a TPMT_PUBLIC is, in words: type, curve, scheme, attributes, authPolicy."""
    t = _tss()
    kind = str(t.TPM2_ALG(int(area.type))).upper()
    if int(area.type) == int(t.TPM2_ALG.ECC):
        ecc = area.parameters.eccDetail
        kind += f" {str(t.TPM2_ECC(int(ecc.curveID))).upper()}, scheme {str(t.TPM2_ALG(int(ecc.scheme.scheme)))}"
    attrs = str(t.TPMA_OBJECT(int(area.objectAttributes))) or "none"
    policy = bytes(area.authPolicy)
    return (f"{kind}, attributes {attrs}, authPolicy "
            f"{policy.hex()[:16] + '…' if policy else 'empty'}")


def password_signing_key_problems(area) -> list[str]:
    """Why a TPMT_PUBLIC is not a key tpm-direct can sign with (ECDSA P-256 over an external digest, by
    password, without dictionary-attack protection); empty when it is."""
    t = _tss()
    a = t.TPMA_OBJECT
    attrs = int(area.objectAttributes)
    problems = []
    if int(area.type) != int(t.TPM2_ALG.ECC):
        problems.append(f"not an ECC key ({str(t.TPM2_ALG(int(area.type))).upper()})")
    else:
        ecc = area.parameters.eccDetail
        if int(ecc.curveID) != int(t.TPM2_ECC.NIST_P256):
            problems.append(f"not on curve P-256 ({str(t.TPM2_ECC(int(ecc.curveID))).upper()})")
        scheme = int(ecc.scheme.scheme)
        if scheme == int(t.TPM2_ALG.ECDSA):
            if int(ecc.scheme.details.ecdsa.hashAlg) != int(t.TPM2_ALG.SHA256):
                problems.append("its ECDSA scheme is fixed to another hash than SHA-256")
        elif scheme != int(t.TPM2_ALG.NULL):
            problems.append(f"its scheme is {str(t.TPM2_ALG(scheme))}, not ECDSA")
    if not attrs & int(a.SIGN_ENCRYPT):
        problems.append("not a signing key (no SIGN_ENCRYPT)")
    if attrs & int(a.RESTRICTED):
        problems.append("restricted (an attestation key: it signs only TPM-generated data)")
    if bytes(area.authPolicy):
        problems.append("bound to a policy (authPolicy set)")
    if not attrs & int(a.USERWITHAUTH):
        problems.append("not usable by password (no USERWITHAUTH)")
    if not attrs & int(a.NODA):
        problems.append("dictionary-attack protected (no NODA: unclean restarts would lock the TPM out)")
    return problems


def wrong_key_message(handle: int, area, problems: list[str]) -> str:
    """Refusal of the object at tpm-direct's `handle`: what is there, why it will not do, how to fix it."""
    a = _tss().TPMA_OBJECT
    attrs = int(area.objectAttributes)
    policy_bound = bool(bytes(area.authPolicy)) and not attrs & int(a.USERWITHAUTH)
    hint = ("; if it is the PolicyAuthorize-bound device key an earlier `sitsctl deploy` or certify_session "
            f"provisioned there (and a PLC trusts), keep it instead: set attestation.device_key_handle: "
            f"0x{handle:08x} and key_handle to a free handle" if policy_bound else "")
    return (f"attestation.key_handle 0x{handle:08x}: tpm-direct signs every command by password with the key "
            f"there, but that key is {'; '.join(problems)} (found: {describe_key(area)}); nothing was signed\n"
            f"  fix: set attestation.key_handle to a free persistent handle (`tpm2_getcap handles-persistent` lists "
            f"the used ones; sitsd creates its key there), or evict the key if nothing needs it (`tpm2_evictcontrol "
            f"-C o -c 0x{handle:08x}`) and sitsd creates a new one at the next start (give the PLC its public key)"
            f"{hint}")


SIGN_TIMEOUT_S = 1.0  # one TPM2_Sign (swtpm ~0.5 ms, a discrete TPM tens of ms; the loop's deadline is 8 ms): a hang


class TpmSigner:
    """tpm-direct: every command signed by TPM2_Sign with the persistent password key at `key_handle`.

    Every TPM call runs on the signer's own TPM thread (attestation.tpm.worker) and is bounded: `sign_command` waits at
    most SIGN_TIMEOUT_S (looked up at each call) for the lock and the TPM, else raises TpmError (the loop counts a
    sign error and alerts; nothing unsigned leaves). While a call the TPM never answered is outstanding, later calls
    fail at once; when it answers again, signing resumes (after a TPM that went away: the context is reopened, at
    most a few times a second). The measurement log and the audit anchor share the context and the lock through
    `_open_esapi` (each call bounded by TPM_CALL_TIMEOUT_S). `close` never waits for a hung TPM."""

    kind = "tpm"
    algorithm = ALG_ECDSA_P256_SHA256

    def __init__(self, tcti: str, key_handle: int = DEFAULT_KEY_HANDLE) -> None:
        if not tcti:
            raise TpmError("no TCTI given; use device:/dev/tpmrm0 for the kernel resource manager "
                           "or swtpm:path=<socket> for swtpm (the library default is never used)")
        t = _tss()
        self.tcti = tcti
        self.key_handle = key_handle
        self._lock = TpmLock(f"the TPM at {tcti!r}")  # shared with the measurement log and the audit anchor
        self._worker = TpmWorker(tcti)
        self._last_reopen = 0.0
        self.reconnects = 0
        self._esapi = None
        try:
            self._esapi = self._worker.call("opening the TPM", t.ESAPI, tcti, timeout_s=TPM_SETUP_TIMEOUT_S)
        except Exception as exc:  # TSS2_Exception, TCTI load failure, no answer in time
            self._worker.stop()
            raise TpmError(f"cannot open TPM through TCTI {tcti!r}: {exc}") from exc

        def setup():
            key, created = self._load_or_create_key()
            pub, _, _ = self._esapi.read_public(key)
            return key, created, pub.publicArea, pub.to_pem()

        try:
            self._key, self.created, area, self._public_pem = self._worker.call(
                "loading the signing key", setup, timeout_s=TPM_SETUP_TIMEOUT_S)
            problems = password_signing_key_problems(area)
            if problems:
                raise WrongKeyError(wrong_key_message(key_handle, area, problems))
        except WrongKeyError:
            self._abandon()
            raise
        except Exception as exc:
            self._abandon()
            raise TpmError(f"TPM at {tcti!r}: cannot load or create the signing key at "
                           f"0x{key_handle:08x}: {exc}") from exc
        self._public_key = serialization.load_pem_public_key(self._public_pem)
        self.key_id = key_id_of(self._public_key)
        self._scheme = t.TPMT_SIG_SCHEME(scheme=t.TPM2_ALG.ECDSA)
        self._scheme.details.any.hashAlg = t.TPM2_ALG.SHA256
        self._ticket = t.TPMT_TK_HASHCHECK(tag=t.TPM2_ST.HASHCHECK, hierarchy=t.TPM2_RH.NULL)

    def _load_or_create_key(self):
        """On the TPM thread."""
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

    def _open_esapi(self) -> BoundedEsapi:
        """The context for the measurement log and the audit anchor (they hold `_lock`): each call bounded."""
        if self._esapi is None:
            raise TpmError("TpmSigner is closed")
        return BoundedEsapi(self._worker, getter=lambda: self._esapi)

    def measure_model(self, model_sha256: bytes, pcr: int = MODEL_PCR) -> bytes:
        """Extend the model hash into a PCR; returns the new PCR value."""
        t = _tss()
        digests = t.TPML_DIGEST_VALUES([t.TPMT_HA(hashAlg=t.TPM2_ALG.SHA256, digest=t.TPMU_HA(sha256=model_sha256))])
        with self._lock:
            esapi = self._open_esapi()
            esapi.pcr_extend(getattr(t.ESYS_TR, f"PCR{pcr}"), digests)
            _, _, values = esapi.pcr_read(t.TPML_PCR_SELECTION.parse(f"sha256:{pcr}"))
            return bytes(values.digests[0])

    def sign_command(self, cmd: Command) -> bytes:
        signed, parts = to_be_signed(cmd, self.algorithm, self.key_id)
        digest = hashlib.sha256(signed).digest()  # TPM2_Sign takes the digest; ES256 hashes with SHA-256
        bound = SIGN_TIMEOUT_S  # looked up now: tests may lower it
        if not self._lock.acquire(timeout=bound):
            raise TpmError(f"TPM2_Sign not attempted: the TPM at {self.tcti!r} has been busy for more than "
                           f"{bound:g} s (another TPM command has not returned: hung or overloaded)")
        try:
            if self._esapi is None:
                raise TpmError("TpmSigner is closed")
            sig = self._worker.call("TPM2_Sign", self._sign_on_tpm_thread, digest, timeout_s=bound)
        finally:
            self._lock.release()
        r = int.from_bytes(bytes(sig.signature.ecdsa.signatureR), "big")
        s = int.from_bytes(bytes(sig.signature.ecdsa.signatureS), "big")
        return assemble(parts, es256_signature(r, s))  # COSE wants r||s, not DER

    def _sign_on_tpm_thread(self, digest: bytes):
        t = _tss()
        esapi = self._esapi
        if esapi is None:
            raise TpmError("TpmSigner is closed")
        try:
            return esapi.sign(self._key, t.TPM2B_DIGEST(digest), self._scheme, self._ticket)
        except t.TSS2_Exception as exc:
            # the TPM (or its resource manager / swtpm) went away: reopen the context, at most a few times a
            # second, and retry once; the key is persistent, so it is found again
            if not self._reopen_on_tpm_thread():
                raise TpmError(f"TPM2_Sign with key 0x{self.key_handle:08x} through {self.tcti!r} failed: "
                               f"{exc}") from exc
        try:
            return self._esapi.sign(self._key, t.TPM2B_DIGEST(digest), self._scheme, self._ticket)
        except t.TSS2_Exception as exc2:
            raise TpmError(f"TPM2_Sign with key 0x{self.key_handle:08x} through {self.tcti!r} failed "
                           f"after reconnecting: {exc2}") from exc2

    def _reopen_on_tpm_thread(self, min_interval_s: float = 0.2) -> bool:
        if self._esapi is None:  # closed meanwhile
            return False
        fresh = reopen(self, self.key_handle, min_interval_s)
        if fresh is None:
            return False
        self._esapi, self._key = fresh
        return True

    def _reopen(self, min_interval_s: float = 0.2) -> bool:
        """A fresh ESAPI context and key handle after an I/O failure (caller holds the lock; the audit anchor's
        counter calls it), on the TPM thread and bounded; False while the TPM is gone or a call still hangs."""
        if self._worker.busy:
            return False  # the old context is still inside a call: reopening would race it; retried later
        try:
            return self._worker.call("reconnecting to the TPM", self._reopen_on_tpm_thread, min_interval_s)
        except TpmError:
            return False

    def _abandon(self) -> None:
        esapi, self._esapi = self._esapi, None
        self._worker.abandon(esapi)

    def close(self) -> None:
        """Never waits for a hung TPM (at most ~2 s): the context is closed only if the TPM thread is free."""
        if not self._lock.acquire(timeout=1.0):
            self._esapi = None  # a hung call holds the lock and the context: the process exit reclaims them
            self._worker.stop()
            return
        try:
            self._abandon()
        finally:
            self._lock.release()
