"""`sitsctl diagnose`: rank the likely root causes of what a running sitsd (or an events dump) saw.

Live: asks the daemon's control socket for its recent events and signal window (`events`), then
localizes here, off the daemon's threads, replaying the configured model for the model check.
Offline: `--events FILE` reads a dump written by `--dump`, `bench/rca.py --dump` or the daemon.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .errors import SitsError

DEFAULT_FMEA = Path(__file__).resolve().parents[1] / "examples" / "fmea" / "rolling-mill.yaml"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """`10m`, `90s`, `1.5h`, `500ms` or plain seconds -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 10m, 90s, 500ms or 1h")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[m.group(2)]


def register(sub) -> None:
    dg = sub.add_parser("diagnose", help="rank the likely root causes of recent alerts, with evidence",
                        description="Builds the causal graph from the FMEA file, the event stream (gate alerts, "
                        "PLC events, signer and update events) and statistics over the recent signals (relations, "
                        "stuck sensors, Granger tests, model replay), and ranks failure modes with a confidence.")
    dg.add_argument("--since", type=parse_duration, default=600.0, metavar="DURATION",
                    help="look back this far (e.g. 10m, 90s; default 10m; the daemon keeps the last 60 s of signals)")
    dg.add_argument("--format", choices=("text", "json", "dot", "png"), default="text")
    dg.add_argument("--output", type=Path, default=None, help="write here instead of stdout (png needs it)")
    dg.add_argument("--events", type=Path, default=None, help="diagnose this events dump instead of a running sitsd")
    dg.add_argument("--dump", type=Path, default=None, help="also save the events and signals read from the daemon")
    dg.add_argument("--fmea", type=Path, default=DEFAULT_FMEA, help="FMEA knowledge graph (default: the demo line's)")
    dg.add_argument("--config", type=Path, default=Path("/etc/sits2026/sitsd.yaml"),
                    help="the daemon's config: its control socket and model (for the replay check)")
    dg.add_argument("--socket", default=None, help="control socket path (instead of --config)")
    dg.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    dg.set_defaults(func=_cmd_diagnose)


def _replay_for(model_path: str | None, n_inputs: int, n_outputs: int):
    if not model_path:
        return None
    from ep.errors import ModelLoadError
    from ep.session import ModelRunner

    from .rca.detect import model_replay

    try:
        return model_replay(ModelRunner(model_path, n_inputs, n_outputs))
    except (ModelLoadError, OSError) as exc:
        print(f"sitsctl diagnose: model replay check skipped: {exc}", file=sys.stderr)
        return None


def _cmd_diagnose(args) -> int:
    from .rca import events as ev
    from .rca.errors import DiagnoseError
    from .rca.fmea import load_fmea
    from .rca.localize import localize
    from .rca.render import to_dot, to_json, to_png, to_text

    if args.format == "png" and args.output is None:
        raise DiagnoseError("--format png writes binary data: add --output FILE.png")
    fmea = load_fmea(args.fmea)
    meta: dict = {}
    if args.events is not None:
        events, window = ev.load(args.events)
        meta = window.meta if window is not None else {}
    else:
        from .cli import _socket_path
        from .control import request

        answer = request(_socket_path(args), "events", timeout_s=10.0, since_s=args.since)
        events = [ev.Event.from_dict(e) for e in answer["events"]]
        window = ev.SignalWindow.from_dict(answer["signals"]) if answer.get("signals") else None
        meta = {k: answer.get(k) for k in ("model", "inputs", "line", "now_ns")}
        if window is not None:
            window.meta = meta
        if args.dump is not None:
            ev.dump(args.dump, events, window)
    inputs = meta.get("inputs") or [n for n in fmea.signals if n != "mill_mode"]
    outputs = window.outputs if window is not None else ["command"]
    replay = _replay_for(meta.get("model"), len(inputs), len(outputs)) if window is not None else None
    end_ns = meta.get("now_ns")
    start_ns = int(end_ns - args.since * 1e9) if end_ns else None
    if start_ns is None and args.events is not None:
        times = [e.t_ns for e in events] + ([int(window.t_ns[-1])] if window is not None and len(window) else [])
        end_ns = max(times) if times else None
        start_ns = int(end_ns - args.since * 1e9) if end_ns else None
    if window is not None and len(window) and start_ns is not None:
        start_ns = max(start_ns, int(window.t_ns[0]))  # the reference starts where the signals start
    d = localize(fmea, events, window, start_ns=start_ns, end_ns=end_ns, inputs=inputs, replay=replay)
    if args.format == "png":
        data: bytes | str = to_png(d)
    else:
        data = {"text": to_text, "json": to_json, "dot": to_dot}[args.format](d)
    if args.output is not None:
        if isinstance(data, bytes):
            args.output.write_bytes(data)
        else:
            args.output.write_text(data if data.endswith("\n") else data + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(data)
    return 0


__all__ = ["register", "parse_duration", "SitsError"]
