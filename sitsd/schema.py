"""The config's section models: signals and the constraint language, PLC, transports, timing, safety,
attestation and the rest. Parsed once, frozen; `sitsd.config` loads files into them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


_NODE_ID = re.compile(r"^(ns=\d+|nsu=[^;]+);[sigb]=.+$")


def _check_node_id(v: str) -> str:
    if not _NODE_ID.match(v):
        raise ValueError("expected a NodeId string such as ns=2;s=Line.RollGapCommand "
                         "or nsu=urn:plant:line;s=RollGapCommand")
    return v


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Signal(_Section):
    """One field of the frame. Types: float and int need min/max; enum lists its values; bool is 0/1;
    bits gives the mask of bits that may be set. `on_invalid` says what a NaN, an Inf or a value of
    the wrong type does: failsafe (drop the frame, send the fail-safe command), hold_last (use the
    last accepted value and alert), or drop (drop the frame; consecutive drops lead to the fail-safe)."""

    name: str = Field(pattern=_NAME)
    unit: str
    type: Literal["float", "int", "bool", "enum", "bits"] = "float"
    min: float | None = None
    max: float | None = None
    values: list[float] | None = Field(default=None, min_length=1, description="enum: the allowed values")
    mask: int | None = Field(default=None, ge=1, le=2**53 - 1, description="bits: the bits that may be set")
    max_rate: float | None = Field(default=None, gt=0, description="largest change per second")
    rate_window_ms: float = Field(default=0.0, ge=0.0, le=60000.0,
                                  description="measure max_rate against the last accepted value at least this old "
                                  "(0: the previous frame); sensor noise dominates frame-to-frame changes at high "
                                  "rates, so fast loops set a window of a few samples")
    on_invalid: Literal["failsafe", "hold_last", "drop"] = "failsafe"

    @model_validator(mode="after")
    def _shape(self):
        if self.type in ("float", "int"):
            if self.min is None or self.max is None:
                raise ValueError(f"a {self.type} signal needs min and max")
            if not self.min < self.max:
                raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        if self.type == "enum" and not self.values:
            raise ValueError("an enum signal needs values: [..]")
        if self.type != "enum" and self.values is not None:
            raise ValueError(f"values only apply to enum signals, this one is {self.type}")
        if self.type == "bits" and self.mask is None:
            raise ValueError("a bits signal needs mask (the bits that may be set)")
        if self.type != "bits" and self.mask is not None:
            raise ValueError(f"mask only applies to bits signals, this one is {self.type}")
        if self.type in ("enum", "bool", "bits") and (self.min is not None or self.max is not None):
            raise ValueError(f"a {self.type} signal takes its range from its type; drop min/max")
        return self

    @property
    def lower(self) -> float:
        """Smallest admissible value (the range gate and the deploy-time solver use it)."""
        if self.type == "enum":
            return min(self.values)
        if self.type in ("bool", "bits"):
            return 0.0
        return self.min

    @property
    def upper(self) -> float:
        if self.type == "enum":
            return max(self.values)
        if self.type == "bool":
            return 1.0
        if self.type == "bits":
            return float(self.mask)
        return self.max


_CONDITION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|<=|>=|<|>)\s*(-?[0-9.eE+-]+)\s*$")


@dataclass(frozen=True, slots=True)
class Condition:
    signal: str
    op: str  # == != < <= > >=
    value: float


def parse_when(text: str) -> tuple[Condition, ...]:
    """`mode == 2 and speed > 1.5` -> conditions that must all hold; ValueError says what is wrong."""
    out = []
    for part in re.split(r"\s+and\s+", text.strip()):
        m = _CONDITION.match(part)
        if not m:
            raise ValueError(f"cannot read condition {part!r}: write <signal> <op> <number> with op one of "
                             f"== != < <= > >=, joined by 'and' (e.g. mill_mode == 2 and strip_speed > 1)")
        try:
            value = float(m.group(3))
        except ValueError:
            raise ValueError(f"condition {part!r}: {m.group(3)!r} is not a number") from None
        out.append(Condition(m.group(1), m.group(2), value))
    return tuple(out)


class LinearConstraint(_Section):
    """min <= sum(coefficients[s] * s) <= max over named signals (either bound may be omitted),
    enforced only while every condition in `when` holds."""

    name: str = Field(pattern=_NAME)
    coefficients: dict[str, float] = Field(min_length=1)
    max: float | None = None
    min: float | None = None
    when: str | None = Field(default=None, description="e.g. 'mill_mode == 2 and strip_speed > 1.0'")

    @model_validator(mode="after")
    def _bounds(self):
        if self.max is None and self.min is None:
            raise ValueError("a linear constraint needs max, min or both")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        if self.when is not None:
            parse_when(self.when)
        return self

    @property
    def conditions(self) -> tuple[Condition, ...]:
        return parse_when(self.when) if self.when else ()


class Module(_Section):
    """A sandboxed WASM module (wasm_modules/ABI.md): `pre` runs on the model inputs before the model,
    `post` on the model outputs before the safety envelope. `path` is a .wat or .wasm file with its
    golden vectors next to it (<stem>.golden.json)."""

    name: str = Field(pattern=_NAME)
    path: Path
    stage: Literal["pre", "post"]
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description="pin the wasm bytes' SHA-256")
    deadline_ms: float = Field(default=5.0, gt=0, le=100,
                               description="wall-clock limit per call (epoch; preemption counts, keep it generous)")
    fuel: int = Field(default=1_000_000, ge=1000, le=1_000_000_000,
                      description="instruction budget per call (~1 ms of work per million). Required: under the "
                      "unit's SCHED_FIFO on one CPU the epoch ticker cannot preempt a spinning loop thread, so fuel "
                      "is the limit that always holds")
    memory_pages: int = Field(default=4, ge=1, le=1024, description="linear memory limit, 64 KiB pages")


class StreamingSection(_Section):
    """model.kind streaming (ep/streaming, docs/ep.md): a causal transformer, one token per frame, its KV
    cache in tiers (hot window in RAM, warm pages, cold slots in a file under `state_directory`)."""

    window: int = Field(default=256, ge=1, le=65536, description="tokens attention always sees")
    page_tokens: int = Field(default=16, ge=1, le=4096, description="tokens per KV page (slides, archive)")
    warm_pages: int = Field(default=8, ge=1, le=4096, description="archived pages kept compressed in RAM")
    ring_pages: int = Field(default=256, ge=1, description="archived pages kept on disk per stream")
    page_format: Literal["int8", "float8e4m3fn"] = "int8"
    seed: int = Field(default=0, ge=0, description="the demo transformer's weights (deterministic random)")
    state_directory: Path | None = Field(default=None, description="cold file and frame journal: the stream "
                                         "resumes after a restart or a crash (default <audit.directory>/streams)")
    checkpoint_every: int = Field(default=6000, ge=0, description="tokens between checkpoints (snapshot + "
                                  "fsync, ~1 ms on the loop thread); 0: only at a clean stop")


class ModelSection(_Section):
    kind: Literal["mlp", "streaming"] = Field(
        default="mlp", description="mlp: one ONNX model or compiled artifact, one call per frame; streaming: "
        "the streaming transformer (model.streaming), one token per frame")
    artifact: Path | None = Field(default=None, description="mlp: the .onnx file or `sitsctl compile` artifact; "
                                  "streaming: optional, a streaming artifact (`sitsctl compile --kv-cache-policy`)")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    inputs: list[str] = Field(min_length=1)
    outputs: list[str] = Field(min_length=1)
    provider: Literal["cpu", "auto"] = Field(
        default="cpu", description="execution provider policy (ep.providers): cpu, the CPU EP only "
        "(deterministic, no device copies); auto, the best accelerator this onnxruntime build has (TensorRT, "
        "CUDA, ...), the CPU EP for the nodes it cannot take. kind streaming runs on the CPU EP only")
    streaming: StreamingSection | None = None

    @model_validator(mode="after")
    def _kind(self):
        if self.kind == "mlp" and self.artifact is None:
            raise ValueError("model.artifact is required (the .onnx file or the `sitsctl compile` artifact)")
        if self.kind == "mlp" and self.streaming is not None:
            raise ValueError("model.streaming only applies to kind: streaming")
        if self.kind == "streaming" and self.provider != "cpu":
            raise ValueError(f"model.provider: {self.provider} only applies to kind: mlp; the streaming model "
                             f"runs on the CPU EP (its KV cache is host memory, appended in place); drop "
                             f"model.provider or set it to cpu")
        if self.kind == "streaming" and self.artifact is not None and self.streaming is not None:
            fixed = sorted(self.streaming.model_fields_set - {"state_directory", "checkpoint_every"})
            if fixed:  # one place decides the KV settings: the artifact's manifest
                raise ValueError(f"model.streaming.{', '.join(fixed)}: a compiled streaming artifact carries its "
                                 f"KV policy, window, pages and weights in its manifest; drop these (or drop "
                                 f"model.artifact to build the transformer from model.streaming.seed)")
        return self

    @property
    def stream(self) -> StreamingSection:
        """The streaming settings (defaults when the section is left out)."""
        return self.streaming or StreamingSection()

    @field_validator("sha256", mode="before")
    @classmethod
    def _quoted(cls, v):
        if v is not None and not isinstance(v, str):
            raise ValueError("must be a quoted string of 64 lowercase hex digits (YAML read it as a number)")
        return v


class PlcSection(_Section):
    """The PLC: its OPC UA endpoint and where commands go. Addresses are NodeIds (ns=/nsu=) or, for a
    vendor profile, the vendor's own syntax (S7 `DB_AGC.RollGap`, Logix `Program:AGC.Gap`, MELSEC `D100`)."""

    endpoint: str = Field(pattern=r"^opc\.tcp://")
    profile: Literal["simulator", "s7-1500", "controllogix", "melsec-iq-r"]
    command_mode: Literal["write", "method"] = Field(
        default="write", description="write the envelope to a ByteString variable, or pass it to a method")
    command_node: str = Field(min_length=1, description="the ByteString command variable (write) or the method")
    command_object: str | None = Field(default=None, description="method mode: the object owning the method")
    session_nonce_node: str | None = Field(default=None, description="tpm-session: the PLC's fresh nonce (ByteString)")
    session_credential_node: str | None = Field(
        default=None, description="tpm-session: where the quote-bound session credential is written (ByteString)")
    status_node: str | None = Field(default=None, description="controller status word, decoded by the profile")
    diagnostic_node: str | None = Field(default=None, description="latest diagnostic text, parsed by the profile")
    security: Literal["none", "sign", "sign-and-encrypt"] = Field(
        default="sign-and-encrypt", description="Basic256Sha256 message security of the OPC UA session")
    pki_dir: Path = Field(default=Path("/var/lib/sitsd/pki"),
                          description="own/cert.der, own/private/key.pem, trusted/certs, rejected/certs")
    application_uri: str = Field(default="urn:sits2026:sitsd", min_length=1)
    timeout_s: float = Field(default=4.0, gt=0)

    @model_validator(mode="after")
    def _method_needs_object(self):
        if self.command_mode == "method" and not self.command_object:
            raise ValueError("command_mode method needs command_object, the NodeId of the object the method "
                             "belongs to")
        return self

    def node_id(self, address: str) -> str:
        """NodeId text for an address: NodeIds pass through, anything else goes through the profile."""
        if _NODE_ID.match(address):
            return address
        from plc.profiles import get_profile

        return get_profile(self.profile).parse(address).node_id


_ADDRESS_FIELDS = ("command_node", "command_object", "session_nonce_node", "session_credential_node", "status_node",
                   "diagnostic_node")


# UADP PublisherId types (OPC 10000-14 §7.2.4.4.2, ExtendedFlags1 bits 0-2) and the largest id of each
_PUBLISHER_ID_MAX = {"byte": 0xFF, "uint16": 0xFFFF, "uint32": 0xFFFF_FFFF, "uint64": 0xFFFF_FFFF_FFFF_FFFF}
PublisherIdType = Literal["byte", "uint16", "uint32", "uint64", "string"]
_PUBLISHER_ID_TYPE_DOC = ("the PublisherId's wire type, compiled into the fast path: byte, uint16 (default), uint32, "
                          "uint64 or string")
_PUBLISHER_ID_DOC = "a number that fits publisher_id_type, or a quoted string for publisher_id_type: string"


# The wire types of a UADP DataSet's fields, one per signal in order, compiled into the fast path
# (plc.uadp.FIELD_TYPES): every fixed-size numeric built-in type. Omitted: every field is a Double.
UadpFieldType = Literal["boolean", "sbyte", "byte", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                        "float", "double"]
_FIELD_TYPES_DOC = ("the wire type of each field, one per signal in order (boolean, sbyte, byte, int16, uint16, int32, "
                    "uint32, int64, uint64, float, double), compiled into the fast path; omitted: all double. Needed "
                    "for raw field encoding, whose fields carry no type tags")


def _check_field_types(v):
    """OPC UA's names in any case ("Int16") read as the lower-case ones; DateTime is named as not numeric."""
    if isinstance(v, (list, tuple)):
        v = [t.lower() if isinstance(t, str) else t for t in v]
        for i, t in enumerate(v):
            if t == "datetime":
                raise ValueError(f"field_types[{i}] is datetime: the loop takes numeric values, which cannot hold a "
                                 "DateTime; have the PLC publish it as a number (int64 ticks or double seconds)")
    return v


def _check_publisher_id(v: int | str, info: ValidationInfo) -> int | str:
    """The id must fit the declared type: a number in its range, or a non-empty string (<= 1024 UTF-8
    bytes) for string. A quoted number still reads as a number for the numeric types, as it did when
    publisher_id was an int field; the fast path is compiled from the type, so a mismatch is refused here."""
    kind = info.data.get("publisher_id_type")
    if kind is None:  # publisher_id_type itself was invalid and is reported on its own
        return v
    if kind == "string":
        if not isinstance(v, str):
            raise ValueError(f"publisher_id_type is string: quote the id, e.g. publisher_id: \"{v}\"")
        if not v or len(v.encode("utf-8")) > 1024:
            raise ValueError("a string publisher_id must be 1..1024 UTF-8 bytes")
        return v
    if isinstance(v, str):
        if not v.isascii() or not v.isdigit():
            raise ValueError(f"{v!r} is not a number, but publisher_id_type is {kind}; give a number in "
                             f"0..{_PUBLISHER_ID_MAX[kind]}, or set publisher_id_type: string for a string id")
        v = int(v)
    if not 0 <= v <= _PUBLISHER_ID_MAX[kind]:
        hint = ("" if kind == "uint64" or v < 0
                else "; set publisher_id_type to the larger type the PLC sends (uint32, uint64)")
        raise ValueError(f"{v} does not fit publisher_id_type {kind} (0..{_PUBLISHER_ID_MAX[kind]}){hint}")
    return v


class UadpUdpTransport(_Section):
    """UADP NetworkMessages over UDP (multicast or unicast), read by the loop thread itself."""

    kind: Literal["uadp-udp"]
    url: str = Field(pattern=r"^opc\.udp://")
    interface: str = "0.0.0.0"
    field_encoding: Literal["variant", "raw"] = Field(
        default="variant", description="fields as Variants, or RawData (Annex A periodic fixed layouts)")
    field_types: tuple[UadpFieldType, ...] | None = Field(default=None, min_length=1, max_length=1024,
                                                          description=_FIELD_TYPES_DOC)
    publisher_id_type: PublisherIdType = Field(default="uint16", description=_PUBLISHER_ID_TYPE_DOC)
    publisher_id: int | str = Field(description=_PUBLISHER_ID_DOC)
    writer_group_id: int = Field(ge=0, le=0xFFFF, description="messages of other writer groups are skipped")
    dataset_writer_id: int = Field(ge=0, le=0xFFFF)

    _publisher_id = field_validator("publisher_id")(_check_publisher_id)
    _field_types = field_validator("field_types", mode="before")(_check_field_types)


class UadpEthTransport(_Section):
    """UADP NetworkMessages directly over Ethernet (EtherType 0xB62C), VLAN PCP/VID kept; needs CAP_NET_RAW."""

    kind: Literal["uadp-eth"]
    url: str = Field(pattern=r"^opc\.eth://", description="opc.eth://<MAC>[:<VID>[.<PCP>]]")
    interface: str = Field(min_length=1, max_length=15, description="network interface name, e.g. eth1")
    field_encoding: Literal["variant", "raw"] = "variant"
    field_types: tuple[UadpFieldType, ...] | None = Field(default=None, min_length=1, max_length=1024,
                                                          description=_FIELD_TYPES_DOC)
    publisher_id_type: PublisherIdType = Field(default="uint16", description=_PUBLISHER_ID_TYPE_DOC)
    publisher_id: int | str = Field(description=_PUBLISHER_ID_DOC)
    writer_group_id: int = Field(ge=0, le=0xFFFF, description="messages of other writer groups are skipped")
    dataset_writer_id: int = Field(ge=0, le=0xFFFF)

    _publisher_id = field_validator("publisher_id")(_check_publisher_id)
    _field_types = field_validator("field_types", mode="before")(_check_field_types)


class OpcUaSubscriptionTransport(_Section):
    """An OPC UA subscription on one array variable (signals in order, SourceTimestamp = send time)."""

    kind: Literal["opcua-subscription"]
    node: str
    publishing_interval_ms: float = Field(default=1.0, ge=0)

    @field_validator("node")
    @classmethod
    def _node_id(cls, v: str) -> str:
        return _check_node_id(v)


TransportSection = Annotated[UadpUdpTransport | UadpEthTransport | OpcUaSubscriptionTransport,
                             Field(discriminator="kind")]
_TRANSPORT_KINDS = ("uadp-udp", "uadp-eth", "opcua-subscription")


class PtpSection(_Section):
    """linuxptp's state, read with `pmc` over ptp4l's UNIX socket, and what to do when it is not locked."""

    enabled: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: watch if ptp4l answers; on: a missing ptp4l counts as unsynchronised")
    uds: Path = Path("/var/run/ptp4l")
    max_offset_ns: int = Field(default=1000, gt=0, description="largest |master offset| that counts as locked")
    policy: Literal["warn", "drop", "failsafe"] = Field(
        default="warn", description="unsynchronised clock: alert only, drop frames, or send the fail-safe")
    poll_s: float = Field(default=1.0, gt=0)
    # a NIC's hardware RX stamp reads its PHC, which ptp4l steers to the PTP timescale (TAI); the sender's
    # stamp is UTC, so hardware stamps are moved to UTC before transit = RX - sender is taken
    phc_timescale: Literal["tai", "utc"] = Field(
        default="tai", description="clock of the NIC's PHC: tai (ptp4l/gPTP, the usual case) or utc (ARB timescale)")
    utc_offset_s: int = Field(default=37, ge=0, le=100, description="TAI - UTC subtracted from hardware RX stamps "
                              "when phc_timescale is tai (pmc 'GET TIME_PROPERTIES_DATA_SET': currentUtcOffset)")


class TimingSection(_Section):
    cycle_ms: float = Field(gt=0)
    deadline_ms: float = Field(gt=0, description="budget from the PLC's send time to the command leaving")
    max_transit_ms: float = Field(gt=0, description="largest RX stamp minus sender stamp")
    max_future_ms: float = Field(default=1.0, ge=0)
    max_age_ms: float | None = Field(default=None, gt=0,
                                     description="largest age of a frame when the loop picks it up (stale)")
    replay_window: int = Field(default=64, ge=1, le=32767, description="sequence numbers remembered per writer")
    require_hardware_stamps: bool = False
    max_consecutive_drops: int = Field(default=5, ge=1)
    frame_timeout_ms: float | None = Field(
        default=None, gt=0, description="no frame for this long: frame_timeout alert (opcua-subscription also "
        "rebuilds the PLC session and subscription); unset: 50 x cycle_ms, at least 1000 ms")
    ptp: PtpSection = PtpSection()


class Actuator(_Section):
    output: str
    min: float
    max: float
    max_rate: float | None = Field(default=None, gt=0, description="largest change per second")
    failsafe: float
    on_violation: Literal["clamp", "failsafe"] = Field(
        default="clamp", description="a model output beyond the limits is clamped, or replaced by the fail-safe")

    @model_validator(mode="after")
    def _range(self):
        if not self.min < self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        if not self.min <= self.failsafe <= self.max:
            raise ValueError(f"failsafe {self.failsafe} lies outside [{self.min}, {self.max}]")
        return self


class SafetySection(_Section):
    actuators: list[Actuator] = Field(min_length=1)


class AttestationSection(_Section):
    """mode tpm2 signs with TPM-anchored keys: `tpm-session` (default) quotes a per-start session key once
    (the PLC checks the quote via plc.session_nonce_node/session_credential_node) and signs each command
    with it in microseconds; `tpm-direct` runs TPM2_Sign for every command. software: development only."""

    mode: Literal["tpm2", "software"]
    signing: Literal["tpm-session", "tpm-direct"] = "tpm-session"
    tcti: str | None = None
    key_handle: int = Field(default=0x81000001, ge=0x81000000, le=0x81FFFFFF,
                            description="tpm-direct: the password (USERWITHAUTH) ECC P-256 key that signs every "
                            "command by TPM2_Sign; created on first start when absent")
    ak_handle: int = Field(default=0x81000002, ge=0x81000000, le=0x81FFFFFF,
                           description="restricted attestation key that quotes the session key")
    device_key_handle: int = Field(
        default=0x81000003, ge=0x81000000, le=0x81FFFFFF,
        description="the PolicyAuthorize-bound device key (no password use) that signs the deploy challenge "
        "(sitsctl deploy) and certifies the session key (certify_session); created on first deploy when absent")
    measurement_pcr: int = Field(default=23, ge=0, le=23,
                                 description="PCR extended with every deployed model, module and config (hot swaps); "
                                 "16 or 23, the PCRs software may reset at locality 0: sitsd resets it at start")
    # measured deployment (`sitsctl deploy`, docs/deploy.md); paths are relative to the config's directory
    verify_on_boot: bool = Field(default=False, description="refuse to start (sign nothing) unless a quote over "
                                 "the daemon's measurements matches the deployment `sitsctl deploy` staged")
    approval: Path | None = Field(default=None, description="the authority's approval (sitsctl policy approve)")
    authority_key: Path | None = Field(default=None, description="the authority's public key (PEM) approvals "
                                       "are checked against; keep its private key offline")
    certify_session: bool = Field(
        default=False, description="tpm-session: at each start the PolicyAuthorize-bound device key "
        "(device_key_handle) certifies the session key, which the TPM does only while the measured model and modules are the ones "
        "`approval` approves; sitsd refuses to start otherwise. Needs approval and authority_key")
    enrollment_authority: Path | None = Field(
        default=None, description="the enrolling verifier's P-256 public key (PEM; `sitsctl enroll --verify "
        "--signing-key`): `sitsctl deploy` accepts the AK enrollment record (--enrollment, or "
        "<audit.directory>/enrollment.json) only with its valid signature, and refuses to deploy without a record. "
        "Keep it outside audit.directory (writable by sitsd itself)")
    session_credential: Literal["measured", "model-only"] = Field(
        default="measured", description="tpm-session: what the session credential the PLC checks proves. measured "
        "(version 2): one quote over the session PCR (16) and measurement_pcr (23) with its measurement log, so the "
        "PLC sees model, modules and config; model-only (version 1): a quote over PCR 16 alone, no log, for a PLC "
        "gateway whose verifier predates version 2 (it refuses those as malformed). Measurement into "
        "measurement_pcr goes on either way; only what the PLC is shown differs. Needs mode tpm2 and signing "
        "tpm-session (docs/deploy.md, upgrade order)")
    require_signatures: Literal["off", "modules", "all"] = Field(
        default="off", description="which files need the authority's detached signature (FILE.sig, `sitsctl sign`) "
        "at startup, hot swap and reload: none, WASM modules, or modules + model + config (production: all)")

    @model_validator(mode="after")
    def _tcti(self):
        if self.mode == "tpm2" and not self.tcti:
            raise ValueError("mode tpm2 needs tcti: device:/dev/tpmrm0 for a real TPM, swtpm:path=<socket> for swtpm")
        return self

    @model_validator(mode="after")
    def _handles_distinct(self):
        # three different kinds of key: one persistent handle holds one object, and each refuses the others' use
        roles = (("key_handle", self.key_handle, "the tpm-direct password signing key"),
                 ("ak_handle", self.ak_handle, "the restricted attestation key"),
                 ("device_key_handle", self.device_key_handle, "the PolicyAuthorize-bound device key"))
        for i, (name_a, a, what_a) in enumerate(roles):
            for name_b, b, what_b in roles[i + 1:]:
                if a == b:
                    raise ValueError(f"{name_a} and {name_b} are both 0x{a:08x}: {what_a} and {what_b} need "
                                     f"persistent handles of their own; move one of them to a free handle (defaults: "
                                     "key_handle 0x81000001, ak_handle 0x81000002, device_key_handle 0x81000003)")
        return self

    @model_validator(mode="after")
    def _measurement_pcr(self):
        if self.measurement_pcr not in (16, 23):
            raise ValueError(f"measurement_pcr {self.measurement_pcr}: use 23 (or 16), a PCR that can be reset at "
                             "locality 0; sitsd resets it at every start and replays its measurements from zero")
        if self.mode == "tpm2" and self.signing == "tpm-session" and self.measurement_pcr == 16:
            raise ValueError("measurement_pcr 16 is the PCR the tpm-session signer binds its session key to; use 23")
        return self

    @model_validator(mode="after")
    def _verify_on_boot(self):
        if self.verify_on_boot and (self.approval is None or self.authority_key is None):
            raise ValueError("verify_on_boot needs approval and authority_key (the authority's public key): the "
                             "deployment record's approval is checked with it at every start")
        return self

    @model_validator(mode="after")
    def _certify_session(self):
        if not self.certify_session:
            return self
        if self.mode != "tpm2" or self.signing != "tpm-session":
            raise ValueError("certify_session needs mode tpm2 and signing tpm-session (the TPM certifies the "
                             "session key)")
        if self.approval is None or self.authority_key is None:
            raise ValueError("certify_session needs approval (sitsctl policy approve) and authority_key, the "
                             "authority's public key the device key is bound to")
        return self

    @model_validator(mode="after")
    def _enrollment_authority(self):
        if self.enrollment_authority is not None and self.mode != "tpm2":
            raise ValueError("enrollment_authority checks the record that pins the TPM's attestation key (AK): it "
                             "needs mode tpm2; remove it with mode software")
        return self

    @model_validator(mode="after")
    def _signatures_need_authority(self):
        if self.require_signatures != "off" and self.authority_key is None:
            raise ValueError(f"require_signatures {self.require_signatures} needs authority_key, the authority's "
                             "public key (PEM) the signatures are checked against")
        return self


class AuditSection(_Section):
    directory: Path
    fsync: Literal["every", "interval", "never"] = Field(
        default="interval", description="durability: every record, at least once a second, or left to the kernel")
    segment_max_mb: float = Field(default=64.0, gt=0, description="start a new segment past this size; closed "
                                  "segments are zstd-compressed in the background")
    retention_days: float | None = Field(default=None, gt=0, description="delete compressed segments older than this")
    max_total_mb: float | None = Field(default=None, gt=0, description="delete the oldest compressed segments "
                                       "while the directory holds more than this")
    anchor: Literal["off", "tpm"] = Field(
        default="off", description="tpm: anchor records tied to a TPM NV counter that only goes up, so deleting the "
        "newest records (which leaves a valid chain prefix) shows at the next start and in `sitsctl audit verify "
        "--tpm`; needs attestation.mode tpm2 (the daemon shares the signer's TPM connection)")
    anchor_interval_s: float = Field(
        default=300.0, ge=10.0, le=86400.0, description="seconds between anchors (also one at start, at each segment "
        "rotation and at a clean stop). Each anchor is one TPM NV write, and TPM NV memory wears: 300 s is about "
        "105,000 writes a year, 10 s about 3 million; records written after the newest anchor are not covered")
    anchor_nv_index: int = Field(
        default=0x01A0D170, description="the NV index of the counter, defined at first use in the owner hierarchy; "
        "the owner range of the TCG handle registry is 0x01800000-0x01BFFFFF (below it: TPM and platform "
        "manufacturers)")

    @field_validator("anchor", mode="before")
    @classmethod
    def _anchor_word(cls, v):
        if v is False:  # YAML 1.1 reads an unquoted `off` as false
            return "off"
        if v is True:
            raise ValueError("write anchor: tpm (or off); YAML read a bare on/yes/true as a boolean")
        return v

    @field_validator("anchor_nv_index")
    @classmethod
    def _owner_nv_index(cls, v: int) -> int:
        if not 0x01800000 <= v <= 0x01BFFFFF:
            raise ValueError(f"0x{v:08x} is not an owner NV index: use 0x01800000-0x01BFFFFF (TCG handle registry; "
                             "0x01000000-0x017FFFFF belong to the TPM and platform manufacturers, 0x01C00000- to "
                             "TCG-defined indices such as the EK certificates)")
        return v


class ControlSection(_Section):
    socket: Path
    operator_group: str | None = Field(default=None, description="members may reload, update, roll back and stop; "
                                       "others who can open the socket may only read status and events")


class RuntimeSection(_Section):
    """Scheduling of the loop thread. Both need the privileges the unit grants (LimitRTPRIO=, CPUAffinity=)."""

    loop_cpu: int | None = Field(default=None, ge=0, description="pin the loop thread to this CPU")
    realtime_priority: int | None = Field(default=None, ge=1, le=99, description="SCHED_FIFO priority of the loop")
    persist_updates: bool = Field(default=True, description="a hot swap that passed its health watch is loaded "
                                  "again after a restart (<audit.directory>/active-stages.json, while the config "
                                  "file is unchanged; docs/hotswap.md); false: a restart loads the config's versions")


class MetricsSection(_Section):
    """Prometheus text exposition at http://host:port/metrics (served off the loop thread)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65535, description="0 picks a free port (tests)")


class LoggingSection(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"


class ProofSection(_Section):
    """Groth16 proofs that commands follow from their inputs and the model (sitsd/prover.py, docs/zk.md).

    Made off the fast path by a process pool; a full queue drops the proof, never delays a command.
    Off by default: one proof of the demo circuit costs ~0.06-0.10 s of a core with the mcl backend
    (x86_64; ~0.2-0.3 s with gmpy2 elsewhere), so `every` only suits slow loops."""

    policy: Literal["off", "every", "one_in_n", "on_alert"] = Field(
        default="off", description="which commands are proven: none, all, one in n, or the first after an alert")
    n: int = Field(default=100, ge=1, description="one_in_n: prove every n-th command")
    workers: int = Field(default=1, ge=1, le=16, description="prover processes")
    queue: int = Field(default=8, ge=1, le=4096, description="commands waiting for a prover; beyond: dropped")
    stall_alert_s: float = Field(default=30.0, gt=0, le=3600, description="alert `prover` when a proof has been "
                                 "with a prover process this long and none finished meanwhile (stopped, hung, "
                                 "starved); commands never wait for proofs")
    directory: Path | None = Field(default=None, description="proof files and index (default <audit.directory>/proofs)")
    keys: Path | None = Field(default=None, description="circuit.zkey + vk.json (default <directory>/keys; a "
                              "development setup is made there if missing: see `sitsctl zk-setup`)")


