"""Prometheus exporter for a running Daemon.

Everything is read at scrape time on the HTTP server's thread: plain ints from `Counters`, the
daemon's alert and PLC event counts, and the rows of the `TimingRing` written since the previous
scrape. The control loop and the I/O thread do no extra work for the exporter.

Histograms are true cumulative Prometheus histograms. The ring only holds the last `capacity`
frames, so the exporter keeps its own bucket counts and on each scrape folds in the rows that
became final since the last one. A row is final when nothing will write to it any more:

* the loop finished it and it carries no command (dropped frame, signing error), or
* its command was acknowledged (the latency is set), or
* the writer has already handled a later command (its handoff is set), so this one's write
  finished, failed, or was discarded from a full queue.

Rows that are not final yet (a command still queued or being written) stay for the next scrape;
a row the writer never reaches (the writer stalled) is folded anyway once it is more than half a
ring old. If more than `capacity` rows were written since the last scrape, only the last
`capacity` can be counted; the others are counted in `sitsd_timing_rows_lost_total`.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .gates.timestamp import REASONS
from .stats import STAGE_INDEX, STAGES, TimingRing

# Bucket upper bounds in seconds.
LATENCY_BUCKETS_S = (50e-6, 100e-6, 200e-6, 300e-6, 400e-6, 500e-6, 600e-6, 800e-6, 1e-3, 1.25e-3, 1.5e-3, 2e-3,
                     2.5e-3, 3e-3, 4e-3, 5e-3, 7.5e-3, 10e-3, 15e-3, 20e-3, 30e-3, 50e-3)
STAGE_BUCKETS_S = (1e-6, 2e-6, 5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3,
                   20e-3, 50e-3)
STATES = ("starting", "running", "reconnecting", "stopping", "failed")

_SIGN, _HANDOFF = STAGE_INDEX["sign"], STAGE_INDEX["handoff"]


class _Histogram:
    """Cumulative bucket counts, sum and count for values in microseconds, exposed in seconds."""

    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        self.bounds_s = bounds_s
        self._bounds_us = np.asarray(bounds_s) * 1e6
        self.counts = np.zeros(len(bounds_s) + 1, dtype=np.int64)  # the last one is +Inf
        self.sum_s = 0.0

    def observe_us(self, values_us: np.ndarray) -> None:
        v = values_us[np.isfinite(values_us)]
        if v.size:
            # bucket i holds v <= bounds[i]: the first bound >= v
            self.counts += np.bincount(np.searchsorted(self._bounds_us, v, side="left"), minlength=self.counts.size)
            self.sum_s += float(v.sum()) * 1e-6

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def buckets(self) -> list[tuple[str, int]]:
        cumulative = np.cumsum(self.counts)
        out = [(floatToGoString(b), int(c)) for b, c in zip(self.bounds_s, cumulative[:-1])]
        out.append(("+Inf", int(cumulative[-1])))
        return out


class RingHistograms:
    """Folds the final rows of a TimingRing into cumulative histograms (see the module docstring)."""

    def __init__(self, latency_buckets_s: tuple[float, ...] = LATENCY_BUCKETS_S,
                 stage_buckets_s: tuple[float, ...] = STAGE_BUCKETS_S) -> None:
        self.latency = _Histogram(latency_buckets_s)
        self.stages = {name: _Histogram(stage_buckets_s) for name in STAGES}
        self.folded = 0  # absolute index of the next row to fold; rows below it are counted or lost
        self.lost = 0  # rows overwritten before a scrape could count them
        self._ring: TimingRing | None = None
        self._lock = threading.Lock()

    def update(self, ring: TimingRing) -> None:
        with self._lock:
            if ring is not self._ring:  # a new ring (a restarted daemon): start counting its rows afresh
                self._ring, self.folded = ring, 0
            self._fold(ring)

    def _fold(self, ring: TimingRing) -> None:
        written, cap = ring.rows_written, ring.capacity
        if written - self.folded > cap:
            self.lost += written - cap - self.folded
            self.folded = written - cap
        start, n = self.folded, written - self.folded
        if n <= 0:
            return
        idx = np.arange(start, written) % cap
        # First copy decides which rows are final; the second, taken after, holds their values:
        # every write to a final row happened before the first copy read the cell that proved it final.
        stages1, latency1 = ring.stages[idx], ring.latency_us[idx]
        stages2, latency2 = ring.stages[idx], ring.latency_us[idx]
        acked = np.isfinite(latency1)
        final = ~np.isfinite(stages1[:, _SIGN]) | acked
        handed_off = np.flatnonzero(np.isfinite(stages1[:, _HANDOFF]))
        if handed_off.size:
            final[:handed_off[-1]] = True
        final[-1] = acked[-1]  # the loop may still be working on the newest row
        take = n if final.all() else int(np.argmin(final))
        take = max(take, min(n, written - cap // 2 - start))  # the writer never got to these: fold anyway
        if take <= 0:
            return
        self.latency.observe_us(latency2[:take])
        for i, name in enumerate(STAGES):
            self.stages[name].observe_us(stages2[:take, i])
        self.folded = start + take

    def families(self) -> list:
        with self._lock:
            lat = HistogramMetricFamily(
                "sitsd_latency_seconds", "End-to-end latency: the PLC's send timestamp of a frame to the "
                "acknowledged write of its command.")
            lat.add_metric([], self.latency.buckets(), self.latency.sum_s)
            stages = HistogramMetricFamily("sitsd_stage_duration_seconds", "Time spent in each stage of the "
                                           "control loop and the write path, per frame.", labels=["stage"])
            for name, h in self.stages.items():
                stages.add_metric([name], h.buckets(), h.sum_s)
            rows = CounterMetricFamily("sitsd_timing_rows", "Timing ring rows folded into the histograms.")
            rows.add_metric([], self.folded - self.lost)
            lost = CounterMetricFamily("sitsd_timing_rows_lost", "Timing ring rows overwritten before a scrape "
                                       "could count them (scrape more often or enlarge the ring).")
            lost.add_metric([], self.lost)
            return [lat, stages, rows, lost]


def _snapshot(counts: Mapping | None) -> dict:
    """A copy of a dict another thread may be adding keys to."""
    if not counts:
        return {}
    for _ in range(10):
        try:
            return dict(counts)
        except RuntimeError:  # changed size during the copy
            continue
    return {}


def _counter(name: str, doc: str, value, labels: list[str] | None = None, samples: dict | None = None):
    m = CounterMetricFamily(name, doc, labels=labels)
    if samples is None:
        m.add_metric([], value)
    else:
        for key, v in sorted(samples.items()):
            m.add_metric([str(key)] if isinstance(key, str) else [str(k) for k in key], v)
    return m


def credential_stale(link, mlog) -> bool:
    """tpm-session: whether the newest credential written to the PLC (plc_link.last_bound_value, its PCR 23 value)
    no longer matches the measurement log's current value. False before the first bind (and for a version 1
    credential, which carries no PCR 23 value)."""
    bound = getattr(link, "last_bound_value", None)
    value = getattr(mlog, "value", None)
    return bound is not None and value is not None and bytes(bound) != bytes(value)


class DaemonCollector:
    """A prometheus_client collector that reads the daemon's state when scraped."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.histograms = RingHistograms()

    def collect(self):
        d = self.daemon
        c = d.counters
        loop, source = d.loop, d.source
        yield _counter("sitsd_frames", "Frames received by the control loop.", c.frames)
        yield _counter("sitsd_commands", "Commands acknowledged by the PLC (including the startup fail-safe).",
                       c.commands)
        yield _counter("sitsd_commands_submitted", "Signed commands handed to the writer.", c.submitted)
        yield _counter("sitsd_dropped_frames", "Frames dropped by a gate.", None, ["gate"],
                       {"timestamp": c.dropped_timestamp, "constraint": c.dropped_constraint})
        reasons = getattr(d, "timestamp_drop_counts", None)
        if reasons is not None:
            snap = _snapshot(reasons)
            yield _counter("sitsd_timestamp_drops", "Frames dropped by the timestamp gate, by reason.", None,
                           ["reason"], {r: snap.get(r, 0) for r in {*REASONS.values(), *snap}})
        yield _counter("sitsd_failsafe_commands", "Fail-safe commands signed (including the startup one).",
                       c.failsafe)
        yield _counter("sitsd_deadline_missed", "Frames whose model result would have missed the deadline.",
                       c.deadline_missed)
        yield _counter("sitsd_expired_commands", "Commands discarded before the write: past their deadline or "
                       "pushed out of the full write queue.", c.expired)
        yield _counter("sitsd_write_errors", "Command writes the PLC refused or that failed.", c.write_errors)
        yield _counter("sitsd_sign_errors", "Commands the signer failed to sign (nothing was sent).", c.sign_errors)
        yield _counter("sitsd_alerts", "Alerts raised, by kind.", None, ["kind"], _snapshot(d.alert_counts))
        yield _counter("sitsd_plc_events", "PLC events decoded by the vendor profile, by code.", None, ["code"],
                       _snapshot(d.plc_event_counts))
        yield _counter("sitsd_link_errors", "Transient socket errors of the frame source (link down, no buffers); "
                       "the source backs off and recovers by itself.", float(getattr(source, "link_errors", 0) or 0))
        decode = source.decode_status() if hasattr(source, "decode_status") else {}
        yield _counter("sitsd_fallback_decodes", "Frames the compiled fast path refused and the general UADP decoder "
                       "delivered (the slow path is in use).", float(decode.get("fallback_decodes", 0)))
        yield _counter("sitsd_foreign_frames", "Messages of other publishers, writer groups or writers (skipped).",
                       float(decode.get("foreign", 0)))
        yield _counter("sitsd_keepalive_frames", "Keep-alive messages of the configured writer (no data, skipped).",
                       float(decode.get("keep_alives", 0)))
        yield _counter("sitsd_malformed_frames", "Frames the transport could not decode.",
                       getattr(source, "malformed", 0) if source is not None else 0)
        yield _counter("sitsd_lost_frames", "Frames missing from sequence number gaps.",
                       loop.ts_gate.lost if loop is not None else 0)
        yield _counter("sitsd_clamped_commands", "Model outputs changed by the safety envelope.",
                       loop.safety.clamped if loop is not None else 0)
        history = list(d.hotswap.history) if getattr(d, "hotswap", None) is not None else []
        yield _counter("sitsd_model_swaps", "Model hot swaps since start (updates and rollbacks of the model).",
                       float(sum(1 for r in history if r.component == "model")))
        swaps: dict[tuple[str, str], float] = {}
        for r in history:
            swaps[(r.action, r.component)] = swaps.get((r.action, r.component), 0.0) + 1.0
        yield _counter("sitsd_swaps", "Hot swaps and rollbacks since start, by action and component.", None,
                       ["action", "component"], swaps)
        # exported from 0 on (an alert rule's increase() sees the first one); the same count as
        # sitsd_alerts_total{kind="update_refused"}, which appears only once one was raised
        yield _counter("sitsd_updates_refused", "Updates (sitsctl update: module, model, config) refused or failed "
                       "since start; the running version stayed.", float(d.alert_counts.get("update_refused", 0)))
        link, mlog = getattr(d, "link", None), getattr(d, "measurements", None)
        if link is not None and getattr(d.signer, "kind", None) == "tpm-session":  # sitsd/plc_link.py
            yield _counter("sitsd_session_rebinds", "Session credentials written to the PLC after a measurement "
                           "(reload, hot swap, deploy, TPM reset re-measurement) since start.", float(link.rebinds))
            yield _counter("sitsd_session_rebind_failures", "Re-binds that failed (the PLC refused the credential or "
                           "it could not be made); each ended the PLC session.", float(link.rebind_failures))
            yield _counter("sitsd_measurement_compactions", "Measurement-log compactions since start (PCR 23 reset "
                           "and what runs measured again; the old log archived).", float(link.compactions))
            yield _counter("sitsd_measurement_compaction_failures", "Measurement-log compactions that failed since "
                           "start (retried at the next measurement or bind).",
                           float(getattr(link, "compaction_failures", 0)))
            if mlog is not None:
                events = GaugeMetricFamily("sitsd_measurement_log_events", "Events in the measurement log a session "
                                           "credential carries (compacted long before its cap of 256).")
                events.add_metric([], float(len(mlog.events)))
                yield events
                damaged = GaugeMetricFamily("sitsd_measurement_log_damaged", "1 while the measurement log does not "
                                            "explain PCR 23 (an extension of unknown outcome or a compaction that "
                                            "failed after the PCR reset): measurements are refused until a "
                                            "compaction succeeds.")
                damaged.add_metric([], 1.0 if getattr(mlog, "damaged", None) is not None else 0.0)
                yield damaged
                stale = GaugeMetricFamily("sitsd_session_credential_stale", "1 when the PCR 23 value of the newest "
                                          "session credential written to the PLC differs from the measurement log's "
                                          "current value: the PLC holds a credential that does not say what runs "
                                          "(normal for the milliseconds of a re-bind).")
                stale.add_metric([], 1.0 if credential_stale(link, mlog) else 0.0)
                yield stale

        up = GaugeMetricFamily("sitsd_uptime_seconds", "Seconds since the daemon was created.")
        up.add_metric([], time.monotonic() - getattr(d, "_started", time.monotonic()))
        yield up
        state = GaugeMetricFamily("sitsd_state", "1 for the daemon's current state, 0 for the others.",
                                  labels=["state"])
        for s in dict.fromkeys((*STATES, d.state)):
            state.add_metric([s], 1.0 if s == d.state else 0.0)
        yield state
        signer = d.signer
        if signer is not None:
            info = GaugeMetricFamily("sitsd_signer_info", "The command signer: kind and key id.",
                                     labels=["kind", "key_id"])
            info.add_metric([str(getattr(signer, "kind", "")), signer.key_id.hex()], 1.0)
            yield info
        if d.model is not None:  # the model that runs now: a hot swap changes it
            st = loop.stage_set if loop is not None else None
            model = GaugeMetricFamily("sitsd_model_info", "The model in the loop.", labels=["sha256", "artifact"])
            model.add_metric([st.model_sha256.hex() if st is not None else d.model.sha256.hex(),
                              str(st.model_path) if st is not None else str(d.cfg.model.artifact)], 1.0)
            yield model
        audit = getattr(d, "audit", None)
        if audit is not None:  # the durable watermark (AuditLog.durability): what has reached the disk
            dur = audit.durability()  # one snapshot: durable <= written
            yield _counter("sitsd_audit_records", "Command records written to the audit log since start.",
                           dur["head_records"])
            yield _counter("sitsd_audit_durable_records", "Of those, the records known on disk (fsynced, under "
                           "audit.fsync).", dur["records"])
            pending = GaugeMetricFamily("sitsd_audit_not_durable_records", "Audit records written but not yet "
                                        "fsynced: what a power loss now would lose.", labels=["policy"])
            pending.add_metric([dur["policy"]], float(dur["not_durable"]))
            yield pending
            synced = GaugeMetricFamily("sitsd_audit_last_fsync_timestamp_seconds", "Wall time of the fsync that "
                                       "made the newest durable record so (0: none yet by this process).")
            synced.add_metric([], (dur["at_ns"] or 0) / 1e9)
            yield synced
        prover = getattr(d, "prover", None)
        proofs = prover.status() if prover is not None else None
        backlog = GaugeMetricFamily("sitsd_proof_backlog", "Inference proofs waiting to be produced (queued + in "
                                    "flight).")
        backlog.add_metric([], float(proofs["queue_depth"] + proofs["in_flight"]) if proofs else 0.0)
        yield backlog
        if proofs is not None:  # proof.policy on: offered = skipped + accepted + dropped, by decision
            yield _counter("sitsd_proof_offers", "Commands offered to the prover, by decision: skipped by the "
                           "policy, accepted into the queue, or dropped because the queue was full.", None,
                           ["decision"], {k: proofs[k] for k in ("skipped", "accepted", "dropped")})
            yield _counter("sitsd_proofs", "Accepted proofs by outcome: proved, failed, or cancelled (still queued "
                           "when the daemon stopped).", None, ["outcome"],
                           {k: proofs[k] for k in ("proved", "failed", "cancelled")})
            for name, doc, v in (("sitsd_proof_queue_depth", "Proofs waiting in the bounded queue.",
                                  proofs["queue_depth"]),
                                 ("sitsd_proof_queue_capacity", "Size of the bounded proof queue.",
                                  proofs["queue_max"]),
                                 ("sitsd_proofs_in_flight", "Proofs being computed by a worker now.",
                                  proofs["in_flight"]),
                                 ("sitsd_proof_workers", "Live prover processes.", len(proofs["worker_pids"]))):
                g = GaugeMetricFamily(name, doc)
                g.add_metric([], float(v))
                yield g

        self.histograms.update(d.timings)
        yield from self.histograms.families()


class MetricsExporter:
    """Serves /metrics for one daemon from its own registry (never prometheus_client's global one)."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.collector = DaemonCollector(daemon)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._server = None
        self._thread: threading.Thread | None = None

    def render(self) -> bytes:
        """The text exposition format, as a scrape would get it."""
        return generate_latest(self.registry)

    def start(self, host: str = "127.0.0.1", port: int = 9464) -> int:
        """Serve on host:port in a daemon thread; returns the bound port (port 0 picks a free one)."""
        if self._server is not None:
            raise RuntimeError("metrics exporter already started")
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_address[1]

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server is not None else None

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = self._thread = None
