"""Detectors over the signal window: they turn recent frames into anomaly events with an onset time.

The first `reference_fraction` of the window is the reference (assumed healthy); the rest is
tested against it: relations that left their steady value, sensors that repeat one value, Granger
edges that stopped carrying information, and commands that differ from the verified model
replayed on the same inputs. None of them knows which fault (if any) was injected.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .events import Event, SignalWindow
from .fmea import Fmea
from .granger import granger

# replay(inputs [n, k] float32) -> outputs [n, m]: the verified model run off the fast path
Replay = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class DetectorSettings:
    reference_fraction: float = 0.4
    smooth: int = 50  # samples in the moving mean of a relation (0.5 s at 100 Hz)
    z_threshold: float = 8.0  # smoothed relation vs its reference spread
    hold: int = 25  # samples a deviation must last
    stuck_samples: int = 30  # identical readings in a row that make a sensor "stuck"
    replay_tolerance: float = 2e-3  # command units (mm) between sent and replayed command
    granger_p_reference: float = 1e-3  # the edge must be clear in the reference ...
    granger_p_lost: float = 0.05  # ... and gone afterwards


def _moving_mean(x: np.ndarray, n: int) -> np.ndarray:
    """Trailing mean over n samples (NaNs treated as missing); the first n-1 entries use what exists."""
    ok = np.isfinite(x)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, x, 0.0))])
    k = np.concatenate([[0], np.cumsum(ok)])
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(idx - n, 0)
    cnt = k[idx] - k[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (c[idx] - c[lo]) / np.maximum(cnt, 1), np.nan)


def _first_sustained(flags: np.ndarray, hold: int) -> int:
    """Index of the first run of `hold` True values, or -1."""
    if hold <= 1:
        hits = np.flatnonzero(flags)
        return int(hits[0]) if len(hits) else -1
    run = np.convolve(flags.astype(np.int32), np.ones(hold, dtype=np.int32), mode="valid")
    hits = np.flatnonzero(run == hold)
    return int(hits[0]) if len(hits) else -1


def reference_end(w: SignalWindow, fraction: float) -> int:
    """First row of the tested part: the reference is the first `fraction` of the window's *time* (rows are
    not evenly spaced: frames dropped by the gates leave no row)."""
    if len(w) == 0:
        return 0
    split = w.t_ns[0] + int((int(w.t_ns[-1]) - int(w.t_ns[0])) * fraction)
    return int(np.searchsorted(w.t_ns, split))


def _lag_valid(w: SignalWindow, lag: int) -> np.ndarray:
    """Rows where prev(x, lag) means `lag` frames earlier: no fail-safe command in between (the model was
    not in the loop) and no frames missing (dropped frames leave no row)."""
    n = len(w)
    ok = np.zeros(n, dtype=bool)
    if n <= lag:
        return ok
    dt = np.diff(w.t_ns)
    step = np.median(dt) if len(dt) else 0
    elapsed = w.t_ns[lag:] - w.t_ns[:-lag]
    live = ~w.failsafe
    window_live = np.ones(n - lag, dtype=bool)
    for k in range(lag + 1):
        window_live &= live[k:n - lag + k]
    ok[lag:] = (elapsed <= (lag + 0.5) * step) & window_live
    return ok


def relation_events(fmea: Fmea, w: SignalWindow, s: DetectorSettings) -> list[Event]:
    out = []
    n = len(w)
    ref_end = reference_end(w, s.reference_fraction)
    if ref_end < 2 * s.smooth or n - ref_end < s.hold:
        return out
    for rel in fmea.relations:
        r = rel.expression.evaluate(w.column)
        if rel.expression.max_lag:
            r[~_lag_valid(w, rel.expression.max_lag)] = np.nan
        sm = _moving_mean(r, s.smooth)
        ref = sm[s.smooth:ref_end]
        ref = ref[np.isfinite(ref)]
        if len(ref) < s.smooth:
            continue
        mu = float(np.median(ref))
        sigma = float(np.std(ref)) + 1e-9 + 1e-6 * abs(mu)
        z = (sm[ref_end:] - mu) / sigma
        deviation = np.abs(np.nan_to_num(sm[ref_end:] - mu))
        outside = (np.abs(np.nan_to_num(z)) > s.z_threshold) & (deviation > rel.tolerance)
        i = _first_sustained(outside, s.hold)
        if i < 0:
            continue
        # onset: walk back from the crossing to where the deviation began (|z| below a third of the threshold)
        j = i
        while j > max(0, i - s.smooth) and abs(z[j - 1]) > s.z_threshold / 3:
            j -= 1
        peak = float(z[i:][np.nanargmax(np.abs(z[i:]))])
        out.append(Event(int(w.t_ns[ref_end + j]), "anomaly", f"anomaly.relation.{rel.name}",
                         f"{rel.name} ({rel.text or rel.expr}) moved {peak:+.1f} sigma from its reference "
                         f"{mu:.5g}", "warning", "", rel.name, peak))
    return out


def stuck_events(w: SignalWindow, s: DetectorSettings) -> list[Event]:
    out = []
    ref_end = reference_end(w, s.reference_fraction)
    if ref_end < 10:
        return out
    for i, name in enumerate(w.names):
        x = w.values[:, i]
        same = np.diff(x) == 0
        if same[:ref_end].mean() > 0.5:  # a signal that is constant anyway (a mode, an enum) cannot get stuck
            continue
        k = _first_sustained(same[ref_end:], s.stuck_samples)
        if k < 0:
            continue
        start = ref_end + k
        length = int(np.argmin(same[start:])) if not same[start:].all() else len(same) - start
        out.append(Event(int(w.t_ns[start]), "anomaly", f"anomaly.stuck.{name}",
                         f"{name} repeated {x[start]:.6g} for {length + 1} frames (noise-free: a frozen reading)",
                         "warning", "", name, float(length + 1)))
    return out


def granger_events(fmea: Fmea, w: SignalWindow, s: DetectorSettings) -> list[Event]:
    out = []
    n = len(w)
    ref_end = reference_end(w, s.reference_fraction)
    recent = max(ref_end, n - ref_end)
    for edge in fmea.granger:
        x, y = w.column(edge.cause), w.column(edge.effect)
        if np.std(x[recent:]) < 0.1 * np.std(x[:ref_end]):
            continue  # the cause hardly moves any more (fail-safe, saturated model): no evidence either way
        before = granger(x[:ref_end], y[:ref_end], edge.lags)
        after = granger(x[recent:], y[recent:], edge.lags)
        if before.p_value < s.granger_p_reference and after.p_value > s.granger_p_lost:
            out.append(Event(int(w.t_ns[recent]), "anomaly", edge.code,
                             f"{edge.cause} no longer Granger-causes {edge.effect}: F {before.f:.1f} "
                             f"(p {before.p_value:.1e}) in the reference, F {after.f:.2f} (p {after.p_value:.2f}) now",
                             "warning", "", edge.effect, after.p_value))
    return out


def replay_events(w: SignalWindow, inputs: list[str], replay: Replay, s: DetectorSettings) -> list[Event]:
    """Commands the loop sent (not fail-safe) against the verified model on the same inputs."""
    live = ~w.failsafe
    if live.sum() < s.hold:
        return []
    x = np.column_stack([w.column(name) for name in inputs]).astype(np.float32)
    expected = np.asarray(replay(x[live]), dtype=np.float64)[:, 0]
    residual = w.command[live, 0] - expected
    k = _first_sustained(np.abs(residual) > s.replay_tolerance, s.hold)
    if k < 0:
        return []
    t = w.t_ns[live]
    peak = float(np.median(residual[k:]))
    return [Event(int(t[k]), "model", "model.replay_mismatch",
                  f"commands differ from the verified model on the same inputs by {peak * 1000:+.1f} um "
                  f"(median since onset)", "error", "model", "command", peak)]


def detect(fmea: Fmea, w: SignalWindow | None, *, inputs: list[str] | None = None, replay: Replay | None = None,
           settings: DetectorSettings = DetectorSettings()) -> list[Event]:
    if w is None or len(w) == 0:
        return []
    out = relation_events(fmea, w, settings) + stuck_events(w, settings) + granger_events(fmea, w, settings)
    if replay is not None and inputs:
        out += replay_events(w, inputs, replay, settings)
    return sorted(out, key=lambda e: e.t_ns)


def model_replay(model) -> Replay:
    """Replay through an `ep.session.ModelRunner`'s ONNX Runtime session, batched (the session's input has a
    dynamic batch axis). Use a runner of its own: the loop's runner is bound to the loop thread."""
    def replay(x: np.ndarray) -> np.ndarray:
        return model.session.run([model.output_name], {model.input_name: np.ascontiguousarray(x, np.float32)})[0]

    return replay
