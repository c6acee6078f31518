"""Per-command ECDSA P-256 signing (COSE ES256) with a key that never leaves the TPM (TPM2_Sign).

The signing key is persisted at attestation.key_handle, 0x81000001 by default (created on first use: a
primary key under the owner hierarchy, used by password (USERWITHAUTH, empty authPolicy), NODA so unclean
restarts never trip dictionary-attack lockout). A key found there is checked first: anything else (the
PolicyAuthorize-bound device key of `sitsctl deploy`, which lives at attestation.device_key_handle, an AK,
an RSA key) is refused at open, never used. One ESAPI context, used only from the signer's TPM thread (ESYS is not
thread-safe; attestation.tpm.worker): every call bounded, so a hung TPM costs the loop a sign error, never a stall.
Opening is bounded by TPM_OPEN_TIMEOUT_S, loading or creating the key by TPM_SETUP_TIMEOUT_S (TpmTimeout when the TPM
never answered: sitsd's start then names the hang). `probe` (sitsd's `_watch_tpm`, every 2 s) sees a TPM that is
lost, reset or cleared while no command is signed.
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
from . import worker as _bounds  # TPM_OPEN_TIMEOUT_S, TPM_SETUP_TIMEOUT_S: looked up at each use (tests lower them)
from .worker import BoundedEsapi, TpmLock, TpmTimeout, TpmWorker, timed_out

DEFAULT_KEY_HANDLE = 0x81000001  # tpm-direct: the password signing key (attestation.key_handle)
DEFAULT_DEVICE_KEY_HANDLE = 0x81000003  # the PolicyAuthorize-bound device key (attestation.device_key_handle)
MODEL_PCR = 16

os.environ.setdefault("TSS2_LOG", "all+none")  # the C library's stderr noise; errors still raise


def _tss():
    import tpm2_pytss  # imported lazily: 100 ms, and absent where no TPM is ever used

    return tpm2_pytss



def reopen(owner, handle: int, min_interval_s: float, found: dict | None = None) -> tuple | None:
    """After a TPM I/O failure: a fresh ESAPI context on `owner.tcti` and the ESYS_TR of the persistent `handle`,
    at most once per `min_interval_s` (`owner._last_reopen`), `owner.reconnects` counted; None while the TPM is
    still gone. The old context (`owner._esapi`) is closed FIRST: a TPM without a resource manager (swtpm, a raw
    /dev/tpm0) may serve one connection at a time, so opening a second one while the old is open could wait
    forever. After a None the owner's context is closed (its calls fail; the next reopen retries). `found`, when
    given, gets "no_key": True where the fresh connection reached a TPM that holds no object at `handle` (cleared
    or replaced), as opposed to no TPM there. The caller holds its lock and stores the pair."""
    now = time.monotonic()
    if now - owner._last_reopen < min_interval_s:
        return None
    owner._last_reopen = now
    t = _tss()
    old = owner._esapi
    if old is not None:
        try:
            old.close()
        except Exception:  # the old context's connection is already dead
            pass
    try:
        esapi = t.ESAPI(owner.tcti)
    except Exception:  # TCTI load or connect failure: still gone
        return None
    try:
        obj = esapi.tr_from_tpmpublic(handle)
    except Exception as exc:
        if found is not None and isinstance(exc, t.TSS2_Exception) and (int(exc.rc) & 0xFFF) in _HANDLE_ERRORS:
            found["no_key"] = True  # connected, but no object at the handle
        esapi.close()
        return None
    owner.reconnects += 1
    return esapi, obj


def replay(measurements) -> bytes:
    """A SHA-256 PCR's value after extending `measurements` (32-byte digests) into it from zero."""
    value = b"\0" * 32
    for m in measurements:
        value = hashlib.sha256(value + bytes(m)).digest()
    return value


def clock_counts(esapi) -> tuple[int, int]:
    """(resetCount, restartCount) from TPM2_ReadClock: a TPM reset or restart moves one of them."""
    info = esapi.read_clock()
    return int(info.clockInfo.resetCount), int(info.clockInfo.restartCount)


_HANDLE_ERRORS = {0x08B, 0x084, 0x18B}  # TPM_RC_HANDLE (format 0 / 1 variants), TPM_RC_VALUE: no object there


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


def load_or_create_signing_key(esapi, key_handle: int = DEFAULT_KEY_HANDLE):
    """The password signing key (device identity, tpm-direct's key) at `key_handle`: its ESYS_TR and whether it
    was created now (a primary under the owner hierarchy, USERWITHAUTH with an empty authPolicy, NODA, persisted).
    What sits there is not checked here: callers read its public area and refuse it with
    `password_signing_key_problems` / `wrong_key_message`."""
    t = _tss()
    try:
        return esapi.tr_from_tpmpublic(key_handle), False
    except t.TSS2_Exception:
        pass
    a = t.TPMA_OBJECT
    return persist_p256_primary(esapi, a.FIXEDTPM | a.FIXEDPARENT | a.SENSITIVEDATAORIGIN | a.USERWITHAUTH
                                | a.SIGN_ENCRYPT | a.NODA, key_handle), True


def persist_p256_primary(esapi, attrs, handle: int, auth_policy: bytes = b""):
    """Create an ECC P-256 ECDSA-SHA256 primary key under the owner hierarchy with `attrs` (and `auth_policy`),
    persist it at `handle` and flush the transient (swtpm has no resource manager: a leaked transient stays).
    Returns the persistent ESYS_TR. The one place the device's keys are made: the identity key, the AK
    (attestation.tpm.quote) and the policy-bound device key (attestation.tpm.policy)."""
    t = _tss()
    area = t.TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs)
    if auth_policy:
        area.authPolicy = t.TPM2B_DIGEST(auth_policy)
    transient, *_ = esapi.create_primary(None, t.TPM2B_PUBLIC(publicArea=area), t.ESYS_TR.OWNER)
    try:
        return esapi.evict_control(t.ESYS_TR.OWNER, transient, handle)
    finally:
        esapi.flush_context(transient)


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
    sign_path = "TPM2_Sign, GIL released (each signature is a TPM command of several ms)"

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
        self.resets = 0  # TPM resets seen by `probe`
        self.unbound_reason: str | None = None  # a reset seen, PCR 16 not re-measured yet (signing goes on)
        self.identity_lost: str | None = None  # the TPM answers without our key (or with another one there)
        self._bind_state = threading.Lock()
        self.pcr = MODEL_PCR
        try:
            self._esapi = self._worker.call("opening the TPM", t.ESAPI, tcti, timeout_s=_bounds.TPM_OPEN_TIMEOUT_S)
        except Exception as exc:  # TSS2_Exception, TCTI load failure, no answer in time
            self._worker.stop()
            raise (TpmTimeout if timed_out(exc) else TpmError)(
                f"cannot open TPM through TCTI {tcti!r}: {exc}") from exc

        def setup():
            key, created = self._load_or_create_key()
            pub, _, _ = self._esapi.read_public(key)
            return key, created, pub.publicArea, pub.to_pem(), clock_counts(self._esapi)

        try:
            self._key, self.created, area, self._public_pem, self._counts = self._worker.call(
                "loading the signing key", setup, timeout_s=_bounds.TPM_SETUP_TIMEOUT_S)
            problems = password_signing_key_problems(area)
            if problems:
                raise WrongKeyError(wrong_key_message(key_handle, area, problems))
        except WrongKeyError:
            self._abandon()
            raise
        except Exception as exc:
            self._abandon()
            raise (TpmTimeout if timed_out(exc) else TpmError)(
                f"TPM at {tcti!r}: cannot load or create the signing key at 0x{key_handle:08x}: {exc}") from exc
        self._public_key = serialization.load_pem_public_key(self._public_pem)
        self.key_id = key_id_of(self._public_key)
        self._scheme = t.TPMT_SIG_SCHEME(scheme=t.TPM2_ALG.ECDSA)
        self._scheme.details.any.hashAlg = t.TPM2_ALG.SHA256
        self._ticket = t.TPMT_TK_HASHCHECK(tag=t.TPM2_ST.HASHCHECK, hierarchy=t.TPM2_RH.NULL)

    def _load_or_create_key(self):
        """On the TPM thread."""
        return load_or_create_signing_key(self._esapi, self.key_handle)

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
        lost = self.identity_lost
        if lost is not None:
            raise TpmError(f"not signed: {lost}")
        bound = SIGN_TIMEOUT_S  # looked up now: tests may lower it
        if not self._lock.acquire(timeout=bound):
            raise TpmTimeout(f"TPM2_Sign not attempted: the TPM at {self.tcti!r} has been busy for more than "
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

    # -- the probe (sitsd's `_watch_tpm`, every 2 s): a TPM that goes away, hangs, is reset or cleared while idle --

    @property
    def bound(self) -> bool:
        """PCR 16 holds the model since the last reset seen (tpm-direct signs either way: its key needs no PCR)."""
        return self.unbound_reason is None

    def probe(self) -> str | None:
        """TPM2_ReadPublic of the signing key and TPM2_ReadClock, as one bounded job on the TPM thread (two cheap
        commands, under the lock: a sign waits at most their duration). Sign errors show a TPM lost while commands
        flow; the probe also shows it while none do (no frames, a stopped line) and shows a reset, which signing
        never notices (the key is persistent) but which empties PCR 16 and the measurement PCR.

        TpmError when the TPM does not answer (the context is then reopened, rate-limited: signing needs no probe
        to recover); TpmIdentityLost (attestation.session) when it answers without the signing key, or with another
        key at `key_handle` (cleared or replaced): nothing is signed until it holds the key again. Returns None, or
        what shows a TPM reset or restart (resetCount/restartCount moved): `unbound_reason` is set until
        `remeasure` has put the model back into PCR 16."""
        from attestation.session import TpmIdentityLost  # (lazily: attestation.session imports this module)

        with self._lock:
            if self._esapi is None:
                raise TpmError("TpmSigner is closed")
            state, detail = self._worker.call("probing the TPM (TPM2_ReadPublic, TPM2_ReadClock)",
                                              self._probe_on_tpm_thread)
        if state == "gone":
            raise TpmError(f"TPM at {self.tcti!r} does not answer: {detail}")
        if state in ("no key", "other key"):
            what = (f"has no key at 0x{self.key_handle:08x} any more" if state == "no key" else
                    f"holds another key at 0x{self.key_handle:08x} than the signing key the PLC trusts")
            self.identity_lost = (
                f"the TPM at {self.tcti!r} answers but {what}: the TPM was cleared or replaced. Fix: bring back the "
                "TPM with this device's key, or restart sitsd (it creates a key at attestation.key_handle) and "
                "install the new <audit.directory>/signer.pub.pem in the PLC")
            raise TpmIdentityLost(self.identity_lost)
        if self.identity_lost is not None:
            self.identity_lost = None  # our key is back (the TPM was put back): signing resumes
        counts = detail
        if counts == self._counts:
            return None
        (r0, s0), (r1, s1) = self._counts, counts
        what = (f"TPM reset (resetCount {r0}→{r1}, restartCount {s0}→{s1}): PCR {self.pcr} no longer holds the "
                "model")
        self.resets += 1
        self.unbind(what + "; re-measurement pending")
        return what

    def _probe_on_tpm_thread(self):
        t = _tss()
        for attempt in (0, 1):
            esapi = self._esapi
            if esapi is None:
                raise TpmError("TpmSigner is closed")
            try:
                pub, _, _ = esapi.read_public(self._key)
                if pub.to_pem() != self._public_pem:
                    return "other key", None
                return "ok", clock_counts(esapi)
            except t.TSS2_Exception as exc:
                if (int(exc.rc) & 0xFFF) in _HANDLE_ERRORS:
                    return "no key", None
                error = exc
            except Exception as exc:  # a dead socket
                error = exc
            # gone (swtpm stopped, /dev/tpmrm0 reset): a fresh context, rate-limited, then one more try. The
            # reconnect itself tells a TPM that answers without the key (cleared) from none there: never a second
            # connection beside the signer's own (without a resource manager it could wait forever)
            found: dict = {}
            if attempt or not self._reopen_on_tpm_thread(min_interval_s=1.0, found=found):
                if found.get("no_key"):
                    return "no key", None
                return "gone", str(error)
        return "gone", "no answer"  # (not reached)

    def unbind(self, reason: str) -> None:
        """PCR 16 does not hold the model (a reset seen, or re-measuring it failed). Signing goes on: the
        tpm-direct key needs no PCR; `tpm.bound` in sitsd's status says it."""
        with self._bind_state:
            self.unbound_reason = reason

    def remeasure(self, measurements, still_current=None) -> bytes:
        """After a TPM reset: reset PCR 16 and extend `measurements` (the running model) into it again, then check
        the value against their replay from zero (TpmError if something else extended it meanwhile), and take the
        TPM's new reset counts. A retry measures from zero again, never on top. Returns the PCR value.
        `still_current`, asked right before committing: False leaves the reset pending and raises TpmError (the
        caller gave up on this attempt)."""
        t = _tss()
        measurements = [bytes(m) for m in measurements]
        if not measurements or any(len(m) != 32 for m in measurements):
            raise ValueError("remeasure needs SHA-256 digests")
        expected = replay(measurements)
        with self._lock:
            esapi = self._open_esapi()
            pcr = getattr(t.ESYS_TR, f"PCR{self.pcr}")
            try:
                # from zero, as after the reset: a retry (or a reset not seen yet) never extends on top of an
                # earlier attempt's values (PCR 16 is resettable at locality 0, as tpm-session relies on too)
                esapi.pcr_reset(pcr)
                for m in measurements:
                    digests = t.TPML_DIGEST_VALUES([t.TPMT_HA(hashAlg=t.TPM2_ALG.SHA256, digest=t.TPMU_HA(sha256=m))])
                    esapi.pcr_extend(pcr, digests)
                _, _, values = esapi.pcr_read(t.TPML_PCR_SELECTION.parse(f"sha256:{self.pcr}"))
                value = bytes(values.digests[0])
                counts = clock_counts(esapi)
            except t.TSS2_Exception as exc:
                raise TpmError(f"re-measuring PCR {self.pcr} through {self.tcti!r} failed: {exc}") from exc
            if value != expected:
                raise TpmError(f"PCR {self.pcr} is {value.hex()[:16]}… after re-measuring, not the replay "
                               f"{expected.hex()[:16]}… of the running model: something else extends it meanwhile")
            with self._bind_state:
                if still_current is not None and not still_current():
                    raise TpmError("re-measurement abandoned (superseded or timed out): not committed")
                self._counts = counts
                self.unbound_reason = None
            return value

    def _reopen_on_tpm_thread(self, min_interval_s: float = 0.2, found: dict | None = None) -> bool:
        if self._esapi is None:  # closed meanwhile
            return False
        fresh = reopen(self, self.key_handle, min_interval_s, found)
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
