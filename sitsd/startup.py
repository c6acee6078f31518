"""sitsd's start, kept stoppable: blocking start work (building the loop: model, signer, TPM measurements,
verify-on-boot; the audit anchor) runs on a daemon thread while the I/O event loop stays free, so SIGTERM / SIGINT
during a start that waits on a TPM stops the daemon within about 2 s (the start thread gets 1 s to reach its next
step: `Startup.settle`) instead of when the start gives up.

Every TPM call of the start is bounded anyway (attestation.tpm.worker: opening the TPM TPM_OPEN_TIMEOUT_S, loading
or creating a key TPM_SETUP_TIMEOUT_S, each later command TPM_CALL_TIMEOUT_S); a call that outlives its bound fails
the start with the step, the TCTI and what to check (`tpm_startup_error`). While a TPM call takes longer than
usual, `watch` logs what it waits for (once per call), puts it in systemd's STATUS= and extends the start timeout
(EXTEND_TIMEOUT_USEC) to the call's own bound, so the start fails with sitsd's message, not systemd's kill.
READY=1 is sent only once the start is complete (Daemon.serve).

A thread abandoned by a stop stays behind (blocked in the TPM); it is a daemon thread and never holds up the exit.
Between its steps it checks `checkpoint`, so work it would do after the stop (frame sockets, the public key file,
prover processes) is never started. What a run created is closed exactly once: by serve() when the run's result
reached it, else by the run's `cleanup` (`Startup.run`), on the thread itself when the stop came while it still
ran (serve() then leaves those objects alone: `Startup.given_up`), so nothing is closed while it is being made.
"""
from __future__ import annotations

import asyncio
import threading
import time

from attestation.errors import TpmError
from attestation.tpm.worker import call_in_thread, pending_calls, timed_out

from .errors import StartupError


SLOW_TPM_CALL_S = 2.0  # a TPM call of the start that takes longer is logged, shown in STATUS= and extends the start
EXTEND_MARGIN_S = 10.0  # beyond a call's own bound: time to fail the start cleanly and log why
WATCH_INTERVAL_S = 0.5


class StartupInterrupted(Exception):
    """SIGTERM / SIGINT (or `sitsctl stop`) while sitsd was starting."""


def hang_fix(tcti: str) -> str:
    """What to check when the TPM accepted the connection and then did not answer."""
    return (f"  fix: the TPM behind {tcti!r} does not answer (it accepted the connection): "
            "a device (device:/dev/tpmrm0): `dmesg | grep -i tpm`, `tpm2_getcap properties-fixed` (another client "
            "holding the TPM, a TPM stuck after a firmware update: power-cycle); tpm2-abrmd (tabrmd TCTI): "
            "`systemctl status tpm2-abrmd`, restart it; swtpm: is the process running and not stopped (state T "
            "in `ps -o stat`), restart it. Then restart sitsd (docs/operations.md, \"the TPM hangs\")")


def tpm_startup_error(step: str, exc: BaseException, tcti: str | None) -> StartupError:
    """The StartupError for a TPM step of the start that failed: the step, the TCTI, and a fix that fits (a hang,
    or another failure)."""
    where = f" (TCTI {tcti!r})" if tcti else ""
    if timed_out(exc):
        return StartupError(f"TPM hung while {step}{where}: {exc}\n{hang_fix(tcti or '?')}")
    return StartupError(f"TPM failed while {step}{where}: {exc}\n  fix: check attestation.tcti, that the daemon user "
                        "may use the TPM (group tss), and `journalctl -k | grep -i tpm`")


def startup_error(step: str, exc: BaseException, tcti: str | None) -> StartupError:
    """An AttestationError no step wrapped: a TPM failure or hang gets the TPM's text and fix
    (`tpm_startup_error`); anything else (an envelope that does not verify in the self-test, a measurement or
    policy error) a neutral "startup failed while <step>" with its own message."""
    if timed_out(exc) or isinstance(exc, TpmError):
        return tpm_startup_error(step, exc, tcti)
    return StartupError(f"startup failed while {step}: {exc}")


class _Run:
    """One `Startup.run`: its thread's state, guarded by Startup._lock."""

    __slots__ = ("key", "cleanup", "running", "busy", "result", "claimed", "given_up")

    def __init__(self, key: str, cleanup) -> None:
        self.key, self.cleanup = key, cleanup
        self.running = True  # its thread has not finished fn yet
        self.busy = True  # its thread has not finished fn and, where it owns it, the cleanup
        self.result = None
        self.claimed = False  # serve() got its result or its error: serve() owns what it created
        self.given_up = False  # the start stopped first: its cleanup closes what it created


class Startup:
    """One start of a Daemon: its stop flag as the build thread sees it, and the step it is at."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.abandoned = threading.Event()  # set by a stop during the start: the build thread stops at a checkpoint
        self.step = "starting"
        self.started = time.monotonic()
        self._reported: set[tuple[str, str]] = set()
        self._lock = threading.Lock()  # the runs' ownership: a stop and a thread finishing never both clean up
        self._runs: list[_Run] = []
        self.given_up: set[str] = set()  # keys of runs whose results serve() never took (their cleanup owns them)

    def checkpoint(self, step: str) -> None:
        """On the build thread, between steps: StartupInterrupted once the start was given up."""
        if self.abandoned.is_set():
            raise StartupInterrupted(f"stopped before {step}")
        self.step = step

    async def run(self, step: str, fn, *args, cleanup=None, key: str | None = None):
        """`fn(*args)` on a daemon thread; StartupInterrupted as soon as the daemon is asked to stop (the thread is
        abandoned: it stops at its next checkpoint, or stays blocked in the TPM until the process exits).

        `cleanup(result)` closes what fn created (result None when fn raised) when its result never reaches the
        caller: run on the thread when the stop came while fn still ran, or at the stop when fn had just finished.
        `key` (default `step`) then goes into `given_up`: the caller must not close those objects itself."""
        run = _Run(key or step, cleanup)
        with self._lock:
            self._runs.append(run)

        def body():
            try:
                result, error = fn(*args), None
            except BaseException as exc:
                result, error = None, exc
            with self._lock:
                run.running, run.result = False, result
                orphaned = run.given_up
            try:
                if orphaned:  # nobody takes the result: close what fn made, here, before the thread ends
                    self._cleanup(run, result)
            finally:
                run.busy = False
            if error is not None:
                raise error
            return result

        try:
            result = await self.until_stopped(step, call_in_thread(body))
        except StartupInterrupted:
            raise
        except BaseException:
            run.claimed = True  # its error reached the caller, whose own cleanup covers what it made
            raise
        run.claimed = True
        return result

    def _cleanup(self, run: _Run, result) -> None:
        if run.cleanup is None:
            return
        try:
            run.cleanup(result)
        except Exception as exc:  # never a crash while stopping; said in the log
            self.daemon.log.warning("closing what an interrupted start step made failed", step=run.key,
                                    error=repr(exc))

    def _give_up(self) -> None:
        """The start stops: from now on every run's result is unwanted. A run still running cleans up on its
        thread when fn returns; one that finished without its result being taken is cleaned up here."""
        finished = []
        with self._lock:
            self.abandoned.set()
            for run in self._runs:
                if run.claimed or run.given_up:
                    continue
                run.given_up = True
                self.given_up.add(run.key)
                if not run.running:
                    finished.append(run)
        for run in finished:
            self._cleanup(run, run.result)

    @property
    def running(self) -> bool:
        """A run's thread is still inside fn (or its cleanup)."""
        return any(r.busy for r in self._runs)

    async def settle(self, timeout_s: float) -> bool:
        """After a stop: wait up to `timeout_s` for the abandoned threads to finish (and close what they made), so
        that what stopped at a checkpoint is closed before the process exits; a thread blocked in the TPM is
        left behind. True when none is left."""
        deadline = time.monotonic() + timeout_s
        while self.running:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def until_stopped(self, step: str, awaitable):
        """Await `awaitable` unless a stop request comes first (then it is cancelled: StartupInterrupted)."""
        self.step = step
        self.daemon.notifier.status(f"starting: {step}")
        work = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(self.daemon._stop.wait())
        interrupted = False
        try:
            await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not work.done():  # stopping (or this coroutine was cancelled): give the work up
                interrupted = True
                work.cancel()
                self._give_up()
        if interrupted:
            raise StartupInterrupted(f"stopped while {self.step}")
        return work.result()

    def describe(self) -> str:
        """What the start was doing, in words (the TPM call it waits for, if any)."""
        calls = pending_calls()
        if calls:
            c = calls[0]
            return (f"{self.step}; waiting {c['waited_s']:.1f} s for the TPM at {c['where']!r} ({c['what']}, "
                    f"bound {c['bound_s']:g} s): the call is left behind")
        return self.step

    async def watch(self) -> None:
        """While starting: a TPM call slower than SLOW_TPM_CALL_S is logged once, shown in STATUS= and extends
        systemd's start timeout to its own bound plus EXTEND_MARGIN_S (each call is bounded, so the start is)."""
        d = self.daemon
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for c in pending_calls():
                if c["waited_s"] < SLOW_TPM_CALL_S or c["given_up"]:
                    continue
                left_s = max(0.0, c["bound_s"] - c["waited_s"])
                status = (f"starting: waiting for the TPM at {c['where']} ({c['what']}, {c['waited_s']:.0f} s of "
                          f"{c['bound_s']:g} s)")
                d.notifier.extend_timeout(left_s + EXTEND_MARGIN_S, status)
                key = (c["where"], c["what"])
                if key not in self._reported:
                    self._reported.add(key)
                    d.log.warning("waiting for the TPM", tcti=c["where"], call=c["what"], step=self.step,
                                  waited_s=round(c["waited_s"], 1), bound_s=c["bound_s"],
                                  detail="the start fails when the bound passes; SIGTERM stops sitsd meanwhile")
