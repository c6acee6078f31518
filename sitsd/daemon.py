"""The daemon: builds the loop from a Config, runs the I/O thread (asyncio), and reports.

Threads: the caller's thread runs `serve()` (asyncio: the OPC UA session, command writes, the
control socket, sd_notify and logging); `ControlLoop` runs the fast path on its own thread.
Work crosses from the loop to the I/O thread through `call_soon_threadsafe` into a bounded queue.
"""
from __future__ import annotations

import asyncio
import hashlib
import statistics
import threading
import time
from collections import Counter, deque
from pathlib import Path

from asyncua import ua

from attestation.envelope import Command, EnvelopeVerifier
from attestation.errors import AttestationError
from attestation.signers import SoftwareSigner
from ep.errors import ModelLoadError
from ep.session import ModelRunner
from plc.errors import TransportError
from plc.eth import EthFrameSource
from plc.frame import RxStampSource
from plc.profiles import PlcEvent
from plc.opcua_source import OpcUaSubscriptionSource
from plc.uadp import compile_layout
from plc.udp import UdpFrameSource

from . import control
from .audit import AuditLog, AuditWriteError
from .config import Config, OpcUaSubscriptionTransport, UadpEthTransport
from .errors import StartupError
from .gates import ConstraintGate, SafetyEnvelope, TimestampGate
from .gates.ptp import query_pmc
from .hotswap import attach, control_handlers, load_config_modules
from .rca.service import attach_rca
from .log import get_logger
from .model import build_model, runtime_report
from .notify import Notifier
from .pipeline import ControlLoop, Counters, Outgoing
from .plc_link import PlcLink
from .startup import Startup, StartupInterrupted, hang_fix, startup_error, timed_out, tpm_startup_error
from .stats import STAGE_INDEX, TimingRing
from .wasm import WasmError

QUEUE_DEPTH = 8
# frame watchdog (timing.frame_timeout_ms unset): no frame for this many cycles, and never less than the floor
FRAME_TIMEOUT_CYCLES = 50
FRAME_TIMEOUT_FLOOR_MS = 1000.0
RECONNECT_FIRST_S = 0.2  # PLC reconnect: wait before the first attempt, doubling up to RECONNECT_MAX_S
RECONNECT_MAX_S = 2.0
FRAME_STALL_MAX_BACKOFF_S = 60.0  # opcua-subscription: a stall that outlives a rebuild is retried at most this rarely
PUBKEY_FILE = "signer.pub.pem"
TPM_PROBE_S = 2.0  # tpm-session: how often the TPM is asked whether it still answers
TPM_PROBE_TIMEOUT_S = 30.0  # a probe or re-measurement that takes longer is abandoned (each TPM call is bounded too)
DEVICE_KEY_FILE = "device.pub.pem"  # tpm-session: the attestation key the PLC trusts


def make_signer(cfg: Config):
    """The signer the config asks for; a TPM that cannot be reached is an error, never a silent downgrade."""
    if cfg.attestation.mode == "software":
        return SoftwareSigner()
    from attestation.session import TpmSessionSigner
    from attestation.tpm import TpmSigner, WrongKeyError

    a = cfg.attestation
    try:
        if a.signing == "tpm-session":  # its device key (certify_session) is the policy-bound one
            return TpmSessionSigner(a.tcti, a.device_key_handle, a.ak_handle)
        return TpmSigner(a.tcti, a.key_handle)  # the password signing key
    except WrongKeyError as exc:  # the TPM answers; the key at key_handle is the wrong kind (its own fix)
        raise StartupError(str(exc)) from exc
    except AttestationError as exc:
        if timed_out(exc):  # it accepted the connection and never answered: hung, not absent
            raise StartupError(f"{exc}\n{hang_fix(a.tcti)}") from exc
        raise StartupError(f"{exc}\n  fix: check attestation.tcti, that the daemon user may open the TPM "
                           f"(group tss), or set attestation.mode: software for development") from exc


class Daemon:
    def __init__(self, cfg: Config, *, signer=None, notifier: Notifier | None = None,
                 config_path: Path | None = None, config_overrides: dict | None = None,
                 config_sha256: str | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        # the SHA-256 of the bytes `cfg` was parsed from (sitsd reads the file once); None: hashed from the file
        self.config_sha256_at_start = config_sha256
        self.config_overrides = config_overrides
        self.reloads = 0
        self.signer = signer
        self.notifier = notifier or Notifier()
        self.log = get_logger("sitsd")
        self.counters = Counters()
        self.timings = TimingRing()
        self.alerts: deque = deque(maxlen=4096)
        self.alert_counts: Counter[str] = Counter()
        self.plc_rejected = 0  # commands the PLC refused (BadSecurityChecksFailed and other Bad status)
        self.last_alerts: deque = deque(maxlen=20)
        self.plc_events: deque = deque(maxlen=20)
        self.plc_event_counts: Counter[str] = Counter()
        self.state = "starting"
        self.ptp_status = None
        self.metrics = None
        self.timestamp_drop_counts: Counter[str] = Counter()
        self.ready = threading.Event()
        self.startup_error: BaseException | None = None
        self.exit_code = 0
        self.loop: ControlLoop | None = None
        self.model: ModelRunner | None = None
        self.source: UdpFrameSource | None = None
        self.audit: AuditLog | None = None
        self.audit_anchor = None  # sitsd.audit_anchor.AuditAnchor with audit.anchor: tpm
        # acknowledged commands whose audit record could not be written yet (disk full): kept in order,
        # written first when the disk takes records again; while any wait, no new command is sent
        self.audit_backlog: deque[dict] = deque()
        self.audit_held = 0  # commands not sent because the audit log could not take their record
        self.link: PlcLink | None = None
        # the PLC link (sitsd/plc_link.py): losses however noticed, reconnects, commands not sent meanwhile
        self._link_lost: asyncio.Event | None = None
        # SIGHUP, `sitsctl reload`, update/rollback --config and deploy never apply two configs at once (reentrant:
        # a config rollback holds it from its check to its restore, which takes it again)
        self._reload_lock = threading.RLock()
        self._in_flight: Outgoing | None = None  # the command the writer is sending (drained before stopping)
        self.link_losses = 0
        self.link_reconnects = 0
        self.link_not_sent = 0
        self.link_last_loss: str | None = None
        self._link_down_since: float | None = None
        self._frame_progress_at = time.monotonic()
        self._frame_stall: dict | None = None  # {"since": monotonic, "escalations": n} while no frame comes
        self._config_rollback: asyncio.Task | None = None  # an automatic config rollback in progress (housekeeping)
        self._aio: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._queue: asyncio.Queue | None = None
        self._started = time.monotonic()
        self._own_signer = signer is None
        self.wasm = None  # sitsd.wasm.WasmHost when the config names modules
        self.hotswap = None  # sitsd.hotswap.HotSwap once the loop is built
        self.measurements = None  # attestation.measurement.MeasurementLog
        self.persistence = None  # sitsd.persist.Persistence: hot swaps that survive a restart
        # tpm-session probe: reachability, and TPM resets (bound: the session key is attested; resets seen;
        # remeasure_failures: re-measurement attempts the TPM refused, retried every probe)
        self.tpm_state = {"reachable": True, "outages": 0, "errors": 0, "last_error": None, "bound": True,
                          "resets": 0, "remeasure_failures": 0, "last_reset": None}
        # one re-measurement after a TPM reset at a time; an attempt `_watch_tpm` gave up on (timed out, failed,
        # cancelled) never commits: each attempt carries the generation it was started with
        self._remeasure_lock = threading.Lock()
        self._remeasure_generation = 0
        self._startup: Startup | None = None  # while serve() starts (sitsd/startup.py)
        self._reload_pending: str | None = None  # a reload asked for while starting (SIGHUP): applied after READY=1

    # -- startup ------------------------------------------------------------------------------
    def _build(self) -> None:
        cfg = self.cfg
        names = cfg.signal_names
        # attestation.require_signatures: unsigned or wrongly signed modules/model/config stop us here
        self.signatures = __import__("sitsd.signatures").signatures.check_startup(cfg, self.config_path)
        # hot swaps persisted by an earlier run (sitsd/persist.py): loaded instead of the config's model and
        # modules when based on these very config bytes and every file verifies; else None, the config wins
        from .persist import Persistence

        self.persistence = Persistence(self)
        restored = self.persistence.restore()
        if restored is not None and restored.modules is not None:
            self.wasm = restored.modules[0]  # closed at stop, as the config's host is
        try:
            # sitsd/model.py: ModelRunner, or StreamingRunner for kind streaming
            self.model = restored.model if restored is not None and restored.model is not None else build_model(cfg)
        except ModelLoadError as exc:
            raise StartupError(str(exc)) from exc
        self.log.info("model runtime", **(runtime_report(self.model) or {"provider": None}))
        if cfg.model.kind == "streaming":
            self.log.info("streaming model", **self.model.recovered, state_dir=str(self.model.pool.directory),
                          window=cfg.model.stream.window, proofs="off (no circuit for attention)",
                          hot_swap="refused (restart to change the model)")
        if cfg.model.sha256 and self.model.sha256.hex() != cfg.model.sha256:  # (a persisted model was checked)
            raise StartupError(f"model {cfg.model.artifact}: SHA-256 {self.model.sha256.hex()} differs from "
                               f"model.sha256 {cfg.model.sha256} pinned in the config")
        if self.signer is None:
            self._start_step("opening the TPM and loading its keys" if cfg.attestation.mode == "tpm2"
                             else "creating the software signing key")
            self.signer = make_signer(cfg)
        if self.signer.kind == "software":
            self.log.warning("software signing key", detail="commands are signed with an Ed25519 key in process "
                             "memory, not anchored in a TPM; use attestation.mode: tpm2 in production")
        elif hasattr(self.signer, "measure_model"):
            self._start_step("measuring the model into PCR 16")
            try:
                pcr = self.signer.measure_model(self.model.sha256)
            except AttestationError as exc:
                raise tpm_startup_error("measuring the model into PCR 16", exc, cfg.attestation.tcti) from exc
            self.log.info("model measured into TPM", pcr=16, value=pcr.hex())
            if self.signer.kind == "tpm-session" and cfg.attestation.session_credential == "model-only":
                self.log.warning("session credential model-only", detail="the PLC gets version 1 credentials (a "
                                 "quote over PCR 16 only): it does not see the modules or config that run, though "
                                 f"they are still measured into PCR {cfg.attestation.measurement_pcr}; set "
                                 "attestation.session_credential: measured once the PLC gateway's verifier takes "
                                 "version 2 (docs/deploy.md)")
        self._start_step("the signer's self-test")
        sign_budget_ns = self._signer_self_test()
        self._start_step("writing the signer's public key and opening the frame source")
        audit_dir = Path(cfg.audit.directory)
        audit_dir.mkdir(parents=True, exist_ok=True)
        (audit_dir / PUBKEY_FILE).write_bytes(self.signer.public_key_pem())
        if hasattr(self.signer, "device_public_key_pem"):
            (audit_dir / DEVICE_KEY_FILE).write_bytes(self.signer.device_public_key_pem())
        t = cfg.transport
        try:
            if isinstance(t, OpcUaSubscriptionTransport):
                self.source = OpcUaSubscriptionSource(len(names), t.publishing_interval_ms)
            else:
                # a NIC's hardware RX stamps read its PHC (TAI under ptp4l): moved to UTC with the configured offset
                stamps = {"phc_timescale": cfg.timing.ptp.phc_timescale, "utc_offset_s": cfg.timing.ptp.utc_offset_s}
                # the fast path is compiled for the configured PublisherId type (a string id: its length);
                # frames of other publishers, writer groups and writers are skipped and counted
                layout = compile_layout(len(names), t.field_encoding, t.publisher_id_type, t.publisher_id,
                                        field_types=t.field_types)
                if isinstance(t, UadpEthTransport):
                    self.source = EthFrameSource(t.url, t.interface, layout, t.publisher_id, t.dataset_writer_id,
                                                 writer_group_id=t.writer_group_id, **stamps)
                else:
                    self.source = UdpFrameSource(t.url, layout, t.interface, t.publisher_id, t.dataset_writer_id,
                                                 writer_group_id=t.writer_group_id, **stamps)
                hw = getattr(self.source, "hw_stamps", None)
                if hw is not None:
                    self.log.info("rx timestamps", hardware=getattr(hw, "action", None),
                                  detail=getattr(hw, "detail", str(hw)))
        except TransportError as exc:
            raise StartupError(str(exc)) from exc
        try:
            if restored is not None and restored.modules is not None:
                _, pre, post = restored.modules  # verified and self-tested by Persistence.restore
            else:
                self.wasm, pre, post = load_config_modules(cfg)
        except WasmError as exc:
            raise StartupError(f"{exc}\n  fix: correct the module or its golden vectors, or remove it from "
                               f"`modules:`") from exc
        self.report_cache_refused(pre, post)
        if self.wasm is not None and not self.wasm.ticker["native"]:
            self.log.warning("python epoch ticker", detail="sitsd._native is not built: the WASM epoch ticker runs as "
                             "a Python thread and module calls release the GIL, so the loop thread waits for it "
                             "more often", fix="reinstall sits2026 with a C compiler and the Python headers")
        sign_path = getattr(self.signer, "sign_path", "")
        if sign_path.startswith("cryptography"):
            self.log.warning("signature releases the GIL", detail=f"commands are signed through {sign_path}: the loop "
                             "thread hands the GIL to other threads in the middle of each frame and waits to get it "
                             "back", fix="install OpenSSL's libcrypto (libssl3) on the box")
        run_path = getattr(self.model, "run_path", "")
        if run_path.startswith("pybind"):  # ep.capi: the C API session keeps the GIL through the model's run
            self.log.warning("model run releases the GIL", detail=f"the model runs through {run_path}: the loop thread "
                             "hands the GIL to other threads in the middle of each frame and waits to get it back",
                             fix="install the onnxruntime wheel as published (it ships libonnxruntime.so next to "
                             "its Python module); with a non-CPU provider this is expected")
        self.loop = ControlLoop(
            source=self.source,
            timestamp_gate=TimestampGate(
                int(cfg.timing.max_transit_ms * 1e6), int(cfg.timing.max_future_ms * 1e6),
                max_age_ns=int(cfg.timing.max_age_ms * 1e6) if cfg.timing.max_age_ms else None,
                window=cfg.timing.replay_window, require_hardware_stamps=cfg.timing.require_hardware_stamps),
            constraint_gate=ConstraintGate(cfg.signals, cfg.constraints),
            model=self.model,
            input_index=[names.index(n) for n in cfg.model.inputs],
            safety=SafetyEnvelope(cfg.safety.actuators, cfg.model.outputs),
            signer=self.signer, submit=self._submit_threadsafe, target=cfg.plc.command_node,
            deadline_ns=int(cfg.timing.deadline_ms * 1e6), sign_budget_ns=sign_budget_ns,
            max_consecutive_drops=cfg.timing.max_consecutive_drops, clock_policy=cfg.timing.ptp.policy,
            timings=self.timings, counters=self.counters, alerts=self.alerts,
            loop_cpu=cfg.runtime.loop_cpu, realtime_priority=cfg.runtime.realtime_priority, pre=pre, post=post)
        if restored is not None:  # `sitsctl versions` shows it as the startup set's label
            self.loop.stage_set.label = "startup (persisted updates)"
        self.persistence.started(self.loop.stage_set)
        self._start_step("measuring model, modules and config into the measurement PCR")
        self.hotswap = attach(self)
        if restored is not None:  # the config's versions, loaded for `sitsctl rollback`; the restored set is watched
            self.persistence.keep_fallback(self.hotswap)
        # verify_on_boot: what was just measured must match the staged `sitsctl deploy` record, checked by a
        # fresh TPM quote, before the first command is signed for the PLC; StartupError otherwise
        self._start_step("verify-on-boot (a fresh TPM quote)")
        self.deployment = __import__("sitsd.deploy").deploy.check_on_boot(self)
        self._start_step("starting fault attribution and the prover")
        self.rca = attach_rca(self)  # fault attribution: event stream + signal ring (sitsctl diagnose)
        self._start_step("starting the prover")  # its process pool is never started after a stop
        # Groth16 proofs of commands off the fast path (sitsd/prover.py); chains onto the observer above
        self.prover = __import__("sitsd.prover").prover.attach_prover(self) if cfg.proof.policy != "off" else None

    def report_cache_refused(self, *versions) -> None:
        """Modules loaded at start whose .cwasm cache entry failed its integrity check (ModuleVersion.cache_refused):
        they run, recompiled from their source, but something wrote into the cache: a warning and a `wasm_cache`
        alert each. Also called by Persistence.keep_fallback for the rollback targets it loads."""
        for version in versions:
            if version is None or not getattr(version, "cache_refused", None):
                continue
            self.log.warning("wasm cache entry refused", module=version.name, stage=version.stage,
                             path=str(version.path), sha256=version.sha256, reason=version.cache_refused,
                             detail="the module was recompiled from its source and runs; the cached native code "
                             "did not match its record or the record was not made with this device's cache key",
                             fix="find out what wrote into the wasm cache directory (only sitsd should); the entry "
                             "was removed and rewritten")
            self._alert("wasm_cache", f"module {version.name} ({version.stage}, {Path(version.path).name}): its .cwasm "
                        f"cache entry was refused and the module recompiled from its source: {version.cache_refused}")

    def _start_step(self, step: str) -> None:
        """_build's progress (on the start thread, sitsd/startup.py): StartupInterrupted once a stop gave it up."""
        if self._startup is not None:
            self._startup.checkpoint(step)

    def _close_abandoned_build(self, _result=None) -> None:
        """The start stopped while _build ran (or before serve() took its result): close what it made, on the start
        thread when it finishes late. serve() leaves these alone then (Startup.given_up), so nothing is closed
        twice or while it is being made. Never raises."""
        def close(what, fn) -> None:
            try:
                fn()
            except Exception as exc:
                self.log.warning("closing after an interrupted start failed", what=what, error=repr(exc))

        if getattr(self, "prover", None) is not None:
            close("the prover", self.prover.close)
        if self.source is not None:
            close("the frame source", self.source.close)
        if self.wasm is not None:
            close("the modules", self.wasm.close)
        if getattr(self.model, "kind", "mlp") == "streaming":
            close("the streaming model", self.model.close)
        if self.signer is not None and self._own_signer:
            close("the signer", self.signer.close)

    def _attach_audit_anchor(self):
        """audit.anchor tpm: the TPM NV counter behind the log's anchor records, through the signer's ESAPI context
        and lock (swtpm has no resource manager: a second connection would wait forever). A deletion found
        at start raises alert audit_truncated and is recorded in the log (sitsd/audit_anchor.py)."""
        from .audit_anchor import AuditAnchor, counter_for_signer

        a = self.cfg.audit
        counter = counter_for_signer(self.signer, self.cfg.attestation.tcti, a.anchor_nv_index)
        anchor = AuditAnchor(counter, a.anchor_interval_s, on_alert=self._alert, log=self.log)  # thread-safe
        # registered with the log by serve() once this returns (on the event loop): a stop during this step
        # never makes AuditLog.close wait for the start check's TPM call (the close anchor is skipped then)
        anchor.attach(self.audit, register=False)
        st = anchor.status()
        self.log.info("audit anchor", nv_index=st["nv_index"], counter=st["counter"], start_check=st["start_check"],
                      interval_s=a.anchor_interval_s)
        return anchor

    def _signer_self_test(self) -> int:
        """Sign and verify a few commands; returns the signing budget used by the deadline check."""
        # a signature round trip only: the self-test commands carry no deadline, so freshness is explicitly off
        verifier = EnvelopeVerifier(self.signer.public_key_pem(), self.model.sha256, freshness=False)
        times = []
        for i in range(5):
            cmd = Command("self-test", (0.0,), i, 0, time.time_ns(), 0, self.model.sha256, True)
            t0 = time.perf_counter_ns()
            try:
                envelope = self.signer.sign_command(cmd)
            except AttestationError as exc:
                raise StartupError(f"signer self-test failed: {exc}") from exc
            times.append(time.perf_counter_ns() - t0)
            verifier.verify(envelope)
        return int(2 * statistics.median(times)) + 100_000

    def _on_plc_event(self, event: PlcEvent) -> None:
        """A controller event (status word or diagnostic text), already structured by the vendor profile."""
        self.plc_events.append(event)
        self.plc_event_counts[event.code] += 1
        self.rca.on_plc_event(event)
        log = self.log.warning if event.severity in ("error", "critical") else self.log.info
        log("plc event", code=event.code, severity=event.severity, component=event.component, text=event.text,
            vendor=event.vendor, plc_time_ns=event.timestamp_ns)

    async def _startup_command(self) -> None:
        """Write the fail-safe command once before serving: proves the PLC accepts this device's
        signatures and model, and warms the write path so the first real frame is not late."""
        loop, c = self.loop, self.counters
        loop.sequence += 1
        now = time.time_ns()
        values = tuple(loop.safety.failsafe.tolist())
        cmd = Command(self.cfg.plc.command_node, values, loop.sequence, 0, now, now + loop.deadline_ns,
                      self.model.sha256, True)
        envelope = self.signer.sign_command(cmd)
        try:
            await self.link.send(envelope)
        except ua.UaStatusCodeError as exc:
            raise StartupError(
                f"the PLC refused the startup fail-safe command ({exc}): it does not trust key "
                f"{self.signer.key_id.hex()} or model {self.model.sha256.hex()[:16]}…\n  fix: install "
                f"{Path(self.cfg.audit.directory) / PUBKEY_FILE} and the model hash in the PLC's envelope verifier"
            ) from exc
        ack = time.time_ns()
        # the PLC holds the fail-safe from now: the first model command is rate-limited from it, not unlimited
        loop.safety.commit(loop.safety.failsafe, now)
        c.commands += 1
        c.failsafe += 1
        self.audit.append({"seq": cmd.sequence, "frame_seq": 0, "values": values, "failsafe": True, "sent_ns": now,
                           "outcome": "acknowledged", "ack_ns": ack, "input_sha256": None,  # from no frame
                           "model_sha256": self.model.sha256.hex(), "envelope": envelope.hex(), "reason": "startup"})
        self.log.info("PLC accepted the startup fail-safe command", rtt_ms=round((ack - now) / 1e6, 2))

    # -- the I/O thread ----------------------------------------------------------------------------
    def _submit_threadsafe(self, item: Outgoing) -> None:
        self._aio.call_soon_threadsafe(self._enqueue, item)

    def _enqueue(self, item: Outgoing) -> None:
        q = self._queue
        if q.qsize() >= QUEUE_DEPTH:  # the PLC is slower than the loop: the oldest command is the stalest
            q.get_nowait()
            self.counters.expired += 1
        q.put_nowait(item)

    async def _writer(self) -> None:
        c, stages, latency = self.counters, self.timings.stages, self.timings.latency_us
        handoff_i, write_i = STAGE_INDEX["handoff"], STAGE_INDEX["write"]
        while True:
            self._in_flight = None
            item: Outgoing = await self._queue.get()
            if self.audit_backlog:  # nothing leaves that could not be recorded: the PLC falls back on its own
                self.audit_held += 1
                continue
            if not self.link.connected:  # reconnecting: it cannot reach the PLC, which holds its safe state
                c.expired += 1
                self.link_not_sent += 1
                continue
            start = time.time_ns()
            stages[item.row, handoff_i] = (start - item.handoff_ns) * 1e-3
            if start > item.deadline_ns and not item.failsafe:
                c.expired += 1
                self._alert("deadline", f"command {item.sequence} expired before it could be written", item)
                continue
            session = self.link.generation
            self._in_flight = item
            try:
                await self.link.send(item.envelope)
            except asyncio.CancelledError:  # stopping with this write on the wire: the PLC may have applied it
                self._audit(item, "unconfirmed", error="write cancelled at shutdown")
                raise
            except ua.UaStatusCodeError as exc:
                c.write_errors += 1
                self.plc_rejected += 1  # read by the hot swap's health watch (a PLC refusing a swapped-in model)
                self._alert("plc_rejected", f"PLC refused command {item.sequence}: {exc}", item)
                self._audit(item, "rejected", error=type(exc).__name__)
                continue
            except (ConnectionError, OSError, asyncio.TimeoutError, ua.UaError) as exc:
                # the PLC may or may not have applied it: say so in the audit log, never claim either
                c.write_errors += 1
                self._alert("plc_write", f"write of command {item.sequence} failed: {exc!r}", item)
                self._audit(item, "unconfirmed", error=repr(exc))
                self.link.report_lost(session, f"write of command {item.sequence} failed: {exc!r}")
                continue
            ack = time.time_ns()
            stages[item.row, write_i] = (ack - start) * 1e-3
            latency[item.row] = (ack - item.sender_timestamp_ns) * 1e-3
            c.commands += 1
            self._audit(item, "acknowledged", ack_ns=ack)

    def _audit(self, item: Outgoing, outcome: str, **extra) -> None:
        """Every command that reached the wire: acknowledged, rejected by the PLC, or unconfirmed."""
        record = {"seq": item.sequence, "frame_seq": item.frame_sequence, "values": item.values,
                  "failsafe": item.failsafe, "sent_ns": item.sender_timestamp_ns, "outcome": outcome,
                  # what the command follows from: the frame's inputs (SHA-256 of its values, float64 little-endian
                  # in config signal order) and the model (as in the envelope), readable without decoding CBOR
                  "input_sha256": hashlib.sha256(item.inputs).hexdigest() if item.inputs else None,
                  "model_sha256": item.model_sha256.hex() if item.model_sha256 else None,
                  "envelope": item.envelope.hex(), **extra}
        if getattr(self, "prover", None) is not None:  # the proof this command will get (sitsd/prover.py)
            record.update(self.prover.reference(item.sequence))
        if self.audit_backlog:
            self.audit_backlog.append(record)
            return
        try:
            self.audit.append(record)
        except AuditWriteError as exc:
            self.audit_backlog.append(record)
            self._alert("audit", f"{exc}; holding commands until the audit log takes records again", item)
            self.log.error("audit log not writable: commands held, the PLC falls back to its safe state",
                           error=str(exc), directory=str(self.audit.directory))

    def _drain_audit_backlog(self) -> None:
        """Write the records that waited for disk space, oldest first; stop at the first failure."""
        written = 0
        while self.audit_backlog:
            try:
                self.audit.append(self.audit_backlog[0])
            except AuditWriteError:
                return
            self.audit_backlog.popleft()
            written += 1
        self.alerts.append((time.time_ns(), "audit_recovered", f"audit log writable again: {written} waiting "
                            f"record(s) written, {self.audit_held} command(s) were held", 0, 0))
        self.log.warning("audit log writable again", written=written, held=self.audit_held)

    # -- the PLC link: loss detection, frame watchdog, reconnect -----------------------------------------
    def _link_down(self, reason: str) -> None:
        """The PLC session or the frame subscription is dead, however it was noticed (I/O thread): asyncua's
        connection supervisor, the subscription's status change, a failed write or the frame watchdog.
        Stops the writer from using the session at once and wakes `_supervise_link`, which reconnects.
        One alert per outage: reports while a reconnect runs only make its current attempt count as failed."""
        if self._stop is None or self._stop.is_set() or self._link_lost is None or self.link is None:
            return
        if self._link_lost.is_set() or self.state == "reconnecting":
            self.link_last_loss = reason
            self._link_lost.set()
            return
        self.link.mark_lost()
        self.link_losses += 1
        self.link_last_loss = reason
        self._link_down_since = time.monotonic()
        if self.state == "running":
            self.state = "reconnecting"
        self._alert("plc_link", f"PLC link lost ({reason}): reconnecting")
        self.log.warning("PLC link lost: reconnecting; until then no command is sent and the PLC's own watchdog "
                         "holds its safe state", reason=reason, endpoint=self.cfg.plc.endpoint,
                         transport=self.cfg.transport.kind)
        self._link_lost.set()

    def _frames_seen(self) -> int:
        """Anything that came in from the frame transport: frames the loop took, malformed ones, and
        (opcua-subscription) frames that arrived faster than the loop took them."""
        src = self.source
        return self.counters.frames + (src.malformed if src is not None else 0) + getattr(src, "superseded", 0)

    def _frame_timeout_s(self) -> float:
        t = self.cfg.timing  # read each time: a reload may change it
        ms = t.frame_timeout_ms or max(FRAME_TIMEOUT_CYCLES * t.cycle_ms, FRAME_TIMEOUT_FLOOR_MS)
        return ms / 1000.0

    async def _supervise_link(self) -> None:
        """Reconnects when `_link_down` says so, and runs the frame watchdog in between (I/O thread).

        Frame watchdog: no frame for `_frame_timeout_s()` raises one `frame_timeout` alert per stall. With
        opcua-subscription the frames come through the session, so a stall also rebuilds session and
        subscription (the session may look alive while the subscription is gone); a stall that outlives the
        rebuild is retried with a doubling wait (at most FRAME_STALL_MAX_BACKOFF_S). The UADP transports do
        not depend on the session, whose health asyncua's supervisor watches: there the alert is all."""
        seen, self._frame_progress_at = self._frames_seen(), time.monotonic()
        subscription = isinstance(self.source, OpcUaSubscriptionSource)
        # the stop flag ends it, not only cancellation: asyncio.wait_for (Python 3.11) swallows a cancel that arrives
        # when the awaited event is already set, which `_link_lost` stays while reconnecting, so a stop during a
        # reconnect used to spin here forever (`_reconnect` returned at once, was called again): SIGTERM ignored
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._link_lost.wait(), 0.05)
            except asyncio.TimeoutError:
                pass
            if self._stop.is_set():
                return
            if self._link_lost.is_set():
                await self._reconnect()
                seen, self._frame_progress_at = self._frames_seen(), time.monotonic()  # a full timeout to start
                continue
            now, frames = time.monotonic(), self._frames_seen()
            if frames != seen:
                seen, self._frame_progress_at = frames, now
                if self._frame_stall is not None:
                    self.log.info("frames flow again", stalled_s=round(now - self._frame_stall["since"], 2),
                                  rebuilds=self._frame_stall["escalations"])
                    self._frame_stall = None
                continue
            timeout_s = self._frame_timeout_s()
            quiet_s = now - self._frame_progress_at
            if self._frame_stall is None:
                if quiet_s < timeout_s:
                    continue
                self._frame_stall = {"since": self._frame_progress_at, "escalations": 0}
                self._alert("frame_timeout", f"no frame for {quiet_s * 1000:.0f} ms (frame timeout "
                            f"{timeout_s * 1000:.0f} ms, transport {self.cfg.transport.kind})")
                self.log.warning("no frames from the PLC", quiet_ms=round(quiet_s * 1000), timeout_ms=round(
                    timeout_s * 1000), transport=self.cfg.transport.kind, action="rebuild the PLC session and "
                    "frame subscription" if subscription else "alert only: check the PLC's publisher and the "
                    "network path (the OPC UA session is watched separately)")
            if subscription and quiet_s >= min(timeout_s * 2 ** self._frame_stall["escalations"],
                                               max(FRAME_STALL_MAX_BACKOFF_S, timeout_s)):
                self._frame_stall["escalations"] += 1
                self._link_down(f"no frame for {quiet_s * 1000:.0f} ms on the frame subscription")

    async def _reconnect(self) -> None:
        """Until the PLC takes a new session or the daemon stops: close what is left of the old one (bounded),
        then connect with back-off: 0.2 s before the first attempt (a PLC that is shutting down still accepts
        connections for a moment, and a session opened then would keep it from finishing), doubling to 2 s.
        connect() rebuilds everything: command node checks, the tpm-session binding, the PLC event and frame
        subscriptions. The writer and the loop thread keep running meanwhile; their commands are counted as
        expired and not sent (`link_not_sent`)."""
        link = self.link
        self.state = "reconnecting"
        if self._link_down_since is None:
            self._link_down_since = time.monotonic()
        await link.close()
        delay, attempt = RECONNECT_FIRST_S, 0
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
                return  # stopping
            except asyncio.TimeoutError:
                pass
            delay = min(delay * 2, RECONNECT_MAX_S)  # back off, but never wait long once the PLC is back
            attempt += 1
            self._link_lost.clear()  # a loss reported from now on concerns this attempt's session
            error = None
            try:
                await link.connect()
            except StartupError as exc:
                error = str(exc).splitlines()[0]
            except Exception as exc:  # a session that died while being set up: try again, never give up
                error = repr(exc)
            if error is None and self._link_lost.is_set():
                error = f"lost again while being set up ({self.link_last_loss})"
                await link.close()
            if error is None:
                break
            if attempt <= 3 or attempt % 10 == 0:
                self.log.warning("PLC reconnect failed", error=error, attempt=attempt, retry_in_s=delay)
        down_s = time.monotonic() - self._link_down_since
        self._link_down_since = None
        self.link_reconnects += 1
        self.state = "running"
        self.log.info("reconnected to PLC", endpoint=self.cfg.plc.endpoint, attempts=attempt,
                      down_s=round(down_s, 2), transport=self.cfg.transport.kind,
                      frame_subscription="re-created" if isinstance(self.source, OpcUaSubscriptionSource) else None,
                      commands_not_sent=self.link_not_sent)

    def _link_status(self) -> dict:
        now = time.monotonic()
        stall = self._frame_stall
        return {"connected": bool(self.link is not None and self.link.connected), "losses": self.link_losses,
                "reconnects": self.link_reconnects, "last_loss": self.link_last_loss,
                "down_s": round(now - self._link_down_since, 2) if self._link_down_since is not None else None,
                "commands_not_sent": self.link_not_sent,
                # tpm-session: credentials re-written after a measurement, those that failed, log compactions
                "rebinds": getattr(self.link, "rebinds", 0),
                "rebind_failures": getattr(self.link, "rebind_failures", 0),
                "compactions": getattr(self.link, "compactions", 0),
                "compaction_failures": getattr(self.link, "compaction_failures", 0),
                # the newest credential's PCR 23 value is not the log's: the PLC holds one that does not say what runs
                "credential_stale": self._credential_stale(),
                "frame_age_ms": round((now - self._frame_progress_at) * 1000),
                "frame_timeout_ms": round(self._frame_timeout_s() * 1000),
                "frames_stalled_s": round(now - stall["since"], 2) if stall is not None else None}

    def _credential_stale(self) -> bool | None:
        """tpm-session (a PLC link and a measurement log): sitsd_session_credential_stale; None otherwise."""
        if self.link is None or self.measurements is None or not hasattr(self.link, "last_bound_value"):
            return None
        bound, value = self.link.last_bound_value, getattr(self.measurements, "value", None)
        return bound is not None and value is not None and bytes(bound) != bytes(value)

    def _alert(self, kind: str, reason: str, item: Outgoing | None = None) -> None:
        self.alerts.append((time.time_ns(), kind, reason, 0, item.frame_sequence if item else 0))

    def _config_identity(self) -> tuple[str, str | None]:
        """(file name, SHA-256 hex) of the config that runs: the measurement log's newest config event, else the
        file's name with no hash (no log)."""
        from .hotswap import _config_measured

        measured = _config_measured(self)
        if measured is not None:
            return measured
        return (Path(self.config_path).name if self.config_path is not None else "config", None)

    def _announce_reload(self, before, measured_before: tuple[str, str | None]) -> tuple[str, str | None]:
        """A config went live (housekeeping sees `self.cfg` replaced within 50 ms, whichever way it came: SIGHUP,
        `sitsctl reload`, `update --config`, `rollback --config`, a live deploy): one `reload` alert, the update
        event fault attribution matches (update.reload), naming the file, its old and new hash and the sections
        that changed. A reload of the same bytes that changed nothing raises none. Returns the new identity."""
        from .reload import LIVE_SECTIONS, RESTART_SECTIONS

        measured = self._config_identity()
        changed = [s for s in LIVE_SECTIONS + RESTART_SECTIONS
                   if getattr(before, s, None) != getattr(self.cfg, s, None)]
        if not changed and measured == measured_before:
            return measured
        old = f"{measured_before[0]} sha256 {measured_before[1] or '?'}"
        self._alert("reload", f"config {measured[0]}: {old} -> sha256 {measured[1] or '?'}, changed: "
                    f"{', '.join(changed) or 'nothing (the same rules)'}")
        return measured

    async def _roll_back_config(self, reason: str) -> None:
        """The config `update --config` put live failed its health watch: back to the one before (measured as
        `rollback:config`, proven for the running model first), with a `rollback` alert; if even that is refused,
        the alert says so and the newer config keeps running."""
        from .hotswap import SwapRefused, rollback_config

        try:
            out = await asyncio.to_thread(rollback_config, self)
        except Exception as exc:  # SwapRefused, or its measurement failed (MeasurementError): nothing changed
            what = "refused" if isinstance(exc, SwapRefused) else f"failed ({exc!r})"
            self._alert("rollback", f"config update failed its health watch ({reason}), but rolling it back "
                        f"{what}: {exc}; the updated config keeps running")
            self.log.error("automatic config rollback refused", reason=reason, error=str(exc))
            return
        self._alert("rollback", f"config update rolled back to {out['config']}: {reason}")
        self.log.warning("automatic config rollback", reason=reason, config=out["config"], sha256=out["sha256"])

    async def _housekeeping(self) -> None:
        watchdog_s = self.notifier.watchdog_usec / 2e6 if self.notifier.watchdog_usec else None
        last_beat, last_ping, last_status, last_malformed = -1, 0.0, 0.0, 0
        running_cfg = self.cfg
        config_measured = self._config_identity()
        while True:
            await asyncio.sleep(0.05)
            if self.hotswap is not None and self.hotswap.watching:  # a fresh swap: trap/error spike -> rollback
                try:
                    await asyncio.to_thread(self.hotswap.check_health)
                    if (reason := self.hotswap.config_health(self.cfg)) is not None:
                        # a task: the rollback's proof may wait for another proof (minutes); housekeeping goes on
                        self._config_rollback = asyncio.create_task(self._roll_back_config(reason),
                                                                    name="config-rollback")
                except Exception as exc:  # never the end of housekeeping (it feeds the watchdog, drains the audit)
                    self.log.error("hot swap health check failed", error=repr(exc))
            if self.cfg is not running_cfg:
                # reloaded (SIGHUP, sitsctl reload, update/rollback --config, deploy): fault attribution's `reload`
                # event, and persisted updates are re-based on the new bytes
                before, running_cfg = running_cfg, self.cfg
                try:
                    config_measured = self._announce_reload(before, config_measured)
                except Exception as exc:  # never the end of housekeeping (it feeds the watchdog)
                    self.log.error("reload event failed", error=repr(exc))
                if self.persistence is not None:
                    await asyncio.to_thread(self.persistence.config_reloaded)
            malformed = self.source.malformed if self.source is not None else 0
            if malformed != last_malformed:  # counted on the loop thread, reported here
                self.alert_counts["malformed_frame"] += malformed - last_malformed
                self.log.warning("malformed frames skipped", count=malformed - last_malformed, total=malformed,
                                 error=str(self.source.last_error), transport=self.cfg.transport.kind)
                last_malformed = malformed
            while self.alerts:
                t_ns, kind, reason, publisher, seq = self.alerts.popleft()
                self.alert_counts[kind] += 1
                self.rca.on_alert(t_ns, kind, reason, publisher, seq)
                if kind == "timestamp":
                    self.timestamp_drop_counts[reason.split(":", 1)[0]] += 1
                self.last_alerts.append({"t_ns": t_ns, "kind": kind, "reason": reason, "frame_seq": seq})
                if self.alert_counts[kind] <= 20 or self.alert_counts[kind] % 1000 == 0:  # rate-limit the log
                    self.log.warning("alert", kind=kind, reason=reason, publisher=publisher, frame_seq=seq,
                                     count=self.alert_counts[kind])
            if self.loop.crashed is not None:
                self.log.error("control loop crashed", error=repr(self.loop.crashed))
                self.exit_code = 70
                self._stop.set()
                return
            now = time.monotonic()
            beat = self.counters.heartbeat
            if watchdog_s and now - last_ping >= watchdog_s and beat != last_beat:
                self.notifier.watchdog()  # only while the loop makes progress
                last_ping, last_beat = now, beat
            if now - last_status >= 1.0:
                self.notifier.status(self.status_line())
                last_status = now
                if self.audit_backlog:
                    self._drain_audit_backlog()

    async def _watch_tpm(self, interval_s: float = TPM_PROBE_S) -> None:
        """tpm-session: commands never need the TPM, so its loss would go unseen until the next measurement, anchor or
        PLC re-bind. Probe it; one `tpm` alert per outage, and a log line when it answers again.

        TPM reset (PCRs back at zero: the quote a reconnecting PLC asks for would no longer show the model): the probe
        sees it (resetCount/restartCount, or the PCR against the replay of the session's measurements) and unbinds the
        session key (nothing is signed). The running model, modules and config are then measured anew into both PCRs
        (`_remeasure_after_reset`), the session key bound again, and one `tpm` alert names the reset. When that fails
        (the TPM refuses a certification, or holds no attestation key any more) nothing is signed, so the PLC's
        watchdog holds its fail-safe, one `tpm` alert says why, and every probe retries. TPM calls run on daemon
        threads and are bounded: a hung TPM never blocks this event loop or the daemon's exit.

        tpm-direct (TpmSigner.probe: TPM2_ReadPublic of the signing key, TPM2_ReadClock): a TPM lost while commands
        flow shows as `sign` alerts, but not one lost, reset or cleared while none do. The same alerts and recovery
        apply; a reset re-measures into PCR 16 and 23 while signing goes on (the key needs no PCR)."""
        from attestation.session import TpmIdentityLost, call_in_thread

        probe = getattr(self.signer, "probe", None)
        if probe is None:
            return
        direct = getattr(self.signer, "kind", None) == "tpm"  # tpm-direct: every command needs the TPM
        st = self.tpm_state
        pending: str | None = None  # why the session must be re-measured; None while it is bound
        alerted = False  # one alert per reset episode
        while not self._stop.is_set():  # not only cancellation: wait_for may swallow a cancel (see _supervise_link)
            await asyncio.sleep(interval_s)
            try:
                seen = await asyncio.wait_for(call_in_thread(probe), timeout=TPM_PROBE_TIMEOUT_S)
            except TpmIdentityLost as exc:
                st["errors"] += 1
                st["last_error"] = str(exc)
                st["bound"] = False
                st["remeasure_failures"] += 1
                if pending is None:
                    pending, alerted = "attestation key lost", False
                if not alerted:
                    alerted = True
                    self._alert("tpm", f"{exc}; retrying every {interval_s:g} s")
                continue
            except Exception as exc:  # TpmError, or no answer in time
                st["errors"] += 1
                st["last_error"] = str(exc) or type(exc).__name__
                if st["reachable"]:
                    st["reachable"], st["outages"] = False, st["outages"] + 1
                    self._alert("tpm", f"TPM unreachable ({st['last_error']}): " + (
                        "no command can be signed (tpm-direct), so the PLC's watchdog holds its fail-safe; hot-swap "
                        "measurements and audit anchors fail until it answers" if direct else
                        "commands are still signed with the session key; hot-swap measurements, audit anchors and a "
                        "session re-bind after a PLC reconnect fail until it answers"))
                continue
            if not st["reachable"]:
                st["reachable"] = True
                self.log.info("TPM answers again", outages=st["outages"],
                              reconnects=getattr(self.signer, "reconnects", 0))
            if seen is not None and (pending is None or pending == "attestation key lost"):  # a new reset episode
                st["resets"] += 1
                st["last_reset"] = seen
                st["bound"] = False
                pending = seen
                self.log.warning("TPM reset detected", detail=seen, action="re-measuring the running model, "
                                 "modules and config" + (" (signing goes on)" if direct else
                                                         ", then binding the session key again"))
            if pending is None:
                continue
            t0 = time.perf_counter()
            self._remeasure_generation += 1
            attempt = self._remeasure_generation
            try:
                done = await asyncio.wait_for(call_in_thread(self._remeasure_after_reset, not alerted, attempt),
                                              timeout=TPM_PROBE_TIMEOUT_S)
            except BaseException as exc:  # TpmError, MeasurementError, PolicyError (certification refused), a timeout
                # first: the attempt's thread may still run (a hung TPM call): from now on it can no longer commit
                # (re-bind the key, replace the measurement log) behind the failure recorded here
                self._remeasure_generation += 1
                if not isinstance(exc, Exception):  # cancelled: the daemon stops
                    raise
                reason = str(exc) or type(exc).__name__
                self.signer.unbind(f"{pending}; re-measurement failed: {reason}")
                st["bound"] = False
                st["remeasure_failures"] += 1
                st["last_error"] = reason
                if st["remeasure_failures"] <= 3 or st["remeasure_failures"] % 30 == 0:
                    self.log.warning("re-measurement after TPM reset failed", reset=pending, error=reason,
                                     attempt=st["remeasure_failures"], retry_in_s=interval_s)
                if not alerted:
                    alerted = True
                    self._alert("tpm", f"{pending}: re-measuring the running model, modules and config failed "
                                f"({reason}); " + ("commands are still signed (tpm-direct), but the TPM's PCRs do not "
                                                   "show what runs (deploy quotes fail)" if direct else
                                                   "nothing is signed, so the PLC's watchdog holds its fail-safe")
                                + f"; retrying every {interval_s:g} s")
                continue
            ms = round((time.perf_counter() - t0) * 1000, 1)
            self.log.info("session re-measured after TPM reset", reset=pending, measured=done, ms=ms,
                          pcr=getattr(self.signer, "pcr", None))
            if not alerted:
                self._alert("tpm", f"{pending}: re-measured what runs ({done}) in {ms} ms" + (
                    "; signing did not depend on PCR 16 (tpm-direct)" if direct else
                    " and bound the session key again; a PLC that reconnects gets a fresh quote"))
            else:
                self.log.info("TPM session bound again", after_failures=st["remeasure_failures"])
            st["bound"] = True
            pending, alerted = None, False

    def _remeasure_after_reset(self, archive: bool, attempt: int | None = None) -> str:
        """After a TPM reset (a thread of its own; TPM calls bounded): measure what runs now, from the loop's stage
        set and the applied config, never from the old log: PCR 23 gets a new measurement log (the old one kept as
        measurements-before-tpm-reset-<ns>.jsonl when `archive`), the session key is certified again under
        attestation.certify_session, then PCR 16 gets the running model and the session key is bound again (last:
        until then nothing is signed). Raises what the TPM refuses. Returns what was measured, in words.

        One at a time (`_remeasure_lock`; an earlier attempt still stuck in the TPM: TpmError at once). `attempt`: the
        `_remeasure_generation` it was started with; once `_watch_tpm` has moved on (it gave up on this attempt),
        nothing more is done or committed: TpmError."""
        from attestation.errors import TpmError

        if not self._remeasure_lock.acquire(timeout=1.0):
            raise TpmError("an earlier re-measurement has not returned yet (its TPM call hangs); not attempted")
        try:
            def current() -> bool:
                return attempt is None or attempt == self._remeasure_generation

            def check(step: str) -> None:
                if not current():
                    raise TpmError(f"re-measurement abandoned (timed out or superseded) before {step}")

            return self._remeasure_locked(archive, current, check)
        finally:
            self._remeasure_lock.release()

    def _remeasure_locked(self, archive: bool, current, check) -> str:
        # no hot swap between reading the running set and measuring it (a swap is measured, then run, under this
        # lock): else a swap measured into the old log and run after the read would be missing from the new one
        swap_lock = getattr(self.hotswap, "_lock", None)
        if swap_lock is not None and not swap_lock.acquire(timeout=5.0):
            from attestation.errors import TpmError

            raise TpmError("a hot swap holds the swap lock: re-measuring after it (retried)")
        try:
            return self._remeasure_swap_locked(archive, current, check)
        finally:
            if swap_lock is not None:
                swap_lock.release()

    def _remeasure_swap_locked(self, archive: bool, current, check) -> str:
        from attestation.measurement import MeasurementLog, measured_state

        from .hotswap import file_sha256

        st = self.loop.stage_set
        done = ["model"]
        log = self.measurements
        # the config that runs is the one the log names last (a reload measures the bytes it applies); the file may
        # have been edited since without a reload
        logged_config = (measured_state((e.kind, e.name, e.sha256) for e in log.events).config
                         if log is not None else None)
        if log is not None and log.tpm is not None and log.path is not None:
            check("resetting the measurement PCR")
            if archive and log.path.exists():
                log.path.replace(log.path.with_name(f"measurements-before-tpm-reset-{time.time_ns()}.jsonl"))
            log.tpm.reset()
            new = MeasurementLog(log.path, log.pcr, log.tpm)
            new.record("model", Path(st.model_path).name, st.model_sha256.hex())
            modules = [m for m in (st.pre, st.post) if m is not None]
            for m in modules:
                new.record(f"module:{m.stage}", m.name, m.sha256)
            done.append(f"{len(modules)} module(s)")
            a = self.cfg.attestation
            if a.certify_session and getattr(self.signer, "certification", None) is not None:
                from attestation.tpm.policy import Approval, load_authority_public

                authority = load_authority_public(a.authority_key)
                approval = Approval.load(a.approval)
                approval.verify(authority)
                before = self.signer.certification.device_public_pem
                check("certifying the session key")
                cert = self.signer.certify(approval, authority)  # PolicyError "refused" unless the approved set runs
                if cert.device_public_pem != before:  # a new device key: the PLC trusts the one it enrolled
                    from attestation.errors import TpmError

                    raise TpmError(f"the policy-bound device key at 0x{a.device_key_handle:08x} is not the one this session "
                                   "was certified with (the TPM was cleared and the key created anew): the PLC trusts "
                                   "the enrolled one; re-provision and enrol the new device-policy.pub.pem")
                done.append("certification")
            if self.config_path is not None:
                persistence = self.persistence
                config_sha = (logged_config[1] if logged_config is not None
                              else getattr(persistence, "config_sha256", None) or file_sha256(self.config_path))
                new.record("config", Path(self.config_path).name, config_sha)
                done.append("config")
            check("replacing the measurement log")
            self.measurements = new
            if self.hotswap is not None:
                self.hotswap.measure = new.record  # later swaps are measured into the new log
                self.hotswap._owed.clear()  # the new log measures what runs now: nothing is owed to it
            done[0] = f"model, PCR {new.pcr} {new.value.hex()[:16]}…"
        check("re-measuring the session PCR")
        value = self.signer.remeasure([st.model_sha256], still_current=current)  # binds the session key again
        if self.link is not None:  # the PLC gets a credential with the new measurement log at once
            self.link.request_rebind("re-measured after a TPM reset")
        return ", ".join(done) + f"; PCR {self.signer.pcr} {value.hex()[:16]}…"

    async def _watch_prover(self, interval_s: float = 2.0) -> None:
        """Proofs are off the fast path, so a stopped or hung prover would only show as proofs that stop coming.
        One `prover` alert per stall (ProofService.watch), a log line when proofs finish again."""
        while True:
            await asyncio.sleep(interval_s)
            service = getattr(self, "prover", None)
            change = service.watch() if service is not None else None
            if change is None:
                continue
            kind, text = change
            if kind == "stalled":
                self._alert("prover", f"prover stalled: {text}")
            else:
                self.log.info("prover recovered", detail=text, stalls=service.stalls, **service.counters())

    async def _watch_ptp(self) -> None:
        """Poll linuxptp; with policy drop/failsafe an unlocked clock closes the timestamp gate. The section is
        read again at each poll, so a reload's timing.ptp (enabled, uds, max_offset_ns, policy, poll_s) applies
        from the next one; policy warn or enabled off opens the gate."""
        last = None
        while True:
            ptp = self.cfg.timing.ptp
            if ptp.enabled == "off":
                self.loop.ts_gate.clock_ok, last = True, None
                await asyncio.sleep(1.0)  # looks again: a reload may turn it on
                continue
            status = await asyncio.to_thread(query_pmc, ptp.uds)
            self.ptp_status = status
            ok = status.locked(ptp.max_offset_ns) or (not status.available and ptp.enabled == "auto")
            self.loop.ts_gate.clock_ok = ok if ptp.policy != "warn" else True
            if ok != last:
                if ok:
                    self.log.info("clock synchronisation", ptp=status.describe(ptp.max_offset_ns))
                else:
                    self.alerts.append((time.time_ns(), "clock", status.describe(ptp.max_offset_ns), 0, 0))
                last = ok
            await asyncio.sleep(ptp.poll_s)

    def status_line(self) -> str:
        c = self.counters
        lat = self.timings.latency_summary()
        return (f"{self.state}: frames={c.frames} commands={c.commands} dropped={c.dropped_timestamp + c.dropped_constraint}"
                f" failsafe={c.failsafe} p99={lat['p99'] / 1000:.2f}ms")

    def status(self, _req: dict | None = None) -> dict:
        c = self.counters
        return {
            "line": self.cfg.line,
            "state": self.state,
            "uptime_s": round(time.monotonic() - self._started, 1),
            "reloads": self.reloads,
            # the model that runs: the config's, or a hot-swapped or persisted one (stages_source says which)
            "model": ((self.loop.stage_set.model_path if self.loop else str(self.cfg.model.artifact))
                      if self.cfg.model.kind == "mlp" else "streaming"),
            "stream": self.model.describe() if getattr(self.model, "kind", "mlp") == "streaming" else None,
            # where the running model runs (ep.Session): provider and policy, placement, notes
            "model_runtime": runtime_report(self.loop.stage_set.model if self.loop else self.model),
            "model_sha256": self.loop.stage_set.model_sha256.hex() if self.loop else None,
            "stages": self.loop.stage_set.describe() if self.loop else None,
            # stages_source: config / persisted / hot swap (not persisted); persistence: what a restart loads
            **(self.persistence.describe(self.loop.stage_set if self.loop else None)
               if self.persistence is not None else {"stages_source": "config", "persistence": None}),
            "signer": "tpm" if str(getattr(self.signer, "kind", "")).startswith("tpm") else getattr(self.signer, "kind", None),
            "signing_mode": getattr(self.signer, "kind", None),
            # tpm-session: the credential format the PLC gets (attestation.session_credential); None without one
            "session_credential": ((f"measured (v2: PCR 16 + {self.cfg.attestation.measurement_pcr} with its log)"
                                    if self.cfg.attestation.session_credential == "measured" else
                                    "model-only (v1: PCR 16 only, the PLC does not see modules or config)")
                                   if getattr(self.signer, "kind", None) == "tpm-session" else None),
            "key_id": self.signer.key_id.hex() if self.signer else None,
            "plc": self.cfg.plc.endpoint,
            "transport": self.cfg.transport.kind,
            "rx_stamp_source": (RxStampSource(self.loop.last_rx_source).name.lower()
                                if self.loop is not None and self.loop.last_rx_source >= 0 else None),
            "vlan_pcp": self.loop.last_vlan_pcp if self.loop is not None else -1,
            "ptp": self.ptp_status.describe(self.cfg.timing.ptp.max_offset_ns) if self.ptp_status else None,
            # frame source: decode fast path vs general-decoder fallback, other publishers' traffic, keep-alives,
            # the link (UADP sources; an OPC UA subscription has none of these)
            "source": ({**self.source.decode_status(), **self.source.link_status()}
                       if hasattr(self.source, "decode_status") else None),
            "counters": {**c.as_dict(), "dropped": c.dropped_timestamp + c.dropped_constraint,
                         "lost": self.loop.ts_gate.lost if self.loop else 0,
                         "malformed": self.source.malformed if self.source else 0,
                         "clamped": self.loop.safety.clamped if self.loop else 0},
            "latency_us": self.timings.latency_summary(),
            "stages_us": self.timings.stage_summary(),
            "alerts": dict(self.alert_counts),
            "recent_alerts": list(self.last_alerts)[-5:],
            "plc_events": dict(self.plc_event_counts),
            "recent_plc_events": [{"code": e.code, "severity": e.severity, "component": e.component, "text": e.text,
                                   "t_ns": e.timestamp_ns} for e in list(self.plc_events)[-5:]],
            # the PLC session: losses, reconnects, the frame watchdog (see _supervise_link)
            "plc_link": self._link_status(),
            # attestation.certify_session: certified at start, and still describing what runs (no swap away)
            "session_certified": self._session_certified(),
            "tpm": dict(self.tpm_state) if hasattr(self.signer, "probe") else None,
            # the measurement PCR's log (attestation/measurement.py): its length, what a credential carries, compactions
            "measurement_log": self.measurements.status() if hasattr(self.measurements, "status") else None,
            "audit_file": str(self.audit.path) if self.audit else None,
            # the live head of the hash chain: recorded elsewhere, it shows a cut of the newest records
            # what has reached the disk under audit.fsync: the last fsynced record, the records written after it;
            # read before the head, so the durable record is never newer than the head shown with it
            "audit_durable": self.audit.durability() if self.audit else None,
            "audit_head": self.audit.head_status() if self.audit else None,
            "audit_backlog": len(self.audit_backlog), "audit_held": self.audit_held,
            # audit.anchor tpm: the TPM counter, the newest anchor record, failures (sitsd/audit_anchor.py)
            "audit_anchor": self.audit_anchor.status() if self.audit_anchor is not None else None,
            # Groth16 proofs (sitsd/prover.py): counters, queue depth, worker PIDs; None when proof.policy is off
            "proofs": self.prover.status() if getattr(self, "prover", None) is not None else None,
            "metrics_url": (f"http://{self.cfg.metrics.host}:{self.metrics.port}/metrics"
                            if self.metrics is not None else None),
        }

    def _session_certified(self) -> bool | None:
        cert = getattr(self.signer, "certification", None)
        if cert is None:
            return None if not self.cfg.attestation.certify_session else False
        active = getattr(self.signer, "certification_active", None)
        return active() if active is not None else True

    # -- lifecycle -------------------------------------------------------------------------------
    async def serve(self) -> int:
        self._aio = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._queue = asyncio.Queue()
        self._link_lost = asyncio.Event()
        tasks: list[asyncio.Task] = []
        server = None
        # the blocking start (model, signer, TPM measurements, verify-on-boot, the audit anchor) runs on a daemon
        # thread and the TPM waits are watched, so SIGTERM stops a start that hangs in the TPM (sitsd/startup.py)
        self._startup = startup = Startup(self)
        start_watch = asyncio.create_task(startup.watch(), name="startup-watch")
        try:
            try:
                await startup.run("building the loop (model, signer, TPM measurements)", self._build,
                                  cleanup=self._close_abandoned_build, key="build")
                self.link = PlcLink(self.cfg, signer=self.signer, source=self.source, on_plc_event=self._on_plc_event,
                                    device_key_file=Path(self.cfg.audit.directory) / DEVICE_KEY_FILE,
                                    model_sha256=self.model.sha256, log=self.log, on_lost=self._link_down,
                                    measurements=lambda: self.measurements)  # PCR 23 in the session credential
                await startup.until_stopped("connecting to the PLC", self.link.connect())
                a = self.cfg.audit
                self.audit = AuditLog(a.directory, a.fsync, segment_max_mb=a.segment_max_mb,
                                      retention_days=a.retention_days, max_total_mb=a.max_total_mb)
                if self.audit.start_damage is not None:  # damage, not a crash cut: kept, named in the log (audit.py)
                    self._alert("audit", self.audit.start_damage["message"])
                    self.log.error("audit log damaged", file=self.audit.start_damage["file"],
                                   line=self.audit.start_damage["line"], damage=self.audit.start_damage["damage"])
                if a.anchor == "tpm":  # compares the TPM counter with the log's newest anchor; never stops the start
                    self.audit_anchor = await startup.run(
                        "checking the audit anchor (TPM NV counter)", self._attach_audit_anchor,
                        cleanup=lambda anchor: anchor.abandon() if anchor is not None else None, key="audit anchor")
                    self.audit.anchor = self.audit_anchor  # from now on AuditLog.close writes the closing anchor
                # sequence numbers must rise across restarts, or the PLC's replay check refuses the new
                # daemon: start above the last audited one and above the microsecond clock
                self.loop.sequence = max(self.loop.sequence, self.audit.last_sequence, time.time_ns() // 1000)
                await startup.until_stopped("signing and sending the startup fail-safe command",
                                            self._startup_command())
                server = await control.serve(Path(self.cfg.control.socket),
                                             {"status": self.status, "stop": self._stop_request,
                                              "reload": self._reload_request, **control_handlers(self),
                                              **__import__("sitsd.deploy").deploy.control_handlers(self),
                                              "events": self.rca.events_request},
                                             access=control.ControlAccess(self.cfg.control.operator_group),
                                             on_command=lambda cmd, peer: self.log.info(
                                                 "control command", command=cmd, peer=repr(peer)))
                if self.cfg.metrics.enabled:
                    from .metrics import MetricsExporter

                    self.metrics = MetricsExporter(self)
                    port = self.metrics.start(self.cfg.metrics.host, self.cfg.metrics.port)
                    self.log.info("metrics", url=f"http://{self.cfg.metrics.host}:{port}/metrics")
            except StartupInterrupted:
                # SIGTERM / SIGINT while starting: a clean stop (exit status 0, as when running), never READY=1;
                # a TPM call it waited for is left behind on its daemon thread
                self.state = "stopped"
                self.ready.set()
                during = startup.describe()
                # a thread stopped at a checkpoint closes what it made (Startup.run's cleanup) before we exit; one
                # blocked in the TPM is left behind (its cleanup runs if the call ever returns)
                left_behind = not await startup.settle(1.0)
                self.log.warning("sitsd stopped while starting", during=during,
                                 after_s=round(time.monotonic() - startup.started, 1), left_behind=left_behind)
                return self.exit_code
            except (StartupError, OSError, AttestationError) as exc:
                if isinstance(exc, AttestationError):  # not wrapped by its step: the TPM's text only for TPM errors
                    exc = startup_error(startup.step, exc, self.cfg.attestation.tcti)
                elif timed_out(exc) and "fix: the TPM behind" not in str(exc):
                    exc = StartupError(f"{exc}\n{hang_fix(self.cfg.attestation.tcti)}")
                self.startup_error = exc
                self.state = "failed"
                self.ready.set()
                self.log.error("startup failed", error=str(exc), step=startup.step)
                return 1
            except Exception as exc:  # a bug, not a condition: fail start at once, with the traceback
                self.startup_error = StartupError(f"unexpected {type(exc).__name__} during startup: {exc}")
                self.state = "failed"
                self.ready.set()
                self.log.exception("startup failed", error=repr(exc))
                return 70
            finally:
                start_watch.cancel()
            tasks = [asyncio.create_task(self._writer(), name="writer"),
                     asyncio.create_task(self._housekeeping(), name="housekeeping"),
                     asyncio.create_task(self._watch_ptp(), name="ptp"),
                     asyncio.create_task(self._watch_tpm(), name="tpm"),
                     asyncio.create_task(self._watch_prover(), name="prover"),
                     asyncio.create_task(self._supervise_link(), name="plc-link")]
            discarded = self.source.discard_pending()  # frames that arrived during startup are stale
            self.loop.start()
            self.state = "reconnecting" if self._link_lost.is_set() else "running"
            self.notifier.ready(self.status_line())
            self.log.info("sitsd ready", line=self.cfg.line, discarded_startup_frames=discarded, plc=self.cfg.plc.endpoint,
                          transport=self.cfg.transport.kind,
                          model_sha256=self.model.sha256.hex(), signer=self.signer.kind,
                          key_id=self.signer.key_id.hex(), control=str(self.cfg.control.socket))
            self.ready.set()
            if self._reload_pending is not None:  # asked for while starting (reload_in_background): now, once
                via, self._reload_pending = self._reload_pending, None
                self.log.info("applying the reload requested while starting", via=via)
                self.reload_in_background()
            await self._stop.wait()
            return self.exit_code
        finally:
            self.state = "stopping"
            self.notifier.stopping()
            # what _build made belongs to the start thread's cleanup when the start stopped before serve() took it
            # (sitsd/startup.py): never closed here then, so never twice nor while the thread still makes it
            built = "build" not in startup.given_up
            if self.loop is not None and built:
                self.loop.stop()
            if self._queue is not None and self.link is not None and self.link.connected:
                await self._drain_queue(timeout_s=1.0)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if server is not None:
                server.close()
            if self.metrics is not None:
                self.metrics.stop()
            if self.link is not None:
                await self.link.close()
            if self.source is not None and built:
                self.source.close()
            if built and getattr(self.model, "kind", "mlp") == "streaming" and (
                    self.loop is None or self.loop.thread is None or not self.loop.thread.is_alive()):
                self.model.close()  # checkpoint: the next start resumes the stream from its snapshot
            if self.audit is not None:
                if self.audit_backlog:  # last try; what still cannot be written goes to the journal
                    self._drain_audit_backlog()
                if self.audit_backlog:
                    self.log.error("audit records that could not be written before stopping (disk full)",
                                   count=len(self.audit_backlog), records=list(self.audit_backlog))
                self.audit.close()
            if getattr(self, "prover", None) is not None and built:
                self.prover.close()
            if self.wasm is not None and built:
                self.wasm.close()
            if self.signer is not None and self._own_signer and built:
                self.signer.close()
            self.ready.set()
            self.log.info("sitsd stopped", **{k: v for k, v in self.counters.as_dict().items() if k != "heartbeat"})

    async def _drain_queue(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while (not self._queue.empty() or self._in_flight is not None) and time.monotonic() < end:
            await asyncio.sleep(0.01)

    def reload_config(self) -> dict:
        """Re-read the config file and apply what can change live. Blocking (the new rules are proven
        against the running model, a fraction of a second): call it off the I/O event loop, as
        `reload_in_background` (SIGHUP) and the control command do; one reload at a time."""
        from .reload import reload

        if self.config_path is None:
            return {"reloaded": False, "error": "this daemon was not started from a config file"}
        return reload(self, self.config_path, self.config_overrides, measure=True)  # into PCR 23: the PLC re-binds

    def reload_in_background(self) -> None:
        """SIGHUP: the reload runs on a worker thread, so PLC commands keep flowing while it is proven. While sitsd
        starts (the start runs beside this loop), one request is remembered and applied after READY=1: a reload
        mid-start would race the start (RELOADING=1 and READY=1 before the start is done, a config event among
        the start's measurements). Ignored while stopping."""
        if self.state not in ("running", "reconnecting"):
            if self.state == "starting":
                if self._reload_pending is None:
                    self._reload_pending = "SIGHUP"
                self.log.info("reload requested while starting: applied after the start", via="SIGHUP")
            else:
                self.log.warning("reload ignored: sitsd is not running", via="SIGHUP", state=self.state)
            return

        def run() -> None:
            try:
                self.reload_config()
            except Exception as exc:  # reload() reports refusals itself; anything else is a bug, said in the log
                self.log.exception("config reload failed", error=repr(exc))

        asyncio.get_running_loop().run_in_executor(None, run)

    async def _reload_request(self, _req: dict) -> dict:
        if self.state not in ("running", "reconnecting"):  # (the socket opens at the end of the start)
            return {"reloaded": False, "error": f"sitsd is {self.state}, not running: reload refused; nothing "
                    "changed. Send it again once `sitsctl status` shows it running"}
        return await asyncio.to_thread(self.reload_config)

    def _stop_request(self, _req: dict) -> dict:
        self._stop.set()
        return {"stopping": True}

    def request_stop(self) -> None:
        """Thread-safe."""
        if self._aio is not None and self._stop is not None:
            self._aio.call_soon_threadsafe(self._stop.set)
