"""Detectors over the signal window: they turn recent frames into anomaly events with an onset time.

The first `reference_fraction` of the window is the reference (assumed healthy); the rest is
tested against it: relations that left their steady value, sensors that repeat one value, Granger
edges that stopped carrying information, and commands that differ from the verified model
replayed on the same inputs. None of them knows which fault (if any) was injected.

A relation is tested two ways, and either one flags it:

- level: its 0.5 s moving mean against the reference's median, in reference spreads;
- step: its 0.5 s moving mean against its own mean over the 1.5 s just before (a trailing
  baseline), in reference spreads of that same statistic. A slow process trend (the rolls
  heating up after a start or a roll change move the gaugemeter relation by 0.02 mm over the
  first 8 s) widens the level spread of a reference that contains it, so a fault within the
  next seconds would have to be many times larger to show; the step is blind to trends slower
  than its 2 s span and shows a fault's onset within a second. Once it fires, the deviation is
  measured against the level just before the onset, so the excursion lasts until the relation is
  back there (and the way back is not a step of its own). It needs `step_reference` values of its
  statistic in the reference to estimate their spread; with fewer it stays off.

A relation anomaly is one `Anomaly` per excursion, with `end_ns`, the last sample it was outside
(the window's end while it lasts), so the localizer can tell a transient that is over from an
ongoing fault. `relation_shifts` measures each relation's move since an instant (the incident's
first alert) for the localizer's graded, below-threshold evidence.
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


@dataclass(frozen=True, slots=True)
class Anomaly(Event):
    """A detector's event, with the time it was last seen (`end_ns`; the window's end while it lasts)."""

    end_ns: int = 0


@dataclass(frozen=True)
class DetectorSettings:
    reference_fraction: float = 0.4
    smooth: int = 50  # samples in the moving mean of a relation (0.5 s at 100 Hz)
    z_threshold: float = 8.0  # smoothed relation vs its reference spread
    step_baseline: int = 150  # samples in the trailing baseline of the step test (1.5 s at 100 Hz)
    step_reference: int = 400  # step values the reference must hold to estimate their spread (4 s)
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


def _trailing_step(x: np.ndarray, smooth: int, baseline: int) -> np.ndarray:
    """The `smooth`-sample moving mean minus the mean of the `baseline` samples before those (NaN until both
    exist): how far the relation moved within the last few seconds, whatever its slow trend."""
    sm = _moving_mean(x, smooth)
    base = _moving_mean(x, baseline)
    out = np.full(len(x), np.nan)
    if len(x) > smooth + baseline:
        out[smooth + baseline - 1:] = sm[smooth + baseline - 1:] - base[baseline - 1:len(x) - smooth]
    return out


def _reference_z(series: np.ndarray, start: int, ref_end: int, min_len: int):
    """(mu, sigma) of `series` over the reference rows [start, ref_end); None when the reference holds fewer than
    `min_len` finite values."""
    ref = series[start:ref_end]
    ref = ref[np.isfinite(ref)]
    if len(ref) < min_len:
        return None
    mu = float(np.median(ref))
    return mu, float(np.std(ref)) + 1e-9 + 1e-6 * abs(mu)


def _runs(flags: np.ndarray, hold: int, gap: int) -> list[tuple[int, int]]:
    """(first, last) index of each run of at least `hold` True values; runs at most `gap` apart are one."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    out: list[tuple[int, int]] = []
    for a, b in zip(edges[::2], edges[1::2]):
        if b - a < hold:
            continue
        if out and a - out[-1][1] <= gap:
            out[-1] = (out[-1][0], int(b) - 1)
        else:
            out.append((int(a), int(b) - 1))
    return out


def _walk_back(z: np.ndarray, i: int, s: DetectorSettings) -> int:
    """From a crossing back to where the deviation began (|z| below a third of the threshold), at most `smooth`."""
    j = i
    while j > max(0, i - s.smooth) and abs(z[j - 1]) > s.z_threshold / 3:
        j -= 1
    return j


def _level_excursions(sm, mu, sigma, tol, s: DetectorSettings) -> list[tuple[int, int, float]]:
    """(onset, last, peak z) of each stretch the moving mean spent away from the reference level."""
    z = np.nan_to_num((sm - mu) / sigma)
    flags = (np.abs(z) > s.z_threshold) & (np.abs(np.nan_to_num(sm - mu)) > tol)
    return [(_walk_back(z, a, s), b, float(z[a:b + 1][np.argmax(np.abs(z[a:b + 1]))]))
            for a, b in _runs(flags, s.hold, s.smooth)]


def _step_excursions(sm, step, mu, sigma, tol, s: DetectorSettings,
                     level: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """(onset, last, peak z) of each step: the trailing step crosses the threshold; from its onset on the
    deviation is measured against the level just before the onset (the baseline is frozen there), so the
    excursion lasts until the relation is back at that level. A step back, taken during or within the step's
    span after an excursion (`level`'s or an earlier step's) that went the other way, is that excursion's
    recovery, not a step of its own."""
    z = np.nan_to_num((step - mu) / sigma)
    flags = (np.abs(z) > s.z_threshold) & (np.abs(np.nan_to_num(step - mu)) > tol)
    span = s.smooth + s.step_baseline
    out: list[tuple[int, int, float]] = []
    i = 0
    while i < len(z):
        c = _first_sustained(flags[i:], s.hold)
        if c < 0:
            break
        c += i
        j = _walk_back(z, c, s)
        if any(a <= j <= b + span and np.sign(pz) == -np.sign(z[c]) for a, b, pz in level + out):
            off = np.flatnonzero(~flags[c:])
            i = c + (int(off[0]) if len(off) else len(flags) - c)
            continue
        before = sm[j] - step[j]  # the trailing baseline at the onset
        dev = np.nan_to_num(sm[j:] - before - mu)
        zz = dev / sigma
        away = (np.abs(zz) > s.z_threshold) & (np.abs(dev) > tol)
        away[:c - j] = True  # the walk-back stretch belongs to it
        back = _first_sustained(~away, s.smooth)  # back at the level for `smooth` samples: over
        last = j + (back - 1 if back >= 0 else len(away) - 1)
        seg = zz[:last - j + 1]
        out.append((j, last, float(seg[np.argmax(np.abs(seg))])))
        i = last + 1
    return out


def relation_events(fmea: Fmea, w: SignalWindow, s: DetectorSettings) -> list[Event]:
    """One anomaly per excursion of each relation (level or step, overlapping ones joined); its value is the
    peak in reference spreads, with its sign (the level test's when it flagged the excursion)."""
    out = []
    n = len(w)
    ref_end = reference_end(w, s.reference_fraction)
    if ref_end < 2 * s.smooth or n - ref_end < s.hold:
        return out
    frame_s = float(np.median(np.diff(w.t_ns))) / 1e9
    for rel in fmea.relations:
        r = rel.expression.evaluate(w.column)
        if rel.expression.max_lag:
            r[~_lag_valid(w, rel.expression.max_lag)] = np.nan
        sm = _moving_mean(r, s.smooth)
        level = _reference_z(sm, s.smooth, ref_end, s.smooth)
        if level is None:
            continue
        moved = _level_excursions(sm[ref_end:], *level, rel.tolerance, s)
        found = [(a, b, z, 0) for a, b, z in moved]
        step = _trailing_step(r, s.smooth, s.step_baseline)
        ref = _reference_z(step, s.smooth + s.step_baseline, ref_end, s.step_reference)
        if ref is not None:
            found += [(a, b, z, 1) for a, b, z in _step_excursions(sm[ref_end:], step[ref_end:], *ref,
                                                                     rel.tolerance, s, moved)]
        joined: list[list] = []
        for a, b, z, k in sorted(found):
            if joined and a <= joined[-1][1] + s.smooth:
                last = joined[-1]
                last[1] = max(last[1], b)
                if (k, -abs(z)) < (last[3], -abs(last[2])):  # the level test's peak, else the larger
                    last[2], last[3] = z, k
            else:
                joined.append([a, b, z, k])
        for a, b, peak, k in joined:
            what = f"moved {peak:+.1f} sigma from its reference {level[0]:.5g}" if k == 0 else \
                f"stepped {peak:+.1f} sigma from its level over the {s.step_baseline * frame_s:.3g} s before"
            out.append(Anomaly(int(w.t_ns[ref_end + a]), "anomaly", f"anomaly.relation.{rel.name}",
                               f"{rel.name} ({rel.text or rel.expr}) {what}", "warning", "", rel.name, peak,
                               int(w.t_ns[ref_end + b])))
    return out


@dataclass(frozen=True)
class Shift:
    """How far a relation moved since an instant: the mean of its last `smooth` samples against its mean over
    the `step_baseline` samples before the instant, in reference spreads of the step statistic."""

    relation: str
    z: float
    deviation: float  # in the relation's unit, signed
    t_ns: int  # when it was measured (the window's end)


def relation_shifts(fmea: Fmea, w: SignalWindow, since_ns: int, s: DetectorSettings) -> list[Shift]:
    """Each relation's move since `since_ns` (the incident's first alert), measured at the window's end.
    Graded evidence for the first seconds of an incident, when a slow fault's relation may still be below the
    detection threshold: the localizer counts a shift between half the threshold and the threshold as partly
    seen. Only while the incident is younger than the step test's span (2 s): the spread it is measured in is
    that of moves within the span; over longer times the process wanders further, and the detectors have
    had their time."""
    out: list[Shift] = []
    ref_end = reference_end(w, s.reference_fraction)
    at = int(np.searchsorted(w.t_ns, since_ns))
    if ref_end < 2 * s.smooth or at < s.step_baseline or len(w) - at < s.smooth // 2:
        return out
    frame_ns = float(np.median(np.diff(w.t_ns)))
    if w.t_ns[-1] - since_ns > (s.smooth + s.step_baseline) * frame_ns:
        return out
    for rel in fmea.relations:
        r = rel.expression.evaluate(w.column)
        if rel.expression.max_lag:
            r[~_lag_valid(w, rel.expression.max_lag)] = np.nan
        ref = _reference_z(_trailing_step(r, s.smooth, s.step_baseline), s.smooth + s.step_baseline, ref_end,
                           s.step_reference)
        before, recent = r[at - s.step_baseline:at], r[max(at, len(r) - s.smooth):]
        if ref is None or not np.isfinite(before).any() or not np.isfinite(recent).any():
            continue
        dev = float(np.nanmean(recent) - np.nanmean(before) - ref[0])
        out.append(Shift(rel.name, dev / ref[1] if abs(dev) > rel.tolerance else 0.0, dev, int(w.t_ns[-1])))
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
    """The model's outputs against the verified model replayed on the same inputs.

    Like with like: when the window holds the model's own records (`model_in`, `model_out`, `model_ok`: what
    the model saw after the pre module and returned before the post module and the safety envelope, on rows
    the running model produced), those are compared, and only they: a pre module's filter, a post module's
    rate shaping, the envelope's clamps and frames from before a hot swap to another model are no mismatch.
    Without them (an events file of an older version), the commands the loop sent (not fail-safe) against
    the model replayed on the frame's raw signal values, which is right only for a loop without modules and
    commands inside the envelope."""
    if w.model_ok is not None and w.model_in is not None and w.model_out is not None:
        live = w.model_ok
        if live.sum() < s.hold:
            return []
        x = w.model_in[live].astype(np.float32)
        got = w.model_out[live, 0].astype(np.float64)
    else:
        live = ~w.failsafe
        if live.sum() < s.hold:
            return []
        x = np.column_stack([w.column(name) for name in inputs]).astype(np.float32)[live]
        got = w.command[live, 0]
    expected = np.asarray(replay(x), dtype=np.float64)[:, 0]
    residual = got - expected
    k = _first_sustained(np.abs(residual) > s.replay_tolerance, s.hold)
    if k < 0:
        return []
    t = w.t_ns[live]
    peak = float(np.median(residual[k:]))
    return [Event(int(t[k]), "model", "model.replay_mismatch",
                  f"model outputs differ from the verified model on the same inputs by {peak * 1000:+.1f} um "
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
