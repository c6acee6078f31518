"""The audit log's in-box anchor: a TPM 2.0 NV counter (TPM_NT_COUNTER) that can only go up.

The hash chain proves every record before the newest one, but a cut of the newest records leaves a valid
prefix. With audit.anchor: tpm the log carries `anchor` records {"counter": N, "nv_index": I}: at start, every
audit.anchor_interval_s, as the first record of each new segment and as the last record of a clean close.
Each is written and fsynced (file and directory) under the log's lock first, and only then is the counter
incremented to N (TPM2_NV_Increment). A crash between the two leaves the log one anchor ahead of the TPM,
never behind, so a crash can never look like a deletion; the next start increments the counter to catch up.

At start the counter C is compared with the newest anchor A in the log: C > A means anchored records (or
whole segments) were deleted, or the log was replaced. sitsd then raises alert `audit_truncated`, appends
an `anchor_gap` record (the gap itself becomes part of the chain) and carries on: the line keeps running.
`sitsctl audit verify --tpm` makes the same comparison offline.

The counter: an owner-hierarchy NV index (audit.anchor_nv_index, owner range 0x01800000-0x01BFFFFF of the TCG
handle registry), defined at first use with TPMA_NV AUTHWRITE | AUTHREAD | OWNERREAD | NO_DA and an empty
auth value, 8 bytes, big-endian. Not ORDERLY: an orderly counter is kept in RAM and after a power loss
(no TPM2_Shutdown) the TPM advances it beyond any value it may have reached, which would read as
"the TPM is ahead of the log" - a false deletion alarm after every power cut. A TPM initialises a new
counter to at least the highest value any counter on it ever had, so deleting and re-defining the index
cannot wind it back either.

What it does not cover: records written after the newest anchor (at most anchor_interval_s of them, or
since the last rotation); and someone who can use the TPM and rewrite the log (root on the device) can
recompute the chain and forge an anchor record with the current counter value: the anchor detects
deletion, not a rewrite by a party holding the device. Anyone who can use the TPM can also increment the
counter (a false alarm, never a hidden deletion).

TPM failures never stop commands or lose records: they are counted (status `audit_anchor.errors`),
raise alert `audit_anchor`, and the anchor is retried at the next interval. The TPM is shared with the
signer (one ESAPI context and lock: swtpm has no resource manager and a second connection would wait
forever); the counter increment runs outside the audit log's lock, so the I/O thread never waits for it.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from .audit import AuditLog, AuditWriteError, anchor_summary, audit_files

OWNER_NV_FIRST, OWNER_NV_LAST = 0x01800000, 0x01BFFFFF  # TCG handle registry: NV indices of the owner
DEFAULT_NV_INDEX = 0x01A0D170
COUNTER_SIZE = 8  # TPM_NT_COUNTER: 8 bytes, big-endian

os.environ.setdefault("TSS2_LOG", "all+none")


def _tss():
    import tpm2_pytss  # lazily: 100 ms, and absent where no TPM is used

    return tpm2_pytss


class AnchorTpmError(Exception):
    """The TPM could not define, read or increment the anchor counter; the message says which and why."""


class OwnTpm:
    """An ESAPI context of our own (sitsctl audit verify, tests, a daemon whose signer shares none):
    opened at first use, reopened after an I/O failure. `lock` serialises its use."""

    def __init__(self, tcti: str) -> None:
        if not tcti:
            raise AnchorTpmError("no TCTI: give --tcti (or SITS_TCTI), or attestation.tcti in the config")
        self.tcti = tcti
        self.lock = threading.Lock()
        self._esapi = None

    def esapi(self):
        if self._esapi is None:
            try:
                self._esapi = _tss().ESAPI(self.tcti)
            except Exception as exc:  # TSS2_Exception or a TCTI that does not load
                raise AnchorTpmError(f"cannot open the TPM through {self.tcti!r}: {exc}") from exc
        return self._esapi

    def reopen(self) -> bool:
        """Caller holds `lock`. Drop the context (after a failure ESYS refuses every further call); the next
        `esapi()` opens a fresh one."""
        old, self._esapi = self._esapi, None
        if old is not None:
            try:
                old.close()
            except Exception:  # its connection is already gone
                pass
        return True

    def close(self) -> None:
        with self.lock:
            self.reopen()


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

    def _run(self, what: str, fn):
        """fn(esapi) under the lock; after a failure the context is reopened (where we may) and fn retried once."""
        t = _tss()
        with self._lock:
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

    def _check_public(self, e, nv) -> None:
        t = _tss()
        pub, _name = e.nv_read_public(nv)
        attrs = int(pub.nvPublic.attributes)
        kind = (attrs & int(t.TPMA_NV.TPM2_NT_MASK)) >> int(t.TPMA_NV.TPM2_NT_SHIFT)
        if kind != int(t.TPM2_NT.COUNTER) or int(pub.nvPublic.dataSize) != COUNTER_SIZE:
            raise AnchorTpmError(f"NV index 0x{self.nv_index:08x} exists but is not an 8-byte counter "
                                 "(TPM_NT_COUNTER); it belongs to something else: choose another audit.anchor_nv_index")
        if attrs & int(t.TPMA_NV.ORDERLY):
            raise AnchorTpmError(f"NV index 0x{self.nv_index:08x} is an ORDERLY counter, which jumps ahead after a "
                                 "power loss (a false deletion alarm): undefine it (tpm2_nvundefine) and let sitsd "
                                 "define it again")
        if not attrs & int(t.TPMA_NV.AUTHWRITE) or not attrs & int(t.TPMA_NV.AUTHREAD):
            raise AnchorTpmError(f"NV index 0x{self.nv_index:08x} is a counter sitsd did not define (no AUTHWRITE/"
                                 "AUTHREAD): choose another audit.anchor_nv_index")

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

    def ensure(self) -> tuple[int, bool]:
        """Define the index if it is missing (and increment it once: an unwritten counter cannot be read);
        returns (value, defined_now). defined_now is also True for an index a crash left unwritten."""
        def op(e):
            created = False
            nv = self._handle(e)
            if nv is None:
                nv = self._define(e)
                created = True
            try:
                self._check_public(e, nv)
                value = self._read_value(e, nv)
                if value is None:  # defined, never incremented: nothing was ever anchored with it
                    e.nv_increment(nv, nv)
                    value, created = self._read_value(e, nv), True
                return value, created
            finally:
                e.tr_close(nv)

        return self._run("TPM2_NV_DefineSpace/Read", op)

    def increment(self) -> int:
        """TPM2_NV_Increment; returns the value read back afterwards."""
        def op(e):
            nv = self._handle(e)
            if nv is None:
                raise AnchorTpmError(f"NV index 0x{self.nv_index:08x} vanished (TPM cleared or index deleted)")
            try:
                e.nv_increment(nv, nv)
                return self._read_value(e, nv)
            finally:
                e.tr_close(nv)

        return self._run("TPM2_NV_Increment", op)

    def close(self) -> None:
        conn = getattr(self, "connection", None)
        if conn is not None:
            conn.close()


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
        self.errors = 0  # TPM or disk failures while anchoring
        self.last_error: str | None = None
        self.last_anchor_ns: int | None = None
        self._tpm_lock = threading.Lock()  # one anchor at a time: start check, record + increment
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._anchored_path = None  # the segment that holds the newest anchor record
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
                "last_anchor_ns": self.last_anchor_ns, "anchors": self.anchors, "errors": self.errors,
                "last_error": self.last_error, "start_check": self.start_check, "gap": self.gap,
                "pending_increment": self.tpm is not None and self.logged is not None and self.logged > self.tpm,
                "interval_s": self.interval_s}

    # -- lifecycle ------------------------------------------------------------------------------------
    def attach(self, audit: AuditLog) -> "AuditAnchor":
        """Compare the TPM with the log, anchor the start, then anchor every interval_s on a thread."""
        self.audit = audit
        audit.anchor = self
        if self.check_start():
            self.anchor_now("start")
        self._thread = threading.Thread(target=self._loop, name="sits-audit-anchor", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        due = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            if time.monotonic() >= due:
                self.anchor_now("interval")
                due = time.monotonic() + self.interval_s
            elif self._last_failure is None or time.monotonic() - self._last_failure >= self.interval_s:
                # woken by a rotation: the increment its anchor record waits for; or, where that record had to
                # wait for an earlier increment, the new segment's anchor now (a failing TPM waits for the interval)
                if self.settle() and self._anchored_path != self.audit.path:
                    self.anchor_now("rotation")

    def close(self) -> None:
        """After AuditLog.close wrote the closing anchor: its increment, then the thread stops."""
        self._closing = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self.settle()

    # -- the start comparison -------------------------------------------------------------------------
    def check_start(self) -> bool:
        """Read the counter C (defining it at first use) and the newest anchor A in the log; C > A: records were
        deleted; C == A - 1: a crash between record and increment (caught up quietly). False if the TPM
        failed (retried at the next interval)."""
        with self._tpm_lock:
            if self.checked:
                return True
            summary = anchor_summary(audit_files(self.audit.directory), newest_only=True)
            newest = summary["newest"]
            a = newest["counter"] if newest else None
            try:
                c, created = self.counter.ensure()
            except AnchorTpmError as exc:
                self._failed("reading the counter at start", exc)
                return False
            where = f"{newest['file']}:{newest['line']}" if newest else None
            idx = f"0x{self.nv_index:08x}"
            gap = None
            if a is None and created:
                self.start_check = "first_use"
                self._log("info", "audit anchor: counter defined", nv_index=idx, counter=c)
            elif a is None:
                gap = ("tpm_ahead", "audit_truncated",
                       f"audit log truncated or replaced: the TPM counter at {idx} is {c}, but the log in "
                       f"{self.audit.directory} holds no anchor record: its anchored records were deleted")
            elif created:
                gap = ("index_recreated", "audit_anchor",
                       f"the audit anchor counter {idx} was missing (TPM cleared, or the index deleted) although "
                       f"the log's newest anchor is {a} ({where}); it starts again at {c}: deletions of records "
                       f"after that anchor cannot be ruled out")
            elif c > a:
                gap = ("tpm_ahead", "audit_truncated",
                       f"audit log truncated: the TPM counter at {idx} is {c}, the log's newest anchor is {a} "
                       f"({where}): the newest {c - a} anchor(s) and the records after anchor {a} were deleted, or "
                       f"the log was replaced")
            elif c == a - 1:  # the record was on disk, the increment not yet: a crash, never a deletion
                try:
                    c = self.counter.increment()
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
                          "last_anchor_at": where, "nv_index": f"0x{self.nv_index:08x}", "t_ns": time.time_ns()}
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
        self.anchors += 1
        self.last_anchor_ns = time.time_ns()
        return True

    def settle(self) -> bool:
        """Increment the counter up to the newest anchor record (at most one step); True when in step."""
        with self._tpm_lock:
            if self.tpm is None or self.logged is None or self.logged <= self.tpm:
                return self.tpm is not None
            try:
                value = self.counter.increment()
            except AnchorTpmError as exc:
                self._failed(f"TPM2_NV_Increment to anchor {self.logged}", exc)
                return False
            if value != self.logged:  # someone else incremented it too: a false alarm waiting to happen
                self._alert("audit_anchor", f"audit anchor counter 0x{self.nv_index:08x} is {value} after the "
                            f"increment to anchor {self.logged}: something else increments it; the next anchor "
                            "follows the TPM")
                self._log("warning", "audit anchor counter moved by someone else", counter=value,
                          expected=self.logged)
            self.tpm = value
            return True

    def anchor_now(self, reason: str = "interval") -> bool:
        """One anchor: (retry the start check and a pending increment), record + fsync, increment."""
        if not self.checked and not self.check_start():
            return False
        if not self.settle():
            return False
        with self.audit.lock:
            if self.audit.closed:
                return False
            written = self._record_locked(reason)
        return self.settle() if written else False

    def on_rotation_locked(self) -> None:
        """AuditLog._rotate_locked: the new segment's first record after its header; the increment is left
        to the anchor thread so the I/O thread never waits for the TPM. While an earlier anchor's increment
        is still pending, the thread writes this segment's anchor as soon as that one is done."""
        if not self._closing:
            self._record_locked("rotation")
            self._wake.set()  # its increment; or, if an earlier one was still pending, the anchor itself soon

    def on_close_locked(self) -> None:
        """AuditLog.close, under its lock: the last record of the run (its increment follows in close())."""
        self._closing = True
        self._record_locked("close")


def verify_against_tpm(summary: dict, counter: int | None, nv_index: int) -> tuple[bool, list[str]]:
    """`sitsctl audit verify --tpm`: the TPM counter against the newest anchor of a log whose chain verified.
    Returns (complete, lines to print)."""
    idx = f"0x{nv_index:08x}"
    newest = summary["newest"]
    a = newest["counter"] if newest else None
    where = f"{newest['file']}:{newest['line']}" if newest else None
    if counter is None:
        if a is None:
            return False, [f"no anchor: the TPM has no counter at {idx} and the log no anchor record (audit.anchor "
                           "was never on for this log, or another TPM or NV index)"]
        return False, [f"the TPM has no counter at {idx}, but the log's newest anchor is {a} ({where}): another TPM, "
                       f"another audit.anchor_nv_index, or the index was deleted (TPM cleared)"]
    if a is None:
        return False, [f"TRUNCATED: the TPM counter at {idx} is {counter}, but the log holds no anchor record: its "
                       f"anchored records were deleted, or the log was replaced"]
    not_covered = (f"{summary['after_newest']} command record(s) after that anchor are not covered by it (written "
                   "since the last anchor: at most audit.anchor_interval_s of records, or since the last segment "
                   "rotation)")
    if counter > a:
        return False, [f"TRUNCATED: the TPM counter at {idx} is {counter}, the log's newest anchor is {a} ({where}): "
                       f"the newest {counter - a} anchor(s) are missing: records after anchor {a} were deleted, "
                       f"or the log was replaced by an older copy"]
    if counter == a:
        return True, [f"anchored: the TPM counter at {idx} ({counter}) matches the newest anchor ({where})",
                      not_covered]
    if counter == a - 1:
        return True, [f"anchored: the log is one anchor ahead of the TPM counter at {idx} ({counter} < {a}, {where}): "
                      "sitsd stopped between an anchor record and its increment (a crash, not a deletion); the "
                      "next start catches the counter up", not_covered]
    return False, [f"the TPM counter at {idx} ({counter}) is behind the log's newest anchor {a} ({where}) by more "
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
                       f"deleted), the newest anchor was {g.get('last_anchor')}: deletions before that start cannot "
                       "be ruled out")
        else:
            out.append(f"GAP recorded at {at}: at that start the TPM counter ({g.get('tpm_counter')}) was behind the "
                       f"newest anchor ({g.get('last_anchor')}): the log came from another TPM or was forged")
    return out
