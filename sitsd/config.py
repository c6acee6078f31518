"""The config's one loader: YAML in, frozen typed objects out (the section models are in sitsd.schema).

Errors name the file, the field (dotted path) and its line, and say what is expected.
Relative paths in the file are resolved against the file's directory.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError

from .errors import ConfigError
from .schema import (_ADDRESS_FIELDS, _TRANSPORT_KINDS, Actuator, AttestationSection, AuditSection, Condition,
                     ControlSection, LinearConstraint, LoggingSection, MetricsSection, ModelSection, Module,
                     OpcUaSubscriptionTransport, PlcSection, ProofSection, PtpSection, RuntimeSection, SafetySection, Signal,
                     TimingSection, TransportSection, UadpEthTransport, UadpUdpTransport, _Section, parse_when)

# the section types are part of this module's surface: `from sitsd.config import Signal` keeps working
__all__ = [
    "Config", "load_config", "read_config_bytes", "Signal", "Condition", "parse_when", "LinearConstraint", "Module",
    "ModelSection",
    "PlcSection", "UadpUdpTransport", "UadpEthTransport", "OpcUaSubscriptionTransport", "TransportSection",
    "PtpSection", "TimingSection", "Actuator", "SafetySection", "AttestationSection", "AuditSection",
    "ControlSection", "RuntimeSection", "MetricsSection", "LoggingSection",
]


class Config(_Section):
    version: Literal[1]
    line: str
    signals: list[Signal] = Field(min_length=1)
    constraints: list[LinearConstraint] = []
    model: ModelSection
    modules: list[Module] = []
    plc: PlcSection
    transport: TransportSection
    timing: TimingSection
    safety: SafetySection
    attestation: AttestationSection
    audit: AuditSection
    control: ControlSection
    runtime: RuntimeSection = RuntimeSection()
    metrics: MetricsSection = MetricsSection()
    logging: LoggingSection = LoggingSection()
    proof: ProofSection = ProofSection()

    @property
    def signal_names(self) -> list[str]:
        return [s.name for s in self.signals]


def _cross_checks(cfg: Config) -> list[tuple[tuple, str]]:
    """Problems that span sections: (location, reason)."""
    from plc.profiles import ProfileError

    problems = []
    for field in _ADDRESS_FIELDS:
        value = getattr(cfg.plc, field)
        if value:
            try:
                cfg.plc.node_id(value)
            except ProfileError as exc:
                problems.append((("plc", field), f"not a NodeId (ns=<i>;s=... or nsu=<uri>;s=...) and not a "
                                                 f"{cfg.plc.profile} address: {exc}"))
    names = cfg.signal_names
    for i, s in enumerate(cfg.signals):
        if names.index(s.name) != i:
            problems.append((("signals", i, "name"), f"signal {s.name!r} is declared twice"))
    field_types = getattr(cfg.transport, "field_types", None)
    if field_types is not None and len(field_types) != len(names):
        problems.append((("transport", "field_types"),
                         f"{len(field_types)} types for {len(names)} signals: a UADP DataSet carries one field per "
                         f"signal, in the order of `signals` ({', '.join(names)}); give one type each, or leave "
                         "field_types out (all double)"))
    for i, name in enumerate(cfg.model.inputs):
        if name not in names:
            problems.append((("model", "inputs", i), f"{name!r} is not a declared signal; declared: {', '.join(names)}"))
    constraint_names = [c.name for c in cfg.constraints]
    for i, c in enumerate(cfg.constraints):
        if constraint_names.index(c.name) != i:
            problems.append((("constraints", i, "name"), f"constraint {c.name!r} is declared twice"))
        for sig in c.coefficients:
            if sig not in names:
                problems.append((("constraints", i, "coefficients", sig), f"{sig!r} is not a declared signal"))
        for cond in c.conditions:
            if cond.signal not in names:
                problems.append((("constraints", i, "when"), f"condition on {cond.signal!r}, which is not a "
                                                             f"declared signal"))
    outputs = {a.output for a in cfg.safety.actuators}
    for i, out in enumerate(cfg.model.outputs):
        if out not in outputs:
            problems.append((("model", "outputs", i),
                             f"model output {out!r} has no safety.actuators entry; every output needs limits"))
    for i, a in enumerate(cfg.safety.actuators):
        if a.output not in cfg.model.outputs:
            problems.append((("safety", "actuators", i, "output"), f"{a.output!r} is not one of model.outputs"))
    if cfg.timing.deadline_ms > 10 * cfg.timing.cycle_ms:
        problems.append((("timing", "deadline_ms"), "deadline is more than 10 cycles; commands would act on stale data"))
    if cfg.attestation.mode == "tpm2" and cfg.attestation.signing == "tpm-session" and not (
            cfg.plc.session_nonce_node and cfg.plc.session_credential_node):
        problems.append((("attestation", "signing"), "tpm-session needs plc.session_nonce_node and "
                         "plc.session_credential_node, where the PLC checks the quote that binds the session key; "
                         "or use signing: tpm-direct"))
    for i, m in enumerate(cfg.modules):
        if [x.stage for x in cfg.modules].index(m.stage) != i:
            problems.append((("modules", i, "stage"), f"a second {m.stage} module; the loop runs one pre and one post"))
        if [x.name for x in cfg.modules].index(m.name) != i:
            problems.append((("modules", i, "name"), f"module {m.name!r} is declared twice"))
        if not m.path.is_file():
            problems.append((("modules", i, "path"), f"{m.path} does not exist (a .wat or .wasm file; relative "
                                                     "paths are resolved against the config's directory)"))
    for i, s in enumerate(cfg.signals):
        if not (math.isfinite(s.lower) and math.isfinite(s.upper)):
            problems.append((("signals", i), "min and max must be finite"))
    if cfg.audit.anchor == "tpm" and cfg.attestation.mode != "tpm2":
        problems.append((("audit", "anchor"), "anchor tpm needs attestation.mode tpm2: the anchor counter lives in "
                         "the TPM the signer uses; set audit.anchor: off with attestation.mode software"))
    problems += _enrollment_authority_problems(cfg)
    if cfg.attestation.session_credential != "measured" and not (
            cfg.attestation.mode == "tpm2" and cfg.attestation.signing == "tpm-session"):
        problems.append((("attestation", "session_credential"), f"{cfg.attestation.session_credential} chooses the "
                         "format of the tpm-session credential, and this config sends none (attestation.mode "
                         f"{cfg.attestation.mode}, signing {cfg.attestation.signing}): it needs mode tpm2 and signing "
                         "tpm-session; remove the field"))
    if cfg.model.kind == "streaming" and cfg.proof.policy != "off":
        problems.append((("proof", "policy"), "proofs need the MLP's circuit; there is no circuit for the streaming "
                         "transformer (attention): set proof.policy: off, or use model.kind: mlp"))
    return problems


def _enrollment_authority_problems(cfg: Config) -> list[tuple[tuple, str]]:
    """attestation.enrollment_authority must be a P-256 public key outside audit.directory: a key the daemon
    under verification could replace would vouch for whatever AK record it writes."""
    path = cfg.attestation.enrollment_authority
    if path is None:
        return []
    loc = ("attestation", "enrollment_authority")
    audit = Path(cfg.audit.directory).resolve()
    resolved = Path(path).resolve()
    if resolved == audit or audit in resolved.parents:
        return [(loc, f"{path} is inside audit.directory ({cfg.audit.directory}), which sitsd itself writes: the "
                      "daemon being verified could replace the key that vouches for its AK; keep the enrolling "
                      "verifier's public key elsewhere (e.g. next to this config)")]
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except FileNotFoundError:
        return [(loc, f"{path} does not exist (the enrolling verifier's public key, PEM; relative paths are "
                      "resolved against the config's directory)")]
    except OSError as exc:
        return [(loc, f"cannot read {path}: {exc.strerror or exc}")]
    except (ValueError, UnsupportedAlgorithm):
        return [(loc, f"{path} is not a PEM public key (give the public half of `sitsctl enroll --verify "
                      "--signing-key`'s key, e.g. the authority.pub.pem of `sitsctl policy keygen`)")]
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        return [(loc, f"{path} is not an ECDSA P-256 public key (enrollment records are signed with P-256)")]
    return []


def _line_of(root: yaml.Node | None, loc: tuple) -> int | None:
    """The 1-based line of the YAML node at `loc`, or of its deepest existing parent."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(key):
                    node, line = v, k.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _resolve_paths(data: dict, base: Path) -> None:
    def fix(section: dict | None, key: str) -> None:
        if isinstance(section, dict) and isinstance(section.get(key), str):
            p = Path(section[key]).expanduser()
            section[key] = str(p if p.is_absolute() else (base / p))

    fix(data.get("model"), "artifact")
    model = data.get("model")
    fix(model.get("streaming") if isinstance(model, dict) else None, "state_directory")
    fix(data.get("plc"), "pki_dir")
    fix(data.get("audit"), "directory")
    fix(data.get("proof"), "directory")
    fix(data.get("proof"), "keys")
    fix(data.get("control"), "socket")
    fix(data.get("attestation"), "approval")
    fix(data.get("attestation"), "authority_key")
    fix(data.get("attestation"), "enrollment_authority")
    for m in data.get("modules") or []:
        fix(m, "path")


# sitsctl's global `--tcti` / SITS_TCTI (sitsd.cli.main), applied under each call's own overrides
CLI_OVERRIDES: dict = {}


def read_config_bytes(path: str | Path) -> bytes:
    """The config file's bytes, read once (a reload checks the signature of, parses and measures these same bytes);
    ConfigError naming the file when it cannot be read."""
    file = str(path)
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(file, [("", None, "file not found; pass --config with the path to a sitsd YAML config "
                                            "(see examples/rolling-mill.yaml)")]) from None
    except OSError as exc:
        raise ConfigError(file, [("", None, f"cannot read: {exc.strerror}")]) from None


def load_config(path: str | Path, overrides: dict | None = None, *, data: bytes | None = None) -> Config:
    """Load and validate a config file. `overrides` maps dotted fields to values (e.g. from the CLI). `data`: the
    file's bytes, already read (read_config_bytes); `path` then only names the file in errors and resolves its
    relative paths."""
    path = Path(path)
    file = str(path)
    if data is None:
        data = read_config_bytes(path)
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        line = bytes(data)[:exc.start].count(b"\n") + 1
        raise ConfigError(file, [("", line, f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                            f"{exc.start}); save the config as UTF-8")]) from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(file, [("", line, f"not valid YAML: {reason}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(file, [("", 1, "expected a mapping of sections (version, line, signals, model, ...)")])
    for dotted, value in {**CLI_OVERRIDES, **(overrides or {})}.items():
        section = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            section = section.setdefault(p, {})
        section[leaf] = value
    _resolve_paths(data, path.resolve().parent)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            # pydantic puts the discriminator's value into the location: transport.uadp-udp.url
            loc = tuple(p for i, p in enumerate(err["loc"]) if not (i == 1 and p in _TRANSPORT_KINDS))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check the spelling; see examples/rolling-mill.yaml)"
            elif err["type"] == "missing":
                msg = "required field is missing"
            problems.append((_dotted(loc), _line_of(root, loc), msg))
        raise ConfigError(file, problems) from None
    problems = _cross_checks(cfg)
    if problems:
        raise ConfigError(file, [(_dotted(loc), _line_of(root, loc), reason) for loc, reason in problems])
    return cfg
