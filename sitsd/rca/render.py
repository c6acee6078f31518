"""A diagnosis as text (read at a glance), JSON, Graphviz dot, or PNG (through the `dot` program).

The graph is the causal subgraph behind the top candidates: component -> failure mode -> effect ->
symptom, observed symptoms solid with their onset, expected-but-missing ones dashed grey; the top
cause is filled red.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime, timezone

from .errors import DiagnoseError
from .localize import Diagnosis

GRAPH_CANDIDATES = 3


def _clock(t_ns: int) -> str:
    return datetime.fromtimestamp(t_ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3] + "Z"


def to_text(d: Diagnosis, limit: int = 3) -> str:
    span = (d.end_ns - d.start_ns) / 1e9
    lines = [f"diagnosis of {d.fmea.line}: {span:.1f} s up to {_clock(d.end_ns)}, localized in {d.localize_ms:.1f} ms"]
    if not d.symptoms:
        lines.append("  no symptoms: every relation, sensor and gate looks like its reference; nothing to attribute")
        return "\n".join(lines)
    first = d.first_alert_ns if d.first_alert_ns is not None else d.symptoms[0].onset_ns
    for s in d.cleared:
        lines.append(f"cleared before the incident: {s.code} {(s.onset_ns - first) / 1e9:+.2f} s .. "
                     f"{(s.end_ns - first) / 1e9:+.2f} s  {s.text[:80]}")
    lines.append(f"symptoms (first alert at {_clock(first)}):")
    for s in d.symptoms:
        count = f" x{s.count}" if s.count > 1 else ""
        weak = f" (weak, {s.belief:.0%})" if s.belief < 1.0 else ""
        lines.append(f"  {(s.onset_ns - first) / 1e9:+7.2f} s  {s.code}{count}{weak}  {s.text[:100]}")
    lines.append("likely root causes:")
    if not d.candidates:
        lines.append("  none: only updates went live, no fault symptom to attribute")
    for rank, c in enumerate(d.candidates[:limit], 1):
        m = c.mode
        lines.append(f"  {rank}. {m.id:<26} {c.confidence * 100:5.1f}%  {m.name}  [{c.component.name}]  "
                     f"S{m.severity} O{m.occurrence} D{m.detection} RPN {m.rpn}")
        for ev in c.evidence[:6]:
            lines.append(f"       - {ev}")
        if rank == 1 and m.fix:
            lines.append(f"       fix: {m.fix}")
    return "\n".join(lines)


def to_json(d: Diagnosis) -> str:
    return json.dumps({"line": d.fmea.line, **d.as_dict()})


def _q(text: str) -> str:
    """A dot string; `\\n` in labels is meant as dot's line break, so only quotes are escaped."""
    return '"' + text.replace('"', "'") + '"'


def _wrap(text: str, width: int = 28) -> str:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    lines.append(cur)
    return "\\n".join(lines)


def to_dot(d: Diagnosis) -> str:
    out = ["digraph diagnosis {", '  rankdir=LR; newrank=true; nodesep=0.25; ranksep=0.6;',
           '  node [fontname="Helvetica", fontsize=11]; edge [fontname="Helvetica", fontsize=9, color="#555555"];',
           f'  labelloc=t; fontname="Helvetica"; fontsize=14; label={_q(_title(d))};']
    if not d.symptoms:
        out.append('  none [shape=note, label="no symptoms in the window"];')
        return "\n".join(out + ["}"]) + "\n"
    first = d.first_alert_ns if d.first_alert_ns is not None else d.symptoms[0].onset_ns
    seen = {s.code: s for s in d.symptoms}
    nodes: set[str] = set()
    edges: set[tuple[str, str]] = set()

    def edge(a: str, b: str, attrs: str = "") -> None:
        if (a, b) not in edges:
            edges.add((a, b))
            out.append(f"  {a} -> {b}" + (f" [{attrs}];" if attrs else ";"))

    def node(key: str, attrs: str) -> str:
        ident = _q(key)
        if key not in nodes:
            nodes.add(key)
            out.append(f"  {ident} [{attrs}];")
        return ident

    def symptom(code: str) -> str:
        s = seen.get(code)
        if s is None:
            return node("sym:" + code, f'shape=box, style="rounded,dashed", color="#999999", fontcolor="#999999", '
                                       f'label={_q(_wrap(code) + chr(10) + "(not seen)")}')
        label = f"{_wrap(code)}\\n{(s.onset_ns - first) / 1e9:+.2f} s" + (f"  x{s.count}" if s.count > 1 else "") + \
            (f"\\nweak ({s.belief:.0%})" if s.belief < 1.0 else "")
        fill = "#fde0c5" if s.onset_ns == first else "#fff4d6"
        return node("sym:" + code, f'shape=box, style="rounded,filled", fillcolor="{fill}", label={_q(label)}')

    top = d.candidates[:GRAPH_CANDIDATES]
    for rank, c in enumerate(top, 1):
        comp = node("comp:" + c.component.id, f'shape=component, style=filled, fillcolor="#e8eef7", '
                                              f'label={_q(_wrap(c.component.name, 22))}')
        style = ('style="filled,bold", fillcolor="#d7301f", fontcolor=white, penwidth=2' if rank == 1
                 else 'style=filled, fillcolor="#f2f2f2"')
        label = f"#{rank} {c.mode.id}\\n{_wrap(c.mode.name)}\\n{c.confidence * 100:.0f}% · RPN {c.mode.rpn}"
        mode = node("mode:" + c.mode.id, f"shape=box, {style}, label={_q(label)}")
        edge(comp, mode, "arrowhead=none")
        width = "2.2" if rank == 1 else "1"
        for det in c.mode.detections:
            hits = [s for s in d.symptoms if det.matches(s.code, s.severity, s.value)]
            if hits:
                for s in hits:
                    edge(mode, symptom(s.code), f"penwidth={width}, label={_q(det.expect)}")
            elif det.expect != "possible":
                edge(mode, symptom(det.code), 'style=dashed, color="#999999", label="expected"')
        for effect_id in c.mode.effects:
            eff = d.fmea.effect(effect_id)
            hits = [s for det in eff.detections for s in d.symptoms if det.matches(s.code, s.severity, s.value)]
            if not hits:
                continue
            e = node("eff:" + eff.id, f'shape=ellipse, style=filled, fillcolor="#eef7ea", label={_q(_wrap(eff.text, 24))}')
            edge(mode, e, f"penwidth={width}")
            for s in hits:
                edge(e, symptom(s.code))
    for s in d.symptoms:  # symptoms none of the top candidates explains still belong in the picture
        symptom(s.code)
    out.append("}")
    return "\n".join(out) + "\n"


def _title(d: Diagnosis) -> str:
    top = d.top
    head = f"{d.fmea.line}: most likely {top.mode.id} ({top.confidence * 100:.0f}%)" if top else d.fmea.line
    return f"{head}\\nwindow {(d.end_ns - d.start_ns) / 1e9:.0f} s up to {_clock(d.end_ns)}"


def to_png(d: Diagnosis) -> bytes:
    dot = shutil.which("dot")
    if dot is None:
        raise DiagnoseError("rendering a PNG needs Graphviz's `dot` program, which is not installed "
                            "(apt-get install graphviz); or use --format dot and render the file elsewhere")
    r = subprocess.run([dot, "-Tpng", "-Gdpi=110"], input=to_dot(d).encode(), capture_output=True, timeout=30)
    if r.returncode != 0:
        raise DiagnoseError(f"dot failed ({r.returncode}): {r.stderr.decode(errors='replace').strip()[:400]}")
    return r.stdout
