"""`sitsctl update`, `rollback` and `versions`: hot swap of a running daemon's modules, model and config
over its control socket (the daemon stages, prepares off its loop, swaps between two frames)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# How long `sitsctl update`/`rollback` wait for the daemon's answer. A model's bound proof runs inside the request
# (up to sitsd.hotswap.PROOF_TIMEOUT_S = 300 s), after a wait of up to PREP_QUEUE_S = 45 s for another update's
# preparation (then refused) and before the swap itself: the CLI waits longer, or it would report a timeout while
# the daemon goes on and swaps later. A literal, so that sitsctl
# does not import the hot-swap machinery; tests/sitsd/test_cli_update_errors.py keeps it above the proof timeout.
UPDATE_TIMEOUT_S = 360.0


def _socket(args) -> Path:
    if args.socket:
        return Path(args.socket)
    from .cli import parse_overrides
    from .config import load_config

    return Path(load_config(args.daemon_config, parse_overrides(args.set)).control.socket)


def _short(sha: str | None) -> str:
    return f"{sha[:16]}…" if sha else "-"


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def _check_update(args) -> str | None:
    """Why these `sitsctl update` options do not go together, or None."""
    if args.name is not None and not args.module:
        flag = "--model" if args.model else "--config"
        return (f"--name picks the loaded module that --module replaces; it does not apply to {flag} "
                f"(drop --name)")
    return None


def _check_rollback(args) -> str | None:
    """Why these `sitsctl rollback` options do not go together, or None."""
    if args.force and (args.module or args.model or args.config):
        flag = f"--module {args.module}" if args.module else "--model" if args.model else "--config"
        return (f"--force applies only to a whole-set rollback, not to {flag}: drop --force, or drop {flag} to "
                f"roll back the whole stage set")
    return None


def _cmd_update(args) -> int:
    from .control import request

    if args.module:
        what, params = f"module {args.module}", {"module": str(args.module.resolve()), "name": args.name}
    elif args.model:
        what, params = f"model {args.model}", {"model": str(args.model.resolve())}
    else:
        what, params = f"config {args.config}", {"config": str(args.config.resolve())}
    if args.sha256:
        params["sha256"] = args.sha256
    if not args.json:
        print(f"staging {what}: verify hash, prepare off the loop (compile, self-test"
              f"{', bound proof' if args.model else ''}), swap between two frames ...", flush=True)
    answer = request(_socket(args), "update", timeout_s=args.timeout, **{k: v for k, v in params.items() if v})
    answer.pop("ok", None)
    if args.json:
        print(json.dumps(answer))
        return 0
    if answer.get("component") == "config":
        print(f"config {answer['name']} applied live (sha256 {_short(answer['sha256'])}); changed: "
              f"{', '.join(answer.get('changed') or []) or 'nothing'}")
    else:
        print(f"swapped {answer['component']} {answer['name']} sha256 {_short(answer['sha256'])}")
        if "module" in answer:
            m = answer["module"]
            print(f"  version {m['version']}, {m['origin']}, golden vectors passed")
        if answer.get("bounds"):
            print("  " + answer["bounds"].replace("\n", "\n  "))
        print(f"  prepare {answer['prepare_ms']:.2f} ms (total {answer['total_ms']:.1f} ms), generation "
              f"{answer['previous_generation']} -> {answer['generation']}, first frame on the new version: "
              f"{answer['swap_frame'] if answer['swap_frame'] >= 0 else 'none yet (no frames arriving)'}")
        prev = answer.get("previous")
        if prev:
            print(f"  previous kept for rollback: {prev.get('name', prev.get('model'))} sha256 {_short(prev.get('sha256'))}"
                  " (sitsctl rollback)")
    if answer.get("pcr"):  # the log's value after the command (nothing new is measured for the same config bytes)
        print(f"  measurement PCR value now {_short(answer['pcr'])}")
    return 0


def _cmd_rollback(args) -> int:
    from .control import request

    params = ({"module": args.module} if args.module else {"model": True} if args.model
              else {"config": True} if args.config else {"force": True} if args.force else {})
    answer = request(_socket(args), "rollback", timeout_s=args.timeout, **params)
    answer.pop("ok", None)
    if args.json:
        print(json.dumps(answer))
        return 0
    if answer["component"] == "config":
        print(f"rolled back the config to {answer['config']} (sha256 {_short(answer['sha256'])}): changed "
              f"{', '.join(answer['changed']) or 'nothing live'}"
              f"{'; ' + answer['proof'] if answer.get('proof') else ''}")
        return 0
    print(f"rolled back {answer['component']} to {answer['name']} sha256 {_short(answer['sha256'])}: generation "
          f"{answer['previous_generation']} -> {answer['generation']}, first frame {answer['swap_frame']}")
    return 0


def _cmd_versions(args) -> int:
    from .control import request

    answer = request(_socket(args), "versions")
    answer.pop("ok", None)
    if args.json:
        print(json.dumps(answer))
        return 0
    cur = answer["current"]
    print(f"current stage set: generation {cur['generation']} ({cur['label']}), {cur['frames']} frames, "
          f"model {cur['model']} sha256 {_short(cur['model_sha256'])}")
    lp = answer.get("loop", {})
    ticker = lp.get("epoch_ticker")
    parts = [f"epoch ticker {'native' if ticker.get('native') else 'Python thread'}" if ticker else None,
             f"signature {lp['sign_path']}" if lp.get("sign_path") else None,
             f"model run {lp['model_run_path']}" if lp.get("model_run_path") else None]
    if any(parts):  # what keeps the GIL through a frame (docs/hotswap.md, "The loop keeps the GIL through its frame")
        print("loop call paths: " + "; ".join(p for p in parts if p))
    for stage in ("pre", "post"):
        m = cur.get(stage)
        if m:
            print(f"  {stage:<5}{m['name']} v{m['version']} sha256 {_short(m['sha256'])} ({m['path']})")
    print(f"{'module version':<40}{'stage':>6}{'frames':>10}{'traps':>7}")
    for key, m in answer["modules"].items():
        print(f"{key + ' v' + str(m['version']):<40}{m['stage']:>6}{m['frames']:>10}{m['traps']:>7}")
    for sha, frames in answer["models"].items():
        print(f"model {_short(sha):<34}{'':>6}{frames:>10}")
    for h in answer["history"]:
        print(f"  {h['action']:<9}{h['component']:<12}{h['name']:<22}generation {h['previous_generation']} -> "
              f"{h['generation']} at frame {h['swap_frame']}{'  (' + h['reason'] + ')' if h['reason'] else ''}")
    return 0


def register(sub) -> None:
    """Adds `update` and `rollback` to sitsctl's subcommands."""
    for name, help_text, func, check in (
            ("update", "hot-swap a WASM module, the model or the config of a running sitsd, without losing a frame",
             _cmd_update, _check_update),
            ("rollback", "swap back to the version that ran before the last update (kept loaded)", _cmd_rollback,
             _check_rollback),
            ("versions", "the running stage set, per-version frame counters and the recent swaps", _cmd_versions,
             None)):
        p = sub.add_parser(name, help=help_text, description=help_text + ". See docs/hotswap.md.")
        p.add_argument("--daemon-config", type=Path, default=Path("/etc/sits2026/sitsd.yaml"),
                       help="the running daemon's config, to find its control socket")
        p.add_argument("--socket", default=None, help="control socket path (instead of --daemon-config)")
        p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a field of --daemon-config")
        p.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
        if check is not None:
            p.add_argument("--timeout", type=_positive_seconds, default=UPDATE_TIMEOUT_S, metavar="SECONDS",
                           help=f"how long to wait for the daemon's answer (default {UPDATE_TIMEOUT_S:g} s, above "
                                "the model's bound-proof timeout); after a timeout the swap may still land: "
                                "check with `sitsctl versions`")
        if name == "update":
            what = p.add_mutually_exclusive_group(required=True)
            what.add_argument("--module", type=Path, help="a .wat/.wasm module with <stem>.golden.json next to it")
            what.add_argument("--model", type=Path, help="an ONNX file or a `sitsctl compile` artifact directory")
            what.add_argument("--config", type=Path, help="a config file: its live sections are applied")
            p.add_argument("--name", default=None, help="which loaded module --module replaces (default: same file name)")
            p.add_argument("--sha256", default=None, help="refuse unless the module/model has this SHA-256")
        elif name == "rollback":
            what = p.add_mutually_exclusive_group()
            what.add_argument("--module", metavar="NAME", help="roll back only this module")
            what.add_argument("--model", action="store_true", help="roll back only the model")
            what.add_argument("--config", action="store_true",
                              help="back to the config that ran before the last `update --config` (its rules proven "
                              "for the running model first; again: forward to the newer one)")
            p.add_argument("--force", action="store_true",
                           help="whole-set rollback only: run the previous set even when it is the one an automatic "
                                "rollback just left (it trapped, sent fail-safes or the PLC refused it); refused "
                                "without --force")
        p.set_defaults(func=func if check is None else _checked(p, check, func))


def _checked(parser: argparse.ArgumentParser, check, func):
    """`func`, run only when `check` finds nothing wrong with the options; else an argparse usage error (exit 2)."""

    def run(args) -> int:
        problem = check(args)
        if problem:
            parser.error(problem)
        return func(args)

    return run
