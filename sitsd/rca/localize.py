"""Root-cause localization: rank the FMEA's failure modes by how well they explain what was observed.

1. Symptoms: events grouped by code (gate alerts, PLC events, signer/update events) that changed
   against the reference part of the window, plus the detectors' anomalies over the signal window
   (relations, stuck sensors, Granger edges, model replay). An event code's onset is where its burst
   began: one isolated warning seconds before (a single clamp) is background, not the onset.
2. Episodes: the symptoms are cut into episodes (a symptom joins the episode before it when it starts
   before, or within 0.3 s after, that episode's last activity). An earlier episode made only of relation
   anomalies that have returned to their band is a transient that is over (the gauge loop riding out a
   hardness or entry-thickness swing leaves the thickness 0.03-0.05 mm off for a second or two): it is
   listed as `cleared`, neither explained nor held against any candidate, and the incident's first alert
   is the first symptom after it.
3. Weak evidence, while the incident is young (within 2 s of its first alert): a relation that has moved
   since the first alert by more than half the detection threshold but not yet past it counts as partly
   seen, with a belief that rises linearly from 0 at half the threshold to 1 at the threshold. A slow
   drift's second relation (the gaugemeter under a gap transducer drift of 10 um/s) needs a few seconds
   to cross 8 sigma; a second after the first alert it is typically at 5-7 sigma, which already tells a
   drifting transducer (gaugemeter moves) from a saturated capsule (gaugemeter stays).
4. Causal graph: failure mode -> its detections, and failure mode -> effect -> the effect's detections.
5. Score per failure mode: symptoms it predicts and that were seen (by expectation, strength and belief),
   required symptoms that are missing (a weak one is missing by 1 - belief), symptoms it cannot explain,
   temporal precedence (a root cause's own detections come first; its effects later) and the FMEA
   occurrence rating as a prior.
6. Confidence: softmax over the scores. Nothing here knows which fault was injected.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from .detect import Anomaly, DetectorSettings, Replay, detect, relation_shifts
from .events import CHANGE_CODES, Event, SignalWindow
from .fmea import EXPECT_WEIGHT, Component, Detection, FailureMode, Fmea

SEVERE = ("error", "critical")
PRECEDENCE_TOLERANCE_NS = 300_000_000  # symptoms within 0.3 s of the first one count as "first"
EPISODE_GAP_NS = 300_000_000  # a symptom starting more than 0.3 s after all before it ended opens a new episode


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
    end_ns: int = 0  # last seen: the last event of the code, or the last sample an anomaly was outside its band
    belief: float = 1.0  # < 1: a relation that moved since the first alert, but not yet past the threshold


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
    symptoms: list[Symptom]  # the incident's, in order of onset
    start_ns: int
    end_ns: int
    first_alert_ns: int | None
    localize_ms: float
    fmea: Fmea
    cleared: list[Symptom] = field(default_factory=list)  # transients that were over before the incident began

    @property
    def top(self) -> Candidate | None:
        return self.candidates[0] if self.candidates and self.symptoms else None

    def as_dict(self, limit: int = 5) -> dict:
        return {"window": {"start_ns": self.start_ns, "end_ns": self.end_ns},
                "first_alert_ns": self.first_alert_ns, "localize_ms": round(self.localize_ms, 3),
                "symptoms": [{"code": s.code, "source": s.source, "onset_ns": s.onset_ns, "count": s.count,
                              "strength": round(s.strength, 3), "belief": round(s.belief, 3), "severity": s.severity,
                              "text": s.text}
                             for s in self.symptoms],
                "cleared": [{"code": s.code, "onset_ns": s.onset_ns, "end_ns": s.end_ns, "text": s.text}
                            for s in self.cleared],
                "ranking": [c.as_dict() for c in self.candidates[:limit]] if self.symptoms else []}


def _event_strength(count: int, severity: str) -> float:
    if severity in SEVERE:
        return 1.0
    return min(1.0, math.log10(1 + count) / 2.0)  # 1 alert 0.15, 10 alerts 0.5, 100 and more 1.0


BURST_NS = 1_000_000_000
# an update (config reload, model or module swap, rollback) in the tested part: certain, but by itself no fault
CHANGE_STRENGTH = 0.5


def _burst_start(recent: list[Event], severity: str) -> Event:
    """The event where a code's burst began: an isolated warning before it (one clamp seconds earlier) is
    background, not the onset. An error or critical event is an onset by itself."""
    if severity in SEVERE:
        return recent[0]
    for e, nxt in zip(recent, recent[1:]):
        if nxt.t_ns - e.t_ns <= BURST_NS:
            return e
    return recent[0]


def event_symptoms(events: list[Event], start_ns: int, end_ns: int, reference_fraction: float) -> list[Symptom]:
    """Events grouped by code; a code that fires in the tested part no more often than in the reference part
    is background (a rare clamp, a PLC message it repeats all the time), not a symptom. An error or critical
    event the reference never saw counts however rare it is, and so does a change to what runs (a config
    reload, a model or module swap, a rollback: `events.CHANGE_CODES`) in the tested part."""
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
        if code in CHANGE_CODES:  # a change to what runs: one is news, however rare (a rate says nothing)
            first = recent[0]
            out.append(Symptom(code, first.source, first.t_ns, len(recent), CHANGE_STRENGTH, severity, first.value,
                               first.text, recent[-1].t_ns))
            continue
        if severity not in SEVERE or in_reference:
            if len(recent) / recent_s <= 2.0 * in_reference / ref_s + 0.5:
                continue
        first = _burst_start(recent, severity)
        out.append(Symptom(code, first.source, first.t_ns, len(recent), _event_strength(len(recent), severity),
                           severity, first.value, first.text, recent[-1].t_ns))
    return out


def anomaly_symptoms(anomalies: list[Event], threshold: float, end_ns: int) -> list[Symptom]:
    """One symptom per anomaly (a relation can have several excursions; `merge` joins a code's after the
    episodes are known). Only relation anomalies carry a measured end; a frozen sensor, a lost Granger edge
    or a replay mismatch count as lasting to `end_ns`."""
    out = []
    for a in anomalies:
        if a.code.startswith("anomaly.relation."):
            strength = min(1.0, 0.5 + abs(a.value) / (8 * threshold))
        else:
            strength = 1.0
        end = a.end_ns if isinstance(a, Anomaly) else end_ns
        out.append(Symptom(a.code, a.source, a.t_ns, 1, strength, a.severity, a.value, a.text, end))
    return out


def merge(symptoms: list[Symptom]) -> list[Symptom]:
    """One symptom per code: the first one's onset and text, the strongest one's strength and value (its sign
    is the direction), the count of occurrences and the last end."""
    out: dict[str, Symptom] = {}
    for s in sorted(symptoms, key=lambda s: s.onset_ns):
        m = out.get(s.code)
        if m is None:
            out[s.code] = replace(s)
            continue
        if s.strength > m.strength or (s.strength == m.strength and abs(s.value) > abs(m.value)):
            m.strength, m.value = s.strength, s.value
        m.count += s.count
        m.end_ns = max(m.end_ns, s.end_ns)
    return sorted(out.values(), key=lambda s: s.onset_ns)


def split_cleared(symptoms: list[Symptom]) -> tuple[list[Symptom], list[Symptom]]:
    """(the incident's symptoms, transients over before it): symptoms in order of onset are cut into episodes;
    an episode before the last one that holds only relation anomalies, all back in their band, is over. An
    episode with any other kind of symptom (an alert, a PLC error, a frozen sensor) always stays: an event
    says nothing about the state having returned to normal."""
    episodes: list[list[Symptom]] = []
    last_ns = None
    for s in symptoms:
        if last_ns is None or s.onset_ns > last_ns + EPISODE_GAP_NS:
            episodes.append([])
            last_ns = s.end_ns
        episodes[-1].append(s)
        last_ns = max(last_ns, s.end_ns)
    cleared = [s for ep in episodes[:-1] if all(x.code.startswith("anomaly.relation.") for x in ep) for s in ep]
    return [s for s in symptoms if s not in cleared], cleared


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
        best = max(hits, key=lambda s: (s.belief, s.strength)) if hits else None
        seen = best.belief if best else 0.0  # a weak (sub-threshold) hit is partly seen, partly missing
        if best:
            cand.score += seen * w * (1.0 + best.strength)
            own += [s for s in hits if s.belief == 1.0]
            for s in hits:
                explained[s.code] = s
                if s.belief < 1.0:
                    cand.evidence.append(f"weak {s.code} ({s.belief:.0%} of the way to the threshold): {s.text}")
                else:
                    cand.evidence.append(f"seen {s.code} at {_ago(s.onset_ns, first_ns)}: {s.text}")
        if seen < 1.0 and d.expect == "required":
            cand.score -= (1.0 - seen) * 2.0 * w
            cand.missing.append(d.code)
            if not best:
                cand.evidence.append(f"missing {d.code} (required by this failure mode)")
        elif seen < 1.0 and d.expect == "likely":
            cand.score -= (1.0 - seen) * 0.5 * w
            cand.missing.append(d.code)
    for effect_id in mode.effects:
        for d in fmea.effect(effect_id).detections:
            for s in _hits(d, symptoms):
                if s.code not in explained:
                    explained[s.code] = s
                    cand.score += 0.3 * EXPECT_WEIGHT[d.expect] * s.strength * s.belief
                    cand.evidence.append(f"effect {effect_id}: {s.code} at {_ago(s.onset_ns, first_ns)}")
    unexplained = [s for s in symptoms if s.code not in explained]
    cand.score -= 1.5 * sum(s.strength * s.belief for s in unexplained)
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


def first_alert(symptoms: list[Symptom]) -> int | None:
    """The incident's first alert: its earliest symptom with a measured onset (a Granger anomaly's time is the
    start of the stretch it was tested on, a weak symptom's the time it was measured)."""
    timed = [s.onset_ns for s in symptoms if not s.code.startswith("anomaly.granger.") and s.belief == 1.0]
    return min(timed) if timed else (symptoms[0].onset_ns if symptoms else None)


def weak_symptoms(fmea: Fmea, window: SignalWindow | None, symptoms: list[Symptom],
                  settings: DetectorSettings) -> list[Symptom]:
    """Relations without a symptom that moved since the incident's first alert by more than half the detection
    threshold: belief rises linearly from 0 at half the threshold to 1 at the threshold."""
    if window is None or not len(window) or not symptoms:
        return []
    have = {s.code for s in symptoms}
    half = settings.z_threshold / 2
    out = []
    for sh in relation_shifts(fmea, window, first_alert(symptoms), settings):
        code = f"anomaly.relation.{sh.relation}"
        if code in have or abs(sh.z) <= half:
            continue
        belief = min(1.0, (abs(sh.z) - half) / half)
        rel = next(r for r in fmea.relations if r.name == sh.relation)
        out.append(Symptom(code, "anomaly", sh.t_ns, 1, min(1.0, 0.5 + abs(sh.z) / (8 * settings.z_threshold)),
                           "warning", sh.z, f"{rel.name} ({rel.text or rel.expr}) moved {sh.z:+.1f} sigma since the "
                           f"first alert (threshold {settings.z_threshold:g})", sh.t_ns, belief))
    return out


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
        window = window.select((window.t_ns >= start_ns) & (window.t_ns <= end_ns))
    anomalies = detect(fmea, window, inputs=inputs, replay=replay, settings=settings)
    symptoms = event_symptoms(events, start_ns, end_ns, settings.reference_fraction)
    symptoms += anomaly_symptoms(anomalies, settings.z_threshold, end_ns)
    symptoms.sort(key=lambda s: s.onset_ns)
    symptoms, cleared = split_cleared(symptoms)
    symptoms = merge(symptoms)
    symptoms += weak_symptoms(fmea, window, symptoms, settings)
    candidates: list[Candidate] = []
    if any(s.code not in CHANGE_CODES for s in symptoms):  # updates alone are no fault: nothing to attribute
        candidates = [score(c, m, fmea, symptoms) for c, m in fmea.failure_modes]
        top = max(c.score for c in candidates)
        weights = [math.exp(c.score - top) for c in candidates]
        total = sum(weights)
        for c, w in zip(candidates, weights):
            c.confidence = w / total
        candidates.sort(key=lambda c: -c.score)
    first = first_alert(symptoms)
    return Diagnosis(candidates, symptoms, start_ns, end_ns, first, (time.perf_counter() - t0) * 1e3, fmea, cleared)


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
