"""`sitsctl measurements verify [DIR] [--json] [--tpm]`: check the PCR 23 measurement log and its archives.

sitsd keeps the log of the measurement PCR (attestation/measurement.py) as `measurements.jsonl` in the audit directory.
A compaction archives it as `measurements-compacted-<ns>.jsonl` and starts the new log with a `compacted <archive
name> <SHA-256 of the archive>` event followed by what ran (model, module per stage, config); a TPM reset archives it
as `measurements-before-tpm-reset-<ns>.jsonl` and starts a new log with no link to it. This command checks, for every
one of those files:

- it replays: each event's digest follows from its fields and its pcr_after from the header's initial value and the
  events before it (a failure names the file and the event index);
- a log that begins with `compacted` starts at zero (the PCR was reset), names an archive that exists in DIR and whose
  SHA-256 is the one recorded (a deleted or modified archive is named), and carries over exactly the state
  (measured_state: model, modules per stage, config) of that archive; `compacted` appears only as the first event;
- the chain from the current log back to the oldest archive it reaches is complete.

Archives before a TPM reset and compacted archives no log links to (an earlier run of sitsd: every start begins a new
log) are listed as not linked and checked on their own, never failed for not being linked. With `--tpm`, PCR 23 read
from the TPM must equal the current log's replay. Exit 0: all checks hold; 1: a check failed; 2: usage, or the
directory or a file cannot be read.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

CURRENT = "measurements.jsonl"
_ARCHIVE = re.compile(r"^measurements-(compacted|before-tpm-reset)-(\d+)\.jsonl$")
ZERO_HEX = "00" * 32


@dataclass
class LogFile:
    path: Path
    role: str  # "current", "compacted" (a compaction's archive) or "tpm-reset" (archived at a TPM reset)
    ns: int | None = None
    header: dict | None = None
    events: list = field(default_factory=list)
    value: str | None = None  # the replayed PCR value (hex), None when it does not replay
    linked_from: str | None = None  # the log whose `compacted` event names this archive

    @property
    def name(self) -> str:
        return self.path.name

    def entries(self) -> list[tuple[str, str, str]]:
        return [(e.kind, e.name, e.sha256) for e in self.events]


@dataclass
class Report:
    directory: Path
    files: list[LogFile]
    failures: list[dict]  # {"file", "event" (index or None), "reason"}
    chain: list[str]  # oldest archive ... current log
    unlinked: list[dict]  # {"file", "why"}
    tpm: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, file: str, reason: str, event: int | None = None) -> None:
        self.failures.append({"file": file, "event": event, "reason": reason})

    def to_json(self) -> dict:
        current = next((f for f in self.files if f.role == "current"), None)
        return {"ok": self.ok, "directory": str(self.directory),
                "files": [{"file": f.name, "role": f.role, "events": len(f.events), "value": f.value,
                           "linked_from": f.linked_from} for f in self.files],
                "events": sum(len(f.events) for f in self.files), "compactions": self.compactions,
                "tpm_resets": sum(1 for f in self.files if f.role == "tpm-reset"),
                "chain": self.chain, "unlinked": self.unlinked, "failures": self.failures,
                "current": _current_json(current), "tpm": self.tpm}

    @property
    def compactions(self) -> int:
        return sum(1 for f in self.files if f.events and f.events[0].kind == "compacted")


class Unreadable(Exception):
    """The directory or a file cannot be read at all (exit 2)."""


def _current_json(current: LogFile | None) -> dict | None:
    from attestation.measurement import measured_state

    if current is None:
        return None
    state = measured_state(current.entries())
    return {"file": current.name, "events": len(current.events), "value": current.value,
            "pcr": (current.header or {}).get("pcr"), "mode": (current.header or {}).get("mode"),
            "model": list(state.model) if state.model else None,
            "modules": {stage: list(m) for stage, m in state.modules.items()},
            "config": list(state.config) if state.config else None}


def _load(f: LogFile, report: Report) -> None:
    """Read and replay one file; failures are recorded in `report` (OSError: Unreadable)."""
    from attestation.measurement import FORMAT, MeasurementError, MeasurementEvent, replay

    try:
        lines = f.path.read_text().splitlines()
    except OSError as exc:
        raise Unreadable(f"{f.path}: {exc}") from None
    except UnicodeError as exc:
        report.fail(f.name, f"not UTF-8 text ({exc})")
        return
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        report.fail(f.name, f"not a measurement log: no {FORMAT} header")
        return
    f.header = header
    for i, line in enumerate(lines[1:]):
        if not line.strip():
            continue
        try:
            f.events.append(MeasurementEvent(**json.loads(line)))
        except (ValueError, TypeError) as exc:
            report.fail(f.name, f"line {i + 2} is not a measurement event ({exc})", len(f.events))
            return
    try:
        initial = bytes.fromhex(header["initial"])
        if len(initial) != 32:
            raise ValueError("not 32 bytes")
    except (KeyError, TypeError, ValueError) as exc:
        report.fail(f.name, f"header's initial PCR value is not a SHA-256 value ({exc})")
        return
    for i, e in enumerate(f.events):
        if e.index != i:
            report.fail(f.name, f"recorded index {e.index} where event {i} belongs (events missing or reordered)", i)
            return
    try:
        f.value = replay(f.events, initial).hex()
    except MeasurementError as exc:
        m = re.match(r"event (\d+) ", str(exc))
        report.fail(f.name, str(exc), int(m.group(1)) if m else None)


def _check_link(f: LogFile, by_name: dict[str, LogFile], report: Report) -> LogFile | None:
    """A log that begins with `compacted`: the archive it names, checked (existence, SHA-256, carried state)."""
    from attestation.measurement import COMPACTED_KIND, carried_entries, measured_state

    for i, e in enumerate(f.events[1:], 1):
        if e.kind == COMPACTED_KIND:
            report.fail(f.name, f"a `{COMPACTED_KIND}` event at index {i}: compaction only starts a log", i)
    if not f.events or f.events[0].kind != COMPACTED_KIND:
        return None
    link = f.events[0]
    if f.header is not None and f.header.get("initial") != ZERO_HEX:
        report.fail(f.name, f"begins with `{COMPACTED_KIND}` but its initial PCR value is not zero (a compaction "
                    "resets the PCR)", 0)
    archive = by_name.get(link.name)
    if archive is None or "/" in link.name:
        report.fail(f.name, f"its `{COMPACTED_KIND}` event names archive {link.name}, which is missing from "
                    f"{report.directory} (deleted or moved): the chain is broken", 0)
        return None
    if archive.linked_from is not None:
        report.fail(f.name, f"archive {link.name} is named by {archive.linked_from} as well", 0)
    archive.linked_from = f.name
    try:
        digest = hashlib.sha256(archive.path.read_bytes()).hexdigest()
    except OSError as exc:
        raise Unreadable(f"{archive.path}: {exc}") from None
    if digest != link.sha256:
        report.fail(archive.name, f"modified: its SHA-256 is {digest[:16]}…, the `{COMPACTED_KIND}` event of "
                    f"{f.name} recorded {link.sha256[:16]}…")
    elif archive.header is not None and archive.value is not None:
        expected = carried_entries(measured_state(archive.entries()))
        got = f.entries()[1:1 + len(expected)]
        if got != expected:
            want, have = measured_state(expected), measured_state(got)
            diffs = [f"{what}: archive says {a}, carried {b}" for what, a, b in
                     (("model", want.model, have.model), ("modules", want.modules, have.modules),
                      ("config", want.config, have.config)) if a != b] or ["the events are not in compaction order"]
            first = next((i for i, (a, b) in enumerate(zip(got, expected), 1) if a != b), len(got) + 1)
            report.fail(f.name, f"the state carried over by compaction is not measured_state() of {archive.name}: "
                        + "; ".join(diffs), first)
    return archive


def verify_directory(directory: Path) -> Report:
    """All the checks (module docstring); Unreadable when DIR or a file cannot be read."""
    directory = Path(directory)
    if not directory.is_dir():
        raise Unreadable(f"{directory} is not a directory")
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError as exc:
        raise Unreadable(f"{directory}: {exc}") from None
    files: list[LogFile] = []
    for name in names:
        m = _ARCHIVE.match(name)
        if m:
            files.append(LogFile(directory / name, "compacted" if m.group(1) == "compacted" else "tpm-reset",
                                 int(m.group(2))))
    files.sort(key=lambda f: f.ns)
    report = Report(directory, files, [], [], [])
    if CURRENT in names:
        files.append(LogFile(directory / CURRENT, "current"))
    elif not files:
        raise Unreadable(f"no {CURRENT} nor measurement archives in {directory}")
    else:
        report.fail(CURRENT, f"missing from {directory} (archives are there)")
    for f in files:
        _load(f, report)
    by_name = {f.name: f for f in files if f.role != "current"}
    links = {f.name: _check_link(f, by_name, report) for f in files}
    # the chain: from the current log back through the archives each log's first event names
    current = next((f for f in files if f.role == "current"), None)
    chain, seen, node = [], set(), current
    while node is not None and node.name not in seen:
        seen.add(node.name)
        chain.append(node.name)
        node = links.get(node.name)
    report.chain = chain[::-1]
    # the rest: TPM-reset archives (no event links them) and what they reach, then archives of earlier runs
    for f in files:
        if f.name in seen or f.role != "tpm-reset":
            continue
        node, reached = f, []
        while node is not None and node.name not in seen:
            seen.add(node.name)
            reached.append(node.name)
            node = links.get(node.name)
        report.unlinked.append({"file": f.name, "why": "before a TPM reset (not linked)", "chain": reached[::-1]})
    for f in files:
        if f.name not in seen and f.linked_from is None:
            node, reached = f, []
            while node is not None and node.name not in seen:
                seen.add(node.name)
                reached.append(node.name)
                node = links.get(node.name)
            report.unlinked.append({"file": f.name, "why": "no later log links it (an earlier run of sitsd: each "
                                    "start begins a new log)", "chain": reached[::-1]})
    return report


def _read_pcr(args, pcr: int) -> bytes | int:
    """--tpm: PCR `pcr` read through a bounded connection of our own (sitsd.audit_anchor.OwnTpm); an exit status
    after an error was printed."""
    from .config import CLI_OVERRIDES

    tcti = CLI_OVERRIDES.get("attestation.tcti")
    if not tcti and (args.config.exists() or args.set):
        from .cli import parse_overrides
        from .config import load_config

        tcti = load_config(args.config, parse_overrides(args.set)).attestation.tcti
    if not tcti:
        print("sitsctl measurements verify --tpm: which TPM? give --tcti STRING (or SITS_TCTI), or --config with "
              "attestation.tcti", file=sys.stderr)
        return 2
    from attestation.measurement import TpmPcr

    from .audit_anchor import AnchorTpmError, OwnTpm

    conn = None
    try:
        conn = OwnTpm(tcti)
        return TpmPcr(conn.esapi, pcr, conn.lock).read()
    except Exception as exc:  # AnchorTpmError, TpmError (bounded call timed out), TSS2_Exception
        kind = "" if isinstance(exc, AnchorTpmError) else f"{type(exc).__name__}: "
        print(f"sitsctl measurements verify --tpm: reading PCR {pcr} failed: {kind}{exc} (with swtpm, stop sitsd "
              "first: it holds the only connection)", file=sys.stderr)
        return 2
    finally:
        if conn is not None:
            conn.close()


def _print(report: Report) -> None:
    files = report.files
    events = sum(len(f.events) for f in files)
    resets = sum(1 for f in files if f.role == "tpm-reset")
    print(f"{report.directory}: {len(files)} measurement log file(s), {events} events, "
          f"{report.compactions} compaction(s), {resets} TPM reset(s)")
    for f in files:
        status = "replays" if f.value is not None else "DOES NOT REPLAY"
        link = f" -> {f.events[0].name}" if f.events and f.events[0].kind == "compacted" else ""
        print(f"  {f.name}: {f.role}, {len(f.events)} events, {status}"
              + (f" to {f.value[:16]}…" if f.value else "") + link)
    if report.chain:
        print("chain (oldest to current): " + " -> ".join(report.chain))
    for u in report.unlinked:
        print(f"  {u['file']}: {u['why']}" + (f"; reaches {' -> '.join(u['chain'])}" if len(u["chain"]) > 1 else ""))
    cur = _current_json(next((f for f in files if f.role == "current"), None))
    if cur is not None:
        print(f"what runs now ({cur['file']}, PCR {cur['pcr']} {str(cur['value'] or '?')[:16]}…):")
        print(f"  model   {cur['model'][0]} {cur['model'][1][:16]}…" if cur["model"] else "  model   (none named)")
        for stage, (name, sha) in cur["modules"].items():
            print(f"  module  {stage}: {name} {sha[:16]}…")
        print(f"  config  {cur['config'][0]} {cur['config'][1][:16]}…" if cur["config"] else "  config  (none named)")
    if report.tpm is not None:
        t = report.tpm
        print(f"TPM PCR {t['pcr']}: {t['value'][:16]}… " + ("= the current log's replay" if t["matches"] else
              f"!= the current log's replay {str(t['log_value'])[:16]}…"))
    for fl in report.failures:
        where = f" event {fl['event']}" if fl["event"] is not None else ""
        print(f"FAILED {fl['file']}{where}: {fl['reason']}")
    print("measurement logs verified" if report.ok else f"{len(report.failures)} check(s) failed")


def _cmd_measurements(args) -> int:
    from .cli import load_audit_dir

    directory = args.path if args.path is not None else Path(load_audit_dir(args))
    try:
        report = verify_directory(directory)
    except Unreadable as exc:
        print(f"sitsctl measurements verify: {exc}", file=sys.stderr)
        return 2
    if args.tpm:
        current = next((f for f in report.files if f.role == "current"), None)
        if current is None or current.header is None:
            report.fail(CURRENT, "--tpm: no current log to compare with the TPM")
        else:
            pcr = int(current.header.get("pcr", 23))
            value = _read_pcr(args, pcr)
            if isinstance(value, int):
                return value
            matches = current.value is not None and value.hex() == current.value
            report.tpm = {"pcr": pcr, "value": value.hex(), "log_value": current.value, "matches": matches}
            if not matches:
                report.fail(CURRENT, f"PCR {pcr} in the TPM is {value.hex()[:16]}…, the log replays to "
                            f"{str(current.value)[:16]}…: the log does not explain the PCR (damaged, another writer, "
                            "or the log is not the running sitsd's)")
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        _print(report)
    return 0 if report.ok else 1


HELP = "check the PCR 23 measurement log and its archives (replay, compaction links, carried state, --tpm)"
DESCRIPTION = (
    "verify: checks measurements.jsonl and every measurements-compacted-*.jsonl and "
    "measurements-before-tpm-reset-*.jsonl in DIR (default: audit.directory of --config). Each file must replay: every "
    "event's digest from its fields and its pcr_after from the header's initial value. A log that begins with a "
    "`compacted` event must name an archive that exists with the recorded SHA-256, and carry over exactly that "
    "archive's state (newest model, module per stage, config); so the chain from the oldest archive to the current "
    "log is complete. Archives from before a TPM reset (no event links them) and of earlier runs are listed as not "
    "linked and checked on their own. --tpm also compares PCR 23 read from the TPM with the current log's replay. "
    "Prints the files, events, compactions, TPM resets and what runs now. Exit 0: all hold; 1: a check failed (the "
    "file and event index are named); 2: usage, or DIR or a file cannot be read.")


def register(sub) -> None:
    ms = sub.add_parser("measurements", help=HELP, description=DESCRIPTION)
    ms.add_argument("action", choices=("verify",))
    ms.add_argument("path", nargs="?", type=Path, metavar="DIR",
                    help="the directory of measurements.jsonl (default: audit.directory of --config)")
    ms.add_argument("--config", type=Path, default=Path("/etc/sits2026/sitsd.yaml"))
    ms.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    ms.add_argument("--json", action="store_true", help="print one JSON object (ok, files, chain, failures, current)")
    ms.add_argument("--tpm", action="store_true",
                    help="also read PCR 23 from the TPM (--tcti or SITS_TCTI, else attestation.tcti of --config) and "
                    "compare it with the current log's replay; with swtpm, stop sitsd first")
    ms.set_defaults(func=_cmd_measurements)
