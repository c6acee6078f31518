"""The audit log's in-box anchor: a TPM 2.0 NV counter (TPM_NT_COUNTER) that can only go up.

The hash chain proves every record before the newest one, but a cut of the newest records leaves a valid
prefix. With audit.anchor: tpm the log carries `anchor` records {"counter": N, "nv_index": I}: at start, every
audit.anchor_interval_s, as the first record of each new segment and as the last record of a clean close
(an interval or close anchor is skipped when nothing was written since the newest anchor: it still covers
everything, and NV memory wears). Each is written and fsynced (file and directory) under the log's lock first,
and only then is the counter incremented to N. The increment reads the counter first and increments only while
it is below N, also when it is retried after a reconnect, so one record never moves the counter twice. A crash
between record and increment leaves the log one anchor ahead of the TPM, never behind; the next start catches
the counter up. A counter found beyond the log while running (something else incremented it) gets a fresh
anchor at once, so a crash right after it does not read as a deletion.

First use: before the counter is defined and first incremented, an `anchor_init` record is fsynced. A start
that stops after the counter was initialised and before its first anchor leaves "anchor_init, no anchor,
counter 1", which the next start accepts (nothing was anchored yet) instead of reporting a deletion.

At start the counter C is compared with the newest anchor A in the log: C > A means anchored records (or
whole segments) were deleted, or the log was replaced. A counter missing (undefined, or the TPM cleared) while
the log holds anchors means the same could have happened unseen (reason index_recreated). Both raise alert
`audit_truncated` and append an `anchor_gap` record (the gap itself becomes part of the chain); the line keeps
running. `sitsctl audit verify --tpm` makes the same comparison offline, reading the counter before the files
so that anchors a running sitsd adds meanwhile do not look like a deletion. A segment that cannot be read, or
a malformed anchor record, fails the check (alert audit_anchor, retried): falling back to an older anchor would
report a deletion that did not happen. Retention carries a removed segment's newest anchor in its `retention`
record, so removing it does not read as a deletion either.

The counter: an owner-hierarchy NV index (audit.anchor_nv_index, owner range 0x01800000-0x01BFFFFF of the TCG
handle registry), defined at first use with TPMA_NV AUTHWRITE | AUTHREAD | OWNERREAD | NO_DA and an empty
auth value and no policy, 8 bytes, big-endian; an index with any other attributes is reported and not used.
Not ORDERLY: an orderly counter is kept in RAM and after a power loss (no TPM2_Shutdown) the TPM advances it
beyond any value it may have reached, which would read as "the TPM is ahead of the log" - a false deletion
alarm after every power cut. The TPM reference implementation (swtpm) starts a counter that is defined again
above the highest value any counter on it had, even after TPM2_Clear; sitsd does not rely on that: a counter
missing while the log has anchors is reported as a possible deletion whatever its new value.

What it does not cover: records written after the newest anchor (at most anchor_interval_s of them, or
since the last rotation); and someone who can use the TPM and rewrite the log (root on the device) can
recompute the chain and forge an anchor record with the current counter value: the anchor detects
deletion, not a rewrite by a party holding the device. Anyone who can use the TPM (group tss, empty owner
auth) can increment the counter (a false alarm) or undefine it (reported as above once the log has anchors).
Undefining it AND removing the whole audit directory leaves nothing to compare with: the next start is a first
use, flagged (alert audit_anchor) only where the new counter starts above 1 or other segments are left.

TPM failures never stop commands or lose records: they are counted (status `audit_anchor.errors`),
raise alert `audit_anchor`, and the anchor is retried at the next interval. So does any other failure of the
start check or the anchor thread (it never dies silently). The TPM is shared with the signer (one ESAPI
context and lock: swtpm has no resource manager and a second connection would wait forever); the counter
increment runs outside the audit log's lock, so the I/O thread never waits for it.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from .audit import AnchorScanError, AuditLog, AuditWriteError, anchor_summary, audit_files

OWNER_NV_FIRST, OWNER_NV_LAST = 0x01800000, 0x01BFFFFF  # TCG handle registry: NV indices of the owner
DEFAULT_NV_INDEX = 0x01A0D170
COUNTER_SIZE = 8  # TPM_NT_COUNTER: 8 bytes, big-endian

os.environ.setdefault("TSS2_LOG", "all+none")


def _tss():
    import tpm2_pytss  # lazily: 100 ms, and absent where no TPM is used

    return tpm2_pytss


class AnchorTpmError(Exception):
    """The TPM could not define, read or increment the anchor counter; the message says which and why."""


class AnchorIndexMissing(AnchorTpmError):
    """The counter's NV index is not defined (any more): TPM cleared, or the index undefined."""


@contextmanager
def _holding(lock, what: str):
    """`with lock`, where a bounded lock (attestation.tpm.worker.TpmLock: a hung TPM call holds it) that times out
    is an AnchorTpmError like any other TPM failure."""
    try:
        lock.__enter__()
    except Exception as exc:  # TpmError: busy for longer than every holder's TPM calls may take
        raise AnchorTpmError(f"{what} not attempted: {exc}") from exc
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


class OwnTpm:
    """An ESAPI context of our own (sitsctl audit verify, tests, a daemon whose signer shares none):
    opened at first use, reopened after an I/O failure. `lock` serialises its use. Every TPM call runs on a TPM
    thread of its own and is bounded (attestation.tpm.worker): a hung TPM costs AnchorTpmError, never a hang."""

    def __init__(self, tcti: str) -> None:
        from attestation.tpm.worker import TpmLock, TpmWorker

        if not tcti:
            raise AnchorTpmError("no TCTI: give --tcti (or SITS_TCTI), or attestation.tcti in the config")
        self.tcti = tcti
        self.lock = TpmLock(f"the TPM at {tcti!r}")
        self._worker = TpmWorker(tcti)
        self._esapi = None

    def esapi(self):
        from attestation.tpm.worker import TPM_SETUP_TIMEOUT_S, BoundedEsapi

        if self._esapi is None:
            try:
                self._esapi = self._worker.call("opening the TPM", _tss().ESAPI, self.tcti,
                                                timeout_s=TPM_SETUP_TIMEOUT_S)
            except Exception as exc:  # TSS2_Exception, a TCTI that does not load, no answer in time
                raise AnchorTpmError(f"cannot open the TPM through {self.tcti!r}: {exc}") from exc
        return BoundedEsapi(self._worker, self._esapi)

    def reopen(self) -> bool:
        """Caller holds `lock`. Drop the context (after a failure ESYS refuses every further call); the next
        `esapi()` opens a fresh one. A context still inside a call (a hung TPM) is left to it."""
        old, self._esapi = self._esapi, None
        if old is not None and not self._worker.busy:
            try:
                self._worker.call("closing the TPM context", old.close, timeout_s=1.0)
            except Exception:  # its connection is already gone
                pass
        return True

    def close(self) -> None:
        """Never waits long for a hung TPM."""
        if not self.lock.acquire(timeout=1.0):
            self._esapi = None
        else:
            try:
                self.reopen()
            finally:
                self.lock.release()
        self._worker.stop()


class TpmNvCounter:
    """One NV counter through an ESAPI context: `esapi` is a callable returning the context (shared with the
    signer: pass its lock), `reopen` (optional, called with the lock held) replaces a context that failed."""

    def __init__(self, esapi: Callable, nv_index: int, lock: threading.Lock | None = None,
                 reopen: Callable[[], bool] | None = None) -> None:
        if not OWNER_NV_FIRST <= nv_index <= OWNER_NV_LAST:
            raise ValueError(f"NV index 0x{nv_index:08x} is outside the owner range "
                             f"0x{OWNER_NV_FIRST:08x}-0x{OWNER_NV_LAST:08x}")
        self._esapi = esapi
        self.nv_index = nv_index
        self._lock = lock or threading.Lock()
        self._reopen = reopen

    @classmethod
    def own(cls, tcti: str, nv_index: int) -> "TpmNvCounter":
        conn = OwnTpm(tcti)
        counter = cls(conn.esapi, nv_index, conn.lock, conn.reopen)
        counter.connection = conn
        return counter

    def _run(self, what: str, fn, retry: bool = True):
        """fn(esapi) under the lock; after a TCTI or ESYS failure the context is reopened (where we may) and fn run
        once more, but only where `retry`: every operation below reads the counter before it increments it, so
        running it again after a reconnect never moves the counter twice. A bare increment (retry=False) is not
        run again: whether the first one reached the TPM is unknown, and only a read can tell."""
        t = _tss()
        with _holding(self._lock, f"{what} of NV index 0x{self.nv_index:08x}"):
            try:
                return fn(self._esapi())
            except t.TSS2_Exception as exc:
                # a TPM response code (layer 0: NV_RATE, HANDLE, AUTH_FAIL, ...) is the TPM's answer, no reason
                # to reconnect; TCTI (0xA000A: I/O) and ESYS errors (BAD_SEQUENCE once a call failed) are
                if self._reopen is None or exc.rc >> 16 == 0:
                    raise AnchorTpmError(f"{what} of NV index 0x{self.nv_index:08x} failed: {exc}") from exc
                first = exc
            except AnchorTpmError:
                raise
            except Exception as exc:  # the signer closed its context, or a TCTI that does not load
                raise AnchorTpmError(f"{what} of NV index 0x{self.nv_index:08x} failed: {exc}") from exc
            try:  # the TPM went away (TCTI I/O) or ESYS is stuck after an earlier failure: a fresh context
                if not self._reopen():
                    raise AnchorTpmError(f"{what} of NV index 0x{self.nv_index:08x} failed: {first}")
                if not retry:
                    raise AnchorTpmError(f"{what} of NV index 0x{self.nv_index:08x} failed ({first}); whether it "
                                         "reached the TPM is unknown (read the counter)")
                return fn(self._esapi())
            except AnchorTpmError:
                raise
            except Exception as exc:
                raise AnchorTpmError(f"{what} of NV index 0x{self.nv_index:08x} failed after reconnecting: "
                                     f"{exc}") from exc

    # -- TPM commands (each takes the context; the caller holds the lock) --------------------------------
    def _handle(self, e):
        """The index's ESYS_TR, or None when it is not defined."""
        t = _tss()
        try:
            return e.tr_from_tpmpublic(self.nv_index)
        except t.TSS2_Exception as exc:
            if exc.error == t.TPM2_RC.HANDLE:
                return None
            raise

    def _read_value(self, e, nv) -> int | None:
        """The counter, or None when it was defined but never incremented (TPM_RC_NV_UNINITIALIZED)."""
        t = _tss()
        try:
            data = e.nv_read(nv, COUNTER_SIZE, 0, nv)
        except t.TSS2_Exception as exc:
            if exc.error == t.TPM2_RC.NV_UNINITIALIZED:
                return None
            raise
        raw = bytes(data)  # bind the buffer first (cffi: a temporary's memory may be freed under bytes())
        return int.from_bytes(raw, "big")

    @staticmethod
    def expected_attributes() -> int:
        """TPMA_NV of the index sitsd defines (TPMA_NV_WRITTEN, set by the TPM at the first increment, aside)."""
        a, t = _tss().TPMA_NV, _tss()
        return int(a.AUTHWRITE | a.AUTHREAD | a.OWNERREAD | a.NO_DA) | (int(t.TPM2_NT.COUNTER) << int(a.TPM2_NT_SHIFT))

    @staticmethod
    def _attribute_names(bits: int) -> str:
        a = _tss().TPMA_NV
        names = [n for n in _TPMA_NV_NAMES if hasattr(a, n) and bits & int(getattr(a, n))]
        return "|".join(names) or f"0x{bits:08x}"

    def _check_public(self, e, nv) -> None:
        """Use the index only if it is exactly what `_define` makes: an 8-byte TPM_NT_COUNTER with AUTHWRITE |
        AUTHREAD | OWNERREAD | NO_DA, nothing else (not ORDERLY), and no authPolicy. Anything else belongs to
        someone else, or was prepared to mislead: a counter without NO_DA whose auth value is not empty would
        count each of our failed authorisations toward the TPM's dictionary-attack lockout."""
        t = _tss()
        pub, _name = e.nv_read_public(nv)
        attrs = int(pub.nvPublic.attributes)
        kind = (attrs & int(t.TPMA_NV.TPM2_NT_MASK)) >> int(t.TPMA_NV.TPM2_NT_SHIFT)
        idx = f"0x{self.nv_index:08x}"
        if kind != int(t.TPM2_NT.COUNTER) or int(pub.nvPublic.dataSize) != COUNTER_SIZE:
            raise AnchorTpmError(f"NV index {idx} exists but is not an 8-byte counter (TPM_NT_COUNTER); it belongs "
                                 "to something else: choose another audit.anchor_nv_index")
        if attrs & int(t.TPMA_NV.ORDERLY):
            raise AnchorTpmError(f"NV index {idx} is an ORDERLY counter, which jumps ahead after a power loss (a "
                                 "false deletion alarm): undefine it (tpm2_nvundefine) and let sitsd define it again")
        expected = self.expected_attributes()
        have = attrs & ~int(t.TPMA_NV.WRITTEN)
        policy = int(pub.nvPublic.authPolicy.size)
        if have != expected or policy:
            what = []
            if have & ~expected:
                what.append(f"has {self._attribute_names(have & ~expected)}")
            if expected & ~have:
                what.append(f"lacks {self._attribute_names(expected & ~have)}")
            if policy:
                what.append(f"has an authPolicy ({policy} bytes)")
            raise AnchorTpmError(f"NV index {idx} is a counter sitsd did not define ({', '.join(what)}; sitsd defines "
                                 "AUTHWRITE|AUTHREAD|OWNERREAD|NO_DA, no policy): not used. Choose another "
                                 "audit.anchor_nv_index, or undefine it if it is a leftover of yours")

    def _define(self, e):
        t = _tss()
        a = t.TPMA_NV
        attrs = a.AUTHWRITE | a.AUTHREAD | a.OWNERREAD | a.NO_DA | (t.TPM2_NT.COUNTER << a.TPM2_NT_SHIFT)
        public = t.TPM2B_NV_PUBLIC(nvPublic=t.TPMS_NV_PUBLIC(nvIndex=self.nv_index, nameAlg=t.TPM2_ALG.SHA256,
                                                             attributes=attrs, dataSize=COUNTER_SIZE))
        return e.nv_define_space(None, public, t.ESYS_TR.OWNER)

    # -- public -----------------------------------------------------------------------------------------
    def read(self) -> int | None:
        """The counter's value; None when the index is not defined; 0 when defined but never incremented."""
        def op(e):
            nv = self._handle(e)
            if nv is None:
                return None
            try:
                self._check_public(e, nv)
                value = self._read_value(e, nv)
                return 0 if value is None else value
            finally:
                e.tr_close(nv)

        return self._run("TPM2_NV_Read", op)

    def initialise(self) -> int:
        """Define the index if it is missing and increment it if it was never incremented (an unwritten counter
        cannot be read); returns its value. Idempotent: it looks before it defines or increments, so a retry after
        a reconnect does neither twice. The TPM starts a new counter above the highest value any counter on it
        had (TPM 2.0 Part 1, NV counters: deleting and re-defining an index does not wind the value back), so the
        value is 1 only on a TPM whose counters never counted."""
        def op(e):
            nv = self._handle(e)
            if nv is None:
                nv = self._define(e)
            try:
                self._check_public(e, nv)
                value = self._read_value(e, nv)
                if value is None:
                    e.nv_increment(nv, nv)
                    value = self._read_value(e, nv)
                return value
            finally:
                e.tr_close(nv)

        return self._run("TPM2_NV_DefineSpace/Increment", op)

    def advance_to(self, target: int) -> int:
        """Read the counter and increment it once if it is below `target`; returns the value read afterwards.
        Idempotent for one target: a retry after a reconnect reads first and does not increment again when the
        first increment landed. AnchorIndexMissing when the index is gone."""
        def op(e):
            nv = self._handle(e)
            if nv is None:
                raise AnchorIndexMissing(f"NV index 0x{self.nv_index:08x} vanished (TPM cleared or index undefined)")
            try:
                self._check_public(e, nv)
                value = self._read_value(e, nv) or 0
                if value < target:
                    e.nv_increment(nv, nv)
                    value = self._read_value(e, nv)
                return value
            finally:
                e.tr_close(nv)

        return self._run("TPM2_NV_Increment", op)

    def increment(self) -> int:
        """One TPM2_NV_Increment whatever the value (tools and tests; sitsd uses advance_to); returns the value
        read back. Not repeated after a reconnect: AnchorTpmError, and a read tells whether it landed."""
        def op(e):
            nv = self._handle(e)
            if nv is None:
                raise AnchorIndexMissing(f"NV index 0x{self.nv_index:08x} vanished (TPM cleared or index undefined)")
            try:
                e.nv_increment(nv, nv)
                return self._read_value(e, nv)
            finally:
                e.tr_close(nv)

        return self._run("TPM2_NV_Increment", op, retry=False)

    def close(self) -> None:
        conn = getattr(self, "connection", None)
        if conn is not None:
            conn.close()


_TPMA_NV_NAMES = ("PPWRITE", "OWNERWRITE", "AUTHWRITE", "POLICYWRITE", "POLICY_DELETE", "WRITELOCKED", "WRITEALL",
                  "WRITEDEFINE", "WRITE_STCLEAR", "GLOBALLOCK", "PPREAD", "OWNERREAD", "AUTHREAD", "POLICYREAD",
                  "NO_DA", "ORDERLY", "CLEAR_STCLEAR", "READLOCKED", "PLATFORMCREATE", "READ_STCLEAR")


def counter_for_signer(signer, tcti: str | None, nv_index: int) -> TpmNvCounter:
    """The daemon's counter: through the signer's ESAPI context and lock where it has one (as
    sitsd/hotswap.py `_measurement_log` does), else through a context of its own."""
    if hasattr(signer, "_lock") and (hasattr(signer, "_open_esapi") or hasattr(signer, "_esapi")):
        opener = getattr(signer, "_open_esapi", None) or (lambda: signer._esapi)
        return TpmNvCounter(opener, nv_index, signer._lock, getattr(signer, "_reopen", None))
    return TpmNvCounter.own(tcti, nv_index)


class AuditAnchor:
    """Writes the anchor records of one AuditLog and keeps the TPM counter at the newest of them.

    State: `tpm` is the counter as last read, `logged` the newest anchor this process knows in the log.
    An anchor record (counter tpm + 1) is written only while logged <= tpm (no increment pending), so
    the log is at most one anchor ahead of the TPM, and exactly that after a crash between the two."""

    def __init__(self, counter: TpmNvCounter, interval_s: float = 300.0, *,
                 on_alert: Callable[[str, str], None] | None = None, log=None) -> None:
        self.counter = counter
        self.nv_index = counter.nv_index
        self.interval_s = interval_s
        self._on_alert = on_alert
        self.log = log
        self.audit: AuditLog | None = None
        self.tpm: int | None = None
        self.logged: int | None = None
        self.checked = False  # the start comparison is done (retried at each interval until it is)
        self.start_check: str = "pending"
        self.gap: dict | None = None
        self.anchors = 0  # anchor records written by this process
        self.skipped = 0  # anchors not written: nothing recorded since the newest one (no NV write needed)
        self.errors = 0  # TPM or disk failures while anchoring
        self.last_error: str | None = None
        self.last_anchor_ns: int | None = None
        self._tpm_lock = threading.Lock()  # one anchor at a time: start check, record + increment
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._anchored_path = None  # the segment that holds the newest anchor record
        self._anchored_head: str | None = None  # the log's head right after the newest anchor record
        self._resync = False  # the counter was found beyond the log: a fresh anchor is due at once
        self._init_t_ns: int | None = None  # t_ns of the anchor_init record this process wrote (before defining)
        self._prior_segments = 0  # segments in the directory before this start's
        self._last_failure: float | None = None  # monotonic

    # -- reporting ------------------------------------------------------------------------------------
    def _alert(self, kind: str, reason: str) -> None:
        if self._on_alert is not None:
            self._on_alert(kind, reason)

    def _log(self, level: str, msg: str, **kw) -> None:
        if self.log is not None:
            getattr(self.log, level)(msg, **kw)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        self._last_failure = time.monotonic()
        self.last_error = f"{what}: {exc}"
        self._alert("audit_anchor", f"audit anchor: {what} failed ({exc}); commands and records go on, retried "
                    f"in {self.interval_s:g} s")
        self._log("warning", "audit anchor failed", what=what, error=str(exc), errors=self.errors,
                  nv_index=f"0x{self.nv_index:08x}", retry_in_s=self.interval_s)

    def status(self) -> dict:
        return {"nv_index": f"0x{self.nv_index:08x}", "counter": self.tpm, "last_anchor": self.logged,
                "last_anchor_ns": self.last_anchor_ns, "anchors": self.anchors, "skipped": self.skipped,
                "errors": self.errors, "last_error": self.last_error, "start_check": self.start_check, "gap": self.gap,
                "pending_increment": self.tpm is not None and self.logged is not None and self.logged > self.tpm,
                "interval_s": self.interval_s}

    # -- lifecycle ------------------------------------------------------------------------------------
    def attach(self, audit: AuditLog, register: bool = True) -> "AuditAnchor":
        """Compare the TPM with the log, anchor the start, then anchor every interval_s on a thread.

        The log learns of the anchor (`audit.anchor`: rotation anchors, the closing anchor in AuditLog.close) only
        once this is done, so closing the log meanwhile never waits for the start check's TPM calls. `register`
        False leaves that to the caller (sitsd sets it on its event loop, and not at all when stopped meanwhile)."""
        self.audit = audit
        self._prior_segments = sum(1 for f in audit_files(audit.directory) if f.name != audit.path.name)
        if self.check_start():
            self.anchor_now("start")
        if self._closing:  # abandoned meanwhile (a stop during sitsd's start): no thread
            return self
        self._thread = threading.Thread(target=self._loop, name="sits-audit-anchor", daemon=True)
        self._thread.start()
        if register:
            audit.anchor = self
        return self

    def abandon(self) -> None:
        """The start that attached this anchor was stopped before it took it: stop the thread, without waiting
        and without a TPM call (the log never knew the anchor, so it writes no closing anchor)."""
        self._closing = True
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        due = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if time.monotonic() >= due:
                    due = time.monotonic() + self.interval_s
                    self.anchor_now("interval")
                elif self._last_failure is None or time.monotonic() - self._last_failure >= self.interval_s:
                    # woken by a rotation: the increment its anchor record waits for; or, where that record had to
                    # wait for an earlier increment, the new segment's anchor now (a failing TPM waits for the
                    # interval); or a fresh anchor where the counter was found beyond the log
                    if self.settle(check=False) and (self._resync or self._anchored_path != self.audit.path
                                                     or self.logged < self.tpm):
                        self.anchor_now("rotation")
            except Exception as exc:  # never let the thread die silently: counted, alerted, retried next interval
                due = time.monotonic() + self.interval_s
                try:
                    self._failed("the anchor thread", exc)
                except Exception:
                    pass

    def _stop_thread(self) -> None:
        self._closing = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def close_anchor(self) -> None:
        """AuditLog.close, before it closes the file: stop the thread, then finish a pending increment, write the
        closing anchor (unless nothing was recorded since the newest one) and increment the counter to it."""
        self._stop_thread()
        try:
            self.anchor_now("close")
        except Exception as exc:
            self._failed("the close anchor", exc)

    def close(self) -> None:
        """After AuditLog.close: the thread stops; an increment still pending is tried once more."""
        self._stop_thread()
        try:
            self.settle(check=False)
        except Exception as exc:
            self._failed("the last increment", exc)

    # -- the start comparison -------------------------------------------------------------------------
    def check_start(self) -> bool:
        """Read the counter C (defining it at first use) and the newest anchor A in the log; C > A: records were
        deleted; C == A - 1: a crash between record and increment (caught up quietly). False if the TPM or the
        log could not be read, or anything else failed (counted, alerted, retried at the next interval)."""
        with self._tpm_lock:
            if self.checked:
                return True
            try:
                return self._check_start_locked()
            except Exception as exc:  # a malformed anchor record, an unreadable segment, a bug: never a crash
                self._failed("the start check (reading the log's newest anchor)"
                             if isinstance(exc, AnchorScanError) else "the start check", exc)
                return False

    def _check_start_locked(self) -> bool:
        summary = anchor_summary(audit_files(self.audit.directory), newest_only=True)  # AnchorScanError
        newest, init = summary["newest"], summary["init"]
        a = newest["counter"] if newest else None
        where = _where(newest)
        idx = f"0x{self.nv_index:08x}"
        try:
            c = self.counter.read()
        except AnchorTpmError as exc:
            self._failed("reading the counter at start", exc)
            return False
        own_init = init is not None and self._init_t_ns is not None and init.get("t_ns") == self._init_t_ns
        if own_init:  # this process's own marker (a check retried after the TPM failed): not an earlier start's
            init = None
        created = own_init or c is None or c == 0
        if c is None or c == 0:
            # first use, or the index is gone: the anchor_init record goes to disk before the counter is defined
            # and initialised, so a start cut off in between is told apart from a deletion at the next start
            if self._init_t_ns is None:
                t_ns = time.time_ns()
                marker = {"type": "anchor_init", "nv_index": idx, "index": "missing" if c is None else "uninitialised",
                          "last_anchor": a, "previous_segments": self._prior_segments, "pid": os.getpid(),
                          "t_ns": t_ns}
                try:
                    with self.audit.lock:
                        self.audit.write_typed_locked(marker)
                except (AuditWriteError, OSError) as exc:
                    self._failed("writing the anchor_init record", exc)
                    return False
                self._init_t_ns = t_ns
            try:
                c = self.counter.initialise()
            except AnchorTpmError as exc:
                self._failed("defining the counter", exc)
                return False
        init_at = _where(init)
        gap = None
        if a is None and init is not None:  # an earlier start wrote anchor_init: the counter is the log's own
            if c == 1:  # initialised, then that start stopped before its first anchor: nothing was ever anchored
                self.start_check = "first_use"
                self._log("warning", "audit anchor: an earlier first start stopped before its first anchor (after "
                          "its anchor_init record); carrying on", nv_index=idx, counter=c, anchor_init=init_at)
            elif created:
                gap = ("index_recreated", "audit_truncated",
                       f"audit log may be truncated: the log in {self.audit.directory} holds an anchor_init record "
                       f"({init_at}) but no anchor, and the counter {idx} was missing; defined again it starts at {c}, "
                       f"so a counter on this TPM had counted to {c - 1}: the index was undefined and anchored records "
                       "may have been deleted")
            else:
                gap = ("tpm_ahead", "audit_truncated",
                       f"audit log truncated or replaced: the TPM counter at {idx} is {c}, but the log in "
                       f"{self.audit.directory} holds no anchor record after its first start ({init_at}): its "
                       "anchored records were deleted")
        elif a is None and created:
            self.start_check = "first_use"
            concerns = []
            if self._prior_segments:
                concerns.append(f"{self.audit.directory} already held {self._prior_segments} segment(s) and no anchor "
                                "record: expected when audit.anchor was just turned on for this log; otherwise the "
                                "counter was undefined (tpm2_nvundefine) and records may have been deleted")
            if c > 1:
                concerns.append(f"the new counter starts at {c}: a counter on this TPM had counted to {c - 1} before "
                                "(another application's, or this index, undefined since)")
            self._log("info", "audit anchor: counter defined", nv_index=idx, counter=c)
            if concerns:
                text = f"audit anchor: counter {idx} defined at first use, but " + "; and ".join(concerns)
                self._log("warning", text, nv_index=idx, counter=c)
                self._alert("audit_anchor", text)
        elif a is None:
            gap = ("tpm_ahead", "audit_truncated",
                   f"audit log truncated or replaced: the TPM counter at {idx} is {c}, but the log in "
                   f"{self.audit.directory} holds no anchor record: its anchored records were deleted")
        elif created or init is not None:
            gap = ("index_recreated", "audit_truncated",
                   f"audit log may be truncated: the anchor counter {idx} was missing (TPM cleared, or the index "
                   f"undefined: anyone who can use the TPM can) although the log's newest anchor is {a} ({where}); "
                   f"it was defined again at {c}: deletions of records after anchor {a} cannot be ruled out")
        elif c > a:
            gap = ("tpm_ahead", "audit_truncated",
                   f"audit log truncated: the TPM counter at {idx} is {c}, the log's newest anchor is {a} "
                   f"({where}): the newest {c - a} anchor(s) and the records after anchor {a} were deleted, or "
                   f"the log was replaced")
        elif c == a - 1:  # the record was on disk, the increment not yet: a crash, never a deletion
            try:
                c = self.counter.advance_to(a)
            except AnchorTpmError as exc:
                self.tpm, self.logged = c, a  # pending: settle() retries
                self.checked, self.start_check = True, "catching_up"
                self._failed("catching the counter up with the log", exc)
                return True
            self.start_check = "caught_up"
            self._log("info", "audit anchor: the log was one anchor ahead of the TPM (a stop between record "
                      "and increment); counter caught up", nv_index=idx, counter=c, last_anchor=a)
        elif c < a:
            gap = ("tpm_behind", "audit_anchor",
                   f"the TPM counter at {idx} is {c}, behind the log's newest anchor {a} ({where}) by more than "
                   f"a crash explains: the log comes from another TPM, or its anchors were forged; anchoring "
                   f"continues from {c}")
        else:
            self.start_check = "ok"
        if gap is not None:
            reason, kind, text = gap
            self.start_check = reason
            self.gap = {"reason": reason, "tpm_counter": c, "last_anchor": a, "last_anchor_at": where}
            self._log("error", text, nv_index=idx, tpm_counter=c, last_anchor=a)
            if kind == "audit_truncated":  # kinds spelled out: tests/systemd/test_docs_alerts.py reads them
                self._alert("audit_truncated", text)
            else:
                self._alert("audit_anchor", text)
            record = {"type": "anchor_gap", "reason": reason, "tpm_counter": c, "last_anchor": a,
                      "last_anchor_at": where, "nv_index": idx, "t_ns": time.time_ns()}
            try:
                with self.audit.lock:
                    self.audit.write_typed_locked(record)
            except (AuditWriteError, OSError) as exc:
                # no anchor may follow before the gap is in the log (it would hide it): the whole check is
                # retried at the next interval, and finds the same gap again
                self._failed("writing the anchor_gap record", exc)
                return False
        self.tpm = c
        self.logged = c if self.logged is None or self.logged < c else self.logged
        self.checked = True
        self._init_t_ns = None  # a later check (the index vanished while running) writes its own marker
        return True

    # -- anchoring ------------------------------------------------------------------------------------
    def _record_locked(self, reason: str) -> bool:
        """The anchor record, fsynced; caller holds the log's lock. False if none was written (start check
        not done, an increment still pending, or the disk failed: counted)."""
        if not self.checked or self.tpm is None or (self.logged is not None and self.logged > self.tpm):
            return False
        n = self.tpm + 1
        try:
            self.audit.write_typed_locked({"type": "anchor", "counter": n, "nv_index": f"0x{self.nv_index:08x}",
                                           "reason": reason, "t_ns": time.time_ns()})
        except (AuditWriteError, OSError) as exc:  # not (surely) on disk: the counter must not move
            self._failed(f"writing the {reason} anchor record", exc)
            return False
        self.logged = n
        self._anchored_path = self.audit.path
        self._anchored_head = self.audit.head
        self._resync = False
        self.anchors += 1
        self.last_anchor_ns = time.time_ns()
        return True

    def settle(self, check: bool = True) -> bool:
        """Bring the counter up to the newest anchor record: read it, and increment it only while it is below
        (one step a call; a retry after a reconnect reads first, so one record never moves the counter twice).
        `check`: read the TPM even when no increment is pending (it finds something else incrementing the counter
        before the next record). True when the counter is known. A counter found beyond the log sets `_resync`:
        the caller writes a fresh anchor at once (until it does, a crash would read as a deletion)."""
        with self._tpm_lock:
            if self.tpm is None or self.logged is None:
                return False
            target = self.logged
            if not check and target <= self.tpm:
                return True
            try:
                value = self.counter.advance_to(target)
            except AnchorIndexMissing as exc:
                # the index was undefined (or the TPM cleared) while we run: the next anchor runs the start check
                # again, which records the finding (index_recreated) before anchoring goes on
                self.checked, self.tpm, self.start_check = False, None, "pending"
                self._failed(f"TPM2_NV_Increment to anchor {target}", exc)
                return False
            except AnchorTpmError as exc:
                self._failed(f"TPM2_NV_Increment to anchor {target}", exc)
                return False
            if value != target:
                how = ("something else increments it (anyone who can use the TPM can)" if value > target else
                       "it is behind the log by more than one step")
                self._alert("audit_anchor", f"audit anchor counter 0x{self.nv_index:08x} is {value}, the newest "
                            f"anchor record is {target}: {how}; a fresh anchor {value + 1} is written at once")
                self._log("warning", "audit anchor counter out of step with the log", counter=value, expected=target)
                self._resync = True
                if value < target:
                    self.logged = value  # anchor on from the TPM: the fresh record is the log's newest anchor
            self.tpm = value
            return True

    def anchor_now(self, reason: str = "interval") -> bool:
        """One anchor: (retry the start check,) finish a pending increment, record + fsync, increment. Skipped
        (True, no NV write) when nothing was written to the log since the newest anchor: it covers everything.
        Where the counter is found beyond the log, a fresh anchor follows at once."""
        if not self.checked and not self.check_start():
            return False
        for _ in range(3):
            if not self.settle():
                return False
            with self.audit.lock:
                if self.audit.closed:
                    return False
                if not self._resync and self.logged == self.tpm and self.audit.head == self._anchored_head:
                    self.skipped += 1
                    return True
                if not self._record_locked(reason):
                    return False
            if not self.settle(check=False):
                return False
            if not self._resync:
                return True
            reason = "resync"
        return False

    def on_rotation_locked(self) -> None:
        """AuditLog._rotate_locked: the new segment's first record after its header; the increment is left
        to the anchor thread so the I/O thread never waits for the TPM. While an earlier anchor's increment
        is still pending, the thread writes this segment's anchor as soon as that one is done."""
        if not self._closing:
            self._record_locked("rotation")
            self._wake.set()  # its increment; or, if an earlier one was still pending, the anchor itself soon


def _where(rec: dict | None) -> str | None:
    if rec is None:
        return None
    if rec.get("reason") == "removed_by_retention":
        return f"{rec.get('removed_file')}, removed by retention ({rec['file']}:{rec['line']})"
    return f"{rec['file']}:{rec['line']}"


def verify_against_tpm(summary: dict, counter: int | None, nv_index: int,
                       counter_after: int | None = None) -> tuple[bool, list[str]]:
    """`sitsctl audit verify --tpm`: the TPM counter against the newest anchor of a log whose chain verified.
    `counter` must be read BEFORE the files are listed and read: a running sitsd only adds anchors, each on disk
    before the counter reaches it, so a counter above the newest anchor found afterwards is a deletion.
    `counter_after`, read after the scan, tells how far a running sitsd got meanwhile. Returns (complete, lines)."""
    idx = f"0x{nv_index:08x}"
    newest, init = summary["newest"], summary.get("init")
    a = newest["counter"] if newest else None
    where = _where(newest)
    now = counter_after if counter_after is not None and counter is not None and counter_after >= counter else counter
    if counter is None:
        if a is None:
            return False, [f"no anchor: the TPM has no counter at {idx} and the log no anchor record (audit.anchor "
                           "was never on for this log, or another TPM or NV index)"]
        return False, [f"the TPM has no counter at {idx}, but the log's newest anchor is {a} ({where}): another TPM, "
                       f"another audit.anchor_nv_index, or the index was deleted (TPM cleared)"]
    not_covered = (f"{summary['after_newest']} command record(s) after that anchor are not covered by it (written "
                   "since the last anchor: at most audit.anchor_interval_s of records, or since the last segment "
                   "rotation)")
    if a is None:
        if init is not None and counter <= 1:
            return True, [f"not anchored yet: the log's first anchored start ({_where(init)}) stopped after the "
                          f"counter at {idx} was defined ({counter}) and before its first anchor: nothing was "
                          "anchored, so no anchored record can be missing",
                          f"{summary['after_newest']} command record(s) are not covered by an anchor"]
        return False, [f"TRUNCATED: the TPM counter at {idx} is {counter}, but the log holds no anchor record: its "
                       f"anchored records were deleted, or the log was replaced"]
    if init is not None:
        return False, [f"the anchor counter at {idx} was missing at a start after the newest anchor {a} ({where}) and "
                       f"defined again ({_where(init)}), now {counter}: deletions of records after anchor {a} cannot "
                       "be ruled out (TPM cleared, or the index undefined)"]
    if counter > a:
        return False, [f"TRUNCATED: the TPM counter at {idx} is {counter}, the log's newest anchor is {a} ({where}): "
                       f"the newest {counter - a} anchor(s) are missing: records after anchor {a} were deleted, "
                       f"or the log was replaced by an older copy"]
    if counter == a == now:
        return True, [f"anchored: the TPM counter at {idx} ({counter}) matches the newest anchor ({where})",
                      not_covered]
    if now >= a:
        return True, [f"anchored: the TPM counter at {idx} went from {counter} to {now} while the log was read (a "
                      f"running sitsd anchored meanwhile); the newest anchor read is {a} ({where})", not_covered]
    if now == a - 1:
        return True, [f"anchored: the log is one anchor ahead of the TPM counter at {idx} ({now} < {a}, {where}): "
                      "sitsd stopped between an anchor record and its increment (a crash, not a deletion), or its "
                      "increment is pending; the next start catches the counter up", not_covered]
    return False, [f"the TPM counter at {idx} ({now}) is behind the log's newest anchor {a} ({where}) by more "
                   "than a crash explains: the log comes from another TPM, or its anchors were forged"]


def describe_gaps(gaps: list[dict]) -> list[str]:
    """Lines for the anchor_gap records of a log: each is a deletion (or a lost counter) sitsd found at a start."""
    out = []
    for g in gaps:
        at = f"{g['file']}:{g['line']}"
        reason = g.get("reason", "tpm_ahead")
        if reason == "tpm_ahead":
            last = g.get("last_anchor")
            out.append(f"GAP recorded at {at}: at that start the TPM counter was {g.get('tpm_counter')} and the newest "
                       f"anchor {last if last is not None else '(none)'}: records after anchor {last} were deleted "
                       f"before that start (the log is not complete)")
        elif reason == "index_recreated":
            out.append(f"GAP recorded at {at}: at that start the anchor counter was missing (TPM cleared or index "
                       f"undefined), the newest anchor was {g.get('last_anchor')}: deletions before that start cannot "
                       "be ruled out")
        else:
            out.append(f"GAP recorded at {at}: at that start the TPM counter ({g.get('tpm_counter')}) was behind the "
                       f"newest anchor ({g.get('last_anchor')}): the log came from another TPM or was forged")
    return out
