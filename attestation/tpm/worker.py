"""Bounded TPM access: every ESAPI call of one signer runs on that signer's own daemon thread, and its caller waits at
most a timeout. The TCTIs (swtpm sockets, /dev/tpmrm0) block without one: a frozen swtpm or a wedged TPM would
otherwise block the calling thread forever (the control loop, asyncio's default executor, whoever holds the signer
lock), and with it SIGTERM. Used by the tpm-direct signer (attestation.tpm.signer) and the tpm-session signer
(attestation.session), and through their `_open_esapi` by the measurement log and the audit anchor.

Timeouts are read when a call is made, never bound at definition time: a test may lower TPM_CALL_TIMEOUT_S here.
A call that outlives its bound raises TpmTimeout (a TpmError); `pending_calls` lists the calls in progress in the
process (sitsd's start reports what it waits for: sitsd/startup.py).
"""
from __future__ import annotations

import queue
import threading
import time
import weakref

from ..errors import TpmError

TPM_CALL_TIMEOUT_S = 5.0  # one TPM command (a discrete TPM: tens of ms; a quote well under 1 s)
TPM_OPEN_TIMEOUT_S = 10.0  # opening the ESAPI context through the TCTI (tpm-direct; swtpm ~0.5 ms, a device < 1 s)
# loading a key, or creating it at first use (ECC P-256 primary: ms on swtpm, up to seconds on a discrete TPM);
# tpm-session also opens the TPM under this bound. Each bound is well inside the unit's TimeoutStartSec=60s, and
# sitsd extends the start timeout (EXTEND_TIMEOUT_USEC) while it waits on a TPM call (sitsd/startup.py)
TPM_SETUP_TIMEOUT_S = 30.0

_workers: "weakref.WeakSet[TpmWorker]" = weakref.WeakSet()  # every TpmWorker of this process (pending_calls)
_workers_lock = threading.Lock()


class TpmTimeout(TpmError):
    """A TPM call that did not answer within its bound, or one not attempted behind such a call: the TPM (or its
    resource manager, or swtpm) hangs or is overloaded. A TpmError, so existing handlers still catch it."""


def timed_out(exc: BaseException | None) -> bool:
    """Whether `exc` or anything it was raised from (__cause__ / __context__) is a TpmTimeout."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, TpmTimeout):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def pending_calls() -> list[dict]:
    """The TPM calls in progress in this process now, oldest first: where (the TCTI), what, `waited_s`, `bound_s`
    (how long its caller waits) and `given_up` (a caller timed out on it). sitsd reports them while it starts
    (what it waits for, STATUS= and EXTEND_TIMEOUT_USEC) and when it is stopped while starting."""
    now = time.monotonic()
    with _workers_lock:
        workers = list(_workers)
    calls = []
    for w in workers:
        busy = w._busy
        if busy is not None:
            calls.append({"where": w.where, "what": busy[0], "waited_s": now - busy[1], "bound_s": busy[2],
                          "given_up": busy is w._stalled})
    return sorted(calls, key=lambda c: -c["waited_s"])


def call_timeout_s() -> float:
    """The per-call bound now (this module's TPM_CALL_TIMEOUT_S, looked up at call time)."""
    return TPM_CALL_TIMEOUT_S


class TpmLock:
    """A signer's lock, shared with the measurement log and the audit anchor: waits at most `timeout_s` (every
    holder's TPM calls are bounded, so a longer wait means a TPM that hangs), then raises TpmError. `timeout_s` None:
    2 × TPM_CALL_TIMEOUT_S + 1 s, read at each acquisition."""

    def __init__(self, what: str, timeout_s: float | None = None) -> None:
        self._lock = threading.Lock()
        self.what, self._timeout_s = what, timeout_s

    @property
    def timeout_s(self) -> float:
        return self._timeout_s if self._timeout_s is not None else 2 * TPM_CALL_TIMEOUT_S + 1.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> "TpmLock":
        timeout_s = self.timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            raise TpmTimeout(f"{self.what}: busy for more than {timeout_s:.0f} s (another TPM command has not "
                           "returned: the TPM hangs or is overloaded)")
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


class TpmWorker:
    """Runs every ESAPI call of one signer on one daemon thread (ESYS is not thread-safe anyway) and waits at most a
    timeout for each (`timeout_s`, else TPM_CALL_TIMEOUT_S as it is at call time). A TPM that hangs then costs its
    caller TpmError after the timeout instead of a thread blocked forever. The stuck call stays on this daemon thread
    (it does not hold up interpreter exit); once a caller has given up on it (or it has run longer than the caller's
    bound), further calls fail at once until it returns."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # the current thread's
        self._busy: tuple[str, float, float] | None = None  # (what, since, the caller's bound) of the call running
        self._stalled: tuple[str, float, float] | None = None  # the `_busy` a caller timed out on (the TPM hangs)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.timeouts = 0
        with _workers_lock:
            _workers.add(self)

    def call(self, what: str, fn, *args, timeout_s: float | None = None, **kwargs):
        if timeout_s is None:
            timeout_s = TPM_CALL_TIMEOUT_S  # at call time: a module constant patched later counts
        busy = self._busy
        if busy is not None and (busy is self._stalled or time.monotonic() - busy[1] > timeout_s):
            # (a stable text: the loop alerts once a second per distinct error, so no elapsed time in it)
            raise TpmTimeout(f"TPM at {self.where!r} has not answered {busy[0]} within its bound (hung or overloaded); "
                             f"{what} not attempted until it does")
        # fn, args, kwargs, done, result, error, cancelled, what, the caller's bound
        job = [fn, args, kwargs, threading.Event(), None, None, False, what, timeout_s]
        self._submit(job)
        if not job[3].wait(timeout_s):
            job[6] = True  # not started yet: never run it later (a late PCR extend would break the log)
            busy = self._busy
            if not job[3].is_set():  # (it may have finished just now: then its result counts)
                self.timeouts += 1
                if busy is not None:
                    self._stalled = busy  # what runs now outlived a caller's bound: fail fast until it returns
                raise TpmTimeout(f"TPM at {self.where!r} did not answer {what} within {timeout_s:g} s "
                                 "(hung or overloaded)")
        if job[5] is not None:
            raise job[5]
        return job[4]

    def _submit(self, job) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._jobs = queue.SimpleQueue()  # a thread of its own queue: a stopped one never takes new work
                self._thread = threading.Thread(target=self._run, args=(self._jobs,), name=f"tpm {self.where}",
                                                daemon=True)
                self._thread.start()
            self._jobs.put(job)

    def _run(self, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            fn, args, kwargs, done, _, _, cancelled, what, bound = job
            if cancelled:
                continue
            self._busy = (what, time.monotonic(), bound)
            try:
                job[4] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, who waits for it
                job[5] = exc
            finally:
                self._busy = None
                self._stalled = None
                done.set()

    @property
    def busy(self) -> bool:
        """A call is in progress on the TPM thread (or stuck there)."""
        return self._busy is not None

    @property
    def hung(self) -> bool:
        """The call in progress has outlived a caller's bound, or TPM_CALL_TIMEOUT_S."""
        busy = self._busy
        return busy is not None and (busy is self._stalled or time.monotonic() - busy[1] > TPM_CALL_TIMEOUT_S)

    def stop(self) -> None:
        """The thread ends after the call in progress (if any: a stuck one ends with the process); a later call
        starts a fresh one."""
        with self._start_lock:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread = None

    def abandon(self, esapi) -> None:
        """Drop a signer's ESAPI context: closed on this thread when no call is in progress (a call still in
        progress holds the context: it is left to the process exit), then the thread stopped."""
        if esapi is not None and not self.busy:
            try:
                self.call("closing the TPM context", esapi.close, timeout_s=1.0)
            except Exception:  # closing is best effort
                pass
        self.stop()


class BoundedEsapi:
    """The ESAPI context as a signer's users see it (`_open_esapi`): each method call runs on the signer's TPM worker
    thread with a timeout. `esapi` is the context, or `getter` returns it at each call (on the worker thread, so a
    context replaced by a reconnect meanwhile is the one used). Non-callable attributes pass through."""

    def __init__(self, worker: TpmWorker, esapi=None, *, getter=None, timeout_s: float | None = None) -> None:
        if getter is None:
            if esapi is None:
                raise ValueError("BoundedEsapi needs a context or a getter")
            getter = (lambda: esapi)
        self._worker, self._get, self._timeout_s = worker, getter, timeout_s

    def __getattr__(self, name: str):
        get = self._get
        esapi = get()
        if esapi is None:
            raise TpmError(f"the TPM context at {self._worker.where!r} is closed")
        attr = getattr(esapi, name)
        if not callable(attr):
            return attr

        def run(*args, **kwargs):
            current = get()
            if current is None:
                raise TpmError(f"the TPM context at {self._worker.where!r} is closed")
            return getattr(current, name)(*args, **kwargs)

        def call(*args, **kwargs):
            return self._worker.call(f"TPM2 {name}", run, *args, timeout_s=self._timeout_s, **kwargs)

        return call


async def call_in_thread(fn, *args):
    """`await fn(*args)` on a fresh daemon thread: for TPM work from asyncio. Unlike asyncio.to_thread (the default
    executor, whose threads the interpreter joins at exit), a thread left behind by a hung TPM never holds up the
    daemon's exit; cancelling the await abandons the thread and drops its result (the thread runs on: work that must
    not commit after being abandoned checks a token of its own, as sitsd's re-measurement does)."""
    import asyncio

    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error) -> None:
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the event loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, name=f"tpm-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await future
