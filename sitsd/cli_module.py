"""`sitsctl build-module`: a module's WAT source -> the `.wasm` binary an operator signs and deploys.

The host reads `.wat` directly (wasmtime's own parser, sitsd/wasm/module.py `read_source`), so a binary is only
needed where the signed file should be the very bytes that are compiled: a signed `.wasm` is checked by the hash of
those bytes (sitsd/hotswap.py `prepare_module`). Binaries are built, never committed (wasm_modules/README.md).

The build converts with the same parser the host uses, then checks what the host will check at load, before
writing anything: the exports and header of wasm_modules/ABI.md (in a WasmHost, under the default limits), the
module's `selftest`, and its golden vectors (`<stem>.golden.json` next to the WAT), which are copied next to the
`.wasm` where it goes elsewhere (the host looks for them there).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

PROG = "sitsctl build-module"
DESCRIPTION = """\
Builds the .wasm binary of a WASM module from its WAT source, for an operator who wants to sign and deploy the
binary itself (sitsd also loads .wat directly: a binary is never needed to run a module). It converts with
wasmtime's WAT parser (the one sitsd uses for .wat), checks what sitsd checks at load: the exports memory,
process, version and selftest and the header of wasm_modules/ABI.md, the module's selftest, and its golden vectors
(<stem>.golden.json next to the WAT), and only then writes the .wasm. It prints the binary's SHA-256 (the module's
identity in `sitsctl versions`, the measurement log and modules[].sha256 pins), its version, and what to do next:
sign it (`sitsctl sign`), then `sitsctl update --module` it or put it in the config and `sitsctl deploy`."""
EPILOG = """\
examples:
  sitsctl build-module pre_filter.wat                                writes pre_filter.wasm next to it
  sitsctl build-module wasm_modules/pre_filter.wat -o build/pre_filter.wasm   ... and build/pre_filter.golden.json
  sitsctl build-module pre_filter.wat --json                         the result as one JSON object

exit status: 0 built; 1 the module builds but sitsd would refuse it (ABI, selftest, golden vectors), nothing
written; 2 it cannot be built (missing file, WAT syntax, invalid wasm, output not writable), nothing written."""

_WAT_POSITION = re.compile(r"<anon>:(\d+):(\d+)")


class BuildError(Exception):
    """Why the module was not built; `status` is the exit status (1: refused by the host checks, 2: no build)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def wat_error(path: Path, text: str, exc: Exception) -> str:
    """wasmtime's parse error as `FILE:LINE:COLUMN: what`, with the offending line and a caret under the column."""
    message = str(exc)
    what = message.splitlines()[0].strip() if message else type(exc).__name__
    m = _WAT_POSITION.search(message)
    if not m:
        return f"{path}: not valid WAT: {what}"
    line, col = int(m.group(1)), int(m.group(2))
    lines = text.splitlines()
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    return (f"{path}:{line}:{col}: not valid WAT: {what}\n"
            f"    {src}\n    {' ' * (col - 1)}^\n"
            "fix the source there and build again")


def wasmtime_reason(exc: Exception) -> str:
    """wasmtime's first line and its innermost cause (`failed to compile: wasm[0]::function[0]` alone says
    nothing; the cause says `type mismatch: expected i32, found i64` and where in the binary)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    cause = re.sub(r"^\d+:\s*", "", lines[-1])
    return lines[0] if len(lines) == 1 else f"{lines[0]}: {cause}"


def build_module(source: Path, output: Path | None = None) -> dict:
    """Converts, checks and writes; returns what was built (see `_cmd_build_module`). Raises BuildError."""
    import wasmtime

    from attestation.signatures import SignatureError, load as load_signature
    from .wasm import Limits, ModuleInstance, WasmError, WasmHost, golden_path, run_golden

    source = Path(source)
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        raise BuildError(f"{source}: no such file; pass the module's WAT source (e.g. wasm_modules/pre_filter.wat)") from None
    except OSError as exc:
        raise BuildError(f"{source}: cannot read it ({exc.strerror})") from None
    if data.startswith(b"\0asm"):
        raise BuildError(f"{source}: already a wasm binary; build-module takes the WAT source it was made from")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise BuildError(f"{source}: not a text file (byte {exc.start} is not UTF-8); pass the module's WAT source") from None
    try:
        wasm = bytes(wasmtime.wat2wasm(text))
    except wasmtime.WasmtimeError as exc:
        raise BuildError(wat_error(source, text, exc)) from None
    output = Path(output) if output is not None else source.with_suffix(".wasm")
    if output.suffix != ".wasm":
        raise BuildError(f"-o {output}: the binary's name must end in .wasm (sitsd and `sitsctl sign` tell a module "
                         "by its suffix)")
    if output.resolve() == source.resolve():
        raise BuildError(f"-o {output}: that is the source itself; pick another output")
    sha = hashlib.sha256(wasm).hexdigest()
    label = f"module {output.stem} ({source.name} -> {output.name}, sha256 {sha[:12]})"

    src_golden, out_golden = golden_path(source), golden_path(output)
    golden = None
    if src_golden.exists():
        try:
            golden = json.loads(src_golden.read_text())
            if not golden["steps"]:
                raise ValueError("no steps")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BuildError(f"{label}: golden vectors {src_golden} unreadable: {exc}; wasm_modules/ABI.md "
                             "('Golden vectors') shows their format", 1) from None
    copy_golden = golden is not None and out_golden.resolve() != src_golden.resolve()
    if copy_golden and out_golden.exists() and out_golden.read_bytes() != src_golden.read_bytes():
        raise BuildError(f"{out_golden} exists and differs from {src_golden}, the golden vectors this build checks; "
                         "sitsd would check the .wasm against it. Remove it or pick another -o")

    with tempfile.TemporaryDirectory(prefix="sitsctl-build-module-") as tmp:
        # the daemon's engine settings and epoch ticker; a throw-away cache directory (and key) of its own, never
        # used: the build compiles without the .cwasm cache and touches no daemon's
        host = WasmHost(Path(tmp) / "wasm", limits=Limits())
        try:
            try:
                module = wasmtime.Module(host.engine, wasm)
            except wasmtime.WasmtimeError as exc:  # wasmtime's validation: types, stack, indices
                raise BuildError(f"{label}: wasmtime refuses it: {wasmtime_reason(exc)}; fix the source and build "
                                 "again") from None
            try:
                inst = ModuleInstance(host, module, label, host.limits)
                if golden is not None:
                    run_golden(inst, golden, label)
                else:
                    code = inst.selftest()
                    if code:
                        raise BuildError(f"{label}: its selftest export returned {code} (parameter block refused; "
                                         "see the module source for the codes)", 1)
            except WasmError as exc:
                raise BuildError(str(exc), 1) from None
            version, abi_version, n_in, n_out = inst.version, inst.abi, inst.n_in, inst.n_out
        finally:
            host.close()

    warnings = []
    if golden is None:
        warnings.append(f"no golden vectors at {src_golden}: only selftest was run, and sitsd refuses to load a "
                        f"module without them; write {src_golden.name} (wasm_modules/ABI.md, 'Golden vectors') and "
                        f"put it next to {output.name} as {out_golden.name}")
    try:
        old_sig = load_signature(output)
    except SignatureError:
        old_sig = None
    if old_sig is not None and old_sig.sha256 != sha:
        warnings.append(f"{output.name}.sig signs other bytes (sha256 {old_sig.sha256[:16]}…): sign the new binary")
    tmp_out = output.with_name(f".{output.name}.tmp{os.getpid()}")
    made_golden = False
    try:  # whole or not at all: a reader (`sitsctl sign`, a copy) never sees half a binary
        output.parent.mkdir(parents=True, exist_ok=True)
        if copy_golden and not out_golden.exists():  # first: a binary is never left without its golden vectors
            out_golden.write_bytes(src_golden.read_bytes())
            made_golden = True
        tmp_out.write_bytes(wasm)
        os.replace(tmp_out, output)
    except OSError as exc:
        tmp_out.unlink(missing_ok=True)
        if made_golden:  # nothing written: not the golden vectors either
            out_golden.unlink(missing_ok=True)
        raise BuildError(f"{exc.filename or output}: cannot write it ({exc.strerror}); pick another -o") from None

    nxt = [f"sitsctl sign --authority-key authority.key.pem {output}   (on the signing host: writes "
           f"{output.name}.sig)",
           f"copy {output.name}, {output.name}.sig and {out_golden.name} to the device, into one directory",
           f"sitsctl update --module {output.name} --name NAME --daemon-config CONFIG   (hot swap, between "
           "two frames, of the loaded module NAME: its modules[].name in the running config)",
           f"or point modules[].path at {output.name} (pin modules[].sha256: {sha}) and `sitsctl deploy --config "
           "CONFIG` (sign the config too under attestation.require_signatures: all)"]
    return {"source": str(source), "wasm": str(output), "sha256": sha, "bytes": len(wasm), "stem": output.stem,
            "version": version, "abi": abi_version, "n_in": n_in, "n_out": n_out,
            "golden": ({"path": str(src_golden), "steps": len(golden["steps"]),
                        "tolerance": float(golden.get("tolerance", 1e-12)),
                        "copied_to": str(out_golden) if copy_golden else None} if golden is not None else None),
            "warnings": warnings, "next": nxt}


def _cmd_build_module(args) -> int:
    try:
        result = build_module(args.source, args.output)
    except BuildError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc), "status": exc.status}))
        return exc.status
    if args.json:
        print(json.dumps({"ok": True, **result}))
        return 0
    g = result["golden"]
    print(f"built {result['wasm']} from {result['source']} ({result['bytes']} bytes)")
    print(f"  sha256   {result['sha256']}")
    print(f"  version  {result['version']} (ABI {result['abi']}, {result['n_in']} inputs -> {result['n_out']} outputs)")
    print("  ABI      exports memory, process, version, selftest as wasm_modules/ABI.md asks; selftest 0")
    if g is not None:
        print(f"  golden   {g['steps']} steps of {g['path']} reproduced (tolerance {g['tolerance']:g})"
              + (f"; copied to {g['copied_to']}" if g["copied_to"] else ""))
    for w in result["warnings"]:
        print(f"  warning  {w}")
    print("next:")
    for step in result["next"]:
        print(f"  {step}")
    return 0


def register(sub) -> None:
    """Adds `build-module` to sitsctl's subcommands."""
    bm = sub.add_parser("build-module", help="build a WASM module's .wasm from its WAT source, checked against "
                        "the ABI and its golden vectors, for signing and deployment",
                        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    bm.add_argument("source", type=Path, metavar="WAT",
                    help="the module's WAT source (e.g. wasm_modules/pre_filter.wat)")
    bm.add_argument("-o", "--output", type=Path, default=None, metavar="OUT.wasm",
                    help="where to write the binary (default: the WAT's path with .wasm); the golden vectors are "
                    "copied next to it as OUT.golden.json, where sitsd looks for them")
    bm.add_argument("--json", action="store_true", help="print the result (or the error) as one JSON object")
    bm.set_defaults(func=_cmd_build_module)
