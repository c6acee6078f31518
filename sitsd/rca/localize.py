"""Root-cause localization: rank the FMEA's failure modes by how well they explain what was observed.

1. Symptoms: events grouped by code (gate alerts, PLC events, signer/update events) that changed
   against the reference part of the window, plus the detectors' anomalies over the signal window
   (relations, stuck sensors, Granger edges, model replay).
2. Causal graph: failure mode -> its detections, and failure mode -> effect -> the effect's detections.
3. Score per failure mode: symptoms it predicts and that were seen (by expectation and strength),
   required symptoms that are missing, symptoms it cannot explain, temporal precedence (a root cause's
   own detections come first; its effects later) and the FMEA occurrence rating as a prior.
4. Confidence: softmax over the scores. Nothing here knows which fault was injected.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .detect import DetectorSettings, Replay, detect
from .events import Event, SignalWindow
from .fmea import EXPECT_WEIGHT, Component, Detection, FailureMode, Fmea

SEVERE = ("error", "critical")
PRECEDENCE_TOLERANCE_NS = 300_000_000  # symptoms within 0.3 s of the first one count as "first"


@dataclass
class Symptom:
    code: str
    source: str
    onset_ns: int
    count: int
    strength: float  # 0..1: how clear the evidence is
    severity: str
    value: float
    text: str


@dataclass
class Candidate:
    mode: FailureMode
    component: Component
    score: float
    confidence: float = 0.0
    evidence: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)  # symptom codes
    missing: list[str] = field(default_factory=list)  # detection codes expected but not seen

    def as_dict(self) -> dict:
        return {"cause": self.mode.id, "name": self.mode.name, "component": self.component.id,
                "component_name": self.component.name, "score": round(self.score, 3),
                "confidence": round(self.confidence, 4), "severity": self.mode.severity,
                "occurrence": self.mode.occurrence, "detection": self.mode.detection, "rpn": self.mode.rpn,
                "fix": self.mode.fix, "evidence": self.evidence, "explained": self.explained,
                "missing": self.missing}


@dataclass
class Diagnosis:
    candidates: list[Candidate]
    symptoms: list[Symptom]
    start_ns: int
    end_ns: int
    first_alert_ns: int | None
    localize_ms: float
    fmea: Fmea

    @property
    def top(self) -> Candidate | None:
        return self.candidates[0] if self.candidates and self.symptoms else None

    def as_dict(self, limit: int = 5) -> dict:
        return {"window": {"start_ns": self.start_ns, "end_ns": self.end_ns},
                "first_alert_ns": self.first_alert_ns, "localize_ms": round(self.localize_ms, 3),
                "symptoms": [{"code": s.code, "source": s.source, "onset_ns": s.onset_ns, "count": s.count,
                              "strength": round(s.strength, 3), "severity": s.severity, "text": s.text}
                             for s in self.symptoms],
                "ranking": [c.as_dict() for c in self.candidates[:limit]] if self.symptoms else []}


def _event_strength(count: int, severity: str) -> float:
    if severity in SEVERE:
        return 1.0
    return min(1.0, math.log10(1 + count) / 2.0)  # 1 alert 0.15, 10 alerts 0.5, 100 and more 1.0


def event_symptoms(events: list[Event], start_ns: int, end_ns: int, reference_fraction: float) -> list[Symptom]:
    """Events grouped by code; a code that fires in the tested part no more often than in the reference part
    is background (a rare clamp, a PLC message it repeats all the time), not a symptom. An error or critical
    event the reference never saw counts however rare it is."""
    split = start_ns + int((end_ns - start_ns) * reference_fraction)
    ref_s = max((split - start_ns) / 1e9, 1e-3)
    recent_s = max((end_ns - split) / 1e9, 1e-3)
    groups: dict[str, list[Event]] = {}
    for e in events:
        if start_ns <= e.t_ns <= end_ns:
            groups.setdefault(e.code, []).append(e)
    out = []
    for code, evs in groups.items():
        recent = [e for e in evs if e.t_ns >= split]
        severity = max((e.severity for e in evs), key=lambda s: ("info", "warning", "error", "critical").index(s)
                       if s in ("info", "warning", "error", "critical") else 1)
        if not recent:
            continue
        in_reference = len(evs) - len(recent)
        if severity not in SEVERE or in_reference:
            if len(recent) / recent_s <= 2.0 * in_reference / ref_s + 0.5:
                continue
        first = recent[0]
        out.append(Symptom(code, first.source, first.t_ns, len(recent), _event_strength(len(recent), severity),
                           severity, first.value, first.text))
    return out


def anomaly_symptoms(anomalies: list[Event], threshold: float) -> list[Symptom]:
    out = {}
    for a in anomalies:
        if a.code.startswith("anomaly.relation."):
            strength = min(1.0, 0.5 + abs(a.value) / (8 * threshold))
        else:
            strength = 1.0
        if a.code not in out or a.t_ns < out[a.code].onset_ns:
            out[a.code] = Symptom(a.code, a.source, a.t_ns, 1, strength, a.severity, a.value, a.text)
    return list(out.values())


def _hits(d: Detection, symptoms: list[Symptom]) -> list[Symptom]:
    return [s for s in symptoms if d.matches(s.code, s.severity, s.value)]


def _ago(t_ns: int, first_ns: int) -> str:
    return f"+{(t_ns - first_ns) / 1e9:.2f} s"


def score(component: Component, mode: FailureMode, fmea: Fmea, symptoms: list[Symptom]) -> Candidate:
    cand = Candidate(mode, component, 0.15 * math.log(mode.occurrence))
    first_ns = min(s.onset_ns for s in symptoms)
    explained: dict[str, Symptom] = {}
    own: list[Symptom] = []
    for d in mode.detections:
        w = EXPECT_WEIGHT[d.expect]
        hits = _hits(d, symptoms)
        if hits:
            best = max(hits, key=lambda s: s.strength)
            cand.score += w * (1.0 + best.strength)
            own += hits
            for s in hits:
                explained[s.code] = s
                cand.evidence.append(f"seen {s.code} at {_ago(s.onset_ns, first_ns)}: {s.text}")
        elif d.expect == "required":
            cand.score -= 2.0 * w
            cand.missing.append(d.code)
            cand.evidence.append(f"missing {d.code} (required by this failure mode)")
        elif d.expect == "likely":
            cand.score -= 0.5 * w
            cand.missing.append(d.code)
    for effect_id in mode.effects:
        for d in fmea.effect(effect_id).detections:
            for s in _hits(d, symptoms):
                if s.code not in explained:
                    explained[s.code] = s
                    cand.score += 0.3 * EXPECT_WEIGHT[d.expect] * s.strength
                    cand.evidence.append(f"effect {effect_id}: {s.code} at {_ago(s.onset_ns, first_ns)}")
    unexplained = [s for s in symptoms if s.code not in explained]
    cand.score -= sum(s.strength for s in unexplained)
    if own:
        lead = min(own, key=lambda s: s.onset_ns)
        own_first = lead.onset_ns
        if own_first - first_ns <= PRECEDENCE_TOLERANCE_NS:
            cand.score += lead.strength  # a faint early symptom says less about the order than a clear one
            cand.evidence.append("precedence: its own detection fired first")
        else:
            earlier = [s.code for s in unexplained if s.onset_ns < own_first - PRECEDENCE_TOLERANCE_NS]
            if earlier:
                cand.score -= 0.5
                cand.evidence.append(f"precedence: {', '.join(earlier[:3])} fired before its own detections")
    for s in unexplained[:3]:
        cand.evidence.append(f"not explained: {s.code}")
    cand.explained = sorted(explained)
    return cand


def localize(fmea: Fmea, events: list[Event], window: SignalWindow | None, *, start_ns: int | None = None,
             end_ns: int | None = None, inputs: list[str] | None = None, replay: Replay | None = None,
             settings: DetectorSettings = DetectorSettings()) -> Diagnosis:
    """Rank failure modes for what happened in [start_ns, end_ns] (default: the window's or the events' span)."""
    t0 = time.perf_counter()
    times = [e.t_ns for e in events] + ([int(window.t_ns[0]), int(window.t_ns[-1])] if window is not None and
                                        len(window) else [])
    start_ns = start_ns if start_ns is not None else (min(times) if times else 0)
    end_ns = end_ns if end_ns is not None else (max(times) if times else 0)
    if window is not None and len(window):
        keep = (window.t_ns >= start_ns) & (window.t_ns <= end_ns)
        window = SignalWindow(window.names, window.outputs, window.t_ns[keep], window.values[keep],
                              window.command[keep], window.failsafe[keep], window.meta)
    anomalies = detect(fmea, window, inputs=inputs, replay=replay, settings=settings)
    symptoms = event_symptoms(events, start_ns, end_ns, settings.reference_fraction)
    symptoms += anomaly_symptoms(anomalies, settings.z_threshold)
    symptoms.sort(key=lambda s: s.onset_ns)
    candidates: list[Candidate] = []
    if symptoms:
        candidates = [score(c, m, fmea, symptoms) for c, m in fmea.failure_modes]
        top = max(c.score for c in candidates)
        weights = [math.exp(c.score - top) for c in candidates]
        total = sum(weights)
        for c, w in zip(candidates, weights):
            c.confidence = w / total
        candidates.sort(key=lambda c: -c.score)
    first = symptoms[0].onset_ns if symptoms else None
    return Diagnosis(candidates, symptoms, start_ns, end_ns, first, (time.perf_counter() - t0) * 1e3, fmea)


def baseline_ranking(fmea: Fmea, events: list[Event]) -> list[str]:
    """The comparison: each event votes for every failure mode with a detection matching its code; most votes
    first (ties in file order). No relations, no precedence, no statistics."""
    votes = {m.id: 0 for _, m in fmea.failure_modes}
    for e in events:
        for _, m in fmea.failure_modes:
            if any(d.matches(e.code, e.severity, e.value) for d in m.detections):
                votes[m.id] += 1
    order = [m.id for _, m in fmea.failure_modes]
    return sorted(order, key=lambda i: (-votes[i], order.index(i)))
