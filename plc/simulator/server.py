"""The rolling-mill PLC simulator: an asyncua server, a UADP publisher and the stand's physics.

It behaves like the PLC sitsd talks to: sensor frames leave as UADP over UDP at a fixed rate
(and as an OPC UA variable for subscription-based setups); the roll-gap command arrives as a
signed envelope written to a ByteString variable. Every command is checked by the injected
verifier (signature, model hash, sequence) before it touches the physics; a rejected write
gets a Bad status and is counted. Without a valid command for `command_timeout_s` the stand
falls back to its safe setpoint (nominal gap). A twin stand sees the same disturbances with
no commands at all, which gives the open-loop reference error of the same run.

Emulating a vendor profile (`SimulatorSettings.profile`), the server also holds every variable of the
profile's `simulator_tags` at the NodeId that profile gives it (`node_id_for`), in the vendor's namespace
at the profile's namespace index (S7-1500: `ns=3;s="DB_Line"."Thickness"`, ControlLogix:
`ns=2;s=[PLC]Program:Mill.ExitThickness`, MELSEC iQ-R: `ns=2;s=D104`), as the real controller's OPC UA
server would. They are twins of the `RollingMill.*` variables, which stay where they were: the same
values, and writes to a vendor command or credential node go through the same checks. The simulator's
own namespace then moves to the next free index (clients look it up by URI, `nsu=`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from datetime import datetime, timedelta, timezone

import numpy as np
from asyncua import Server, ua

# CredentialError codes on which the open session ends (_on_credential_write); they live in attestation/session.py,
# next to SessionReplayState.end_current_session, for any PLC gateway (re-exported here)
from attestation.session import SESSION_ENDING_CODES

from ..uadp import UadpMessage, compile_layout
from ..eth import EthPublisher
from ..profiles import get_profile
from ..opcua_security import SERVER_POLICIES, Pki, TrustListValidator
from ..udp import UdpPublisher
from .faults import FaultInjector, parse_fault
from .physics import SIGNALS, DisturbanceSequence, MillParameters, Stand

NAMESPACE_URI = "urn:sits2026:plc-simulator"
FRAME_NODE = "RollingMill.SensorFrame"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
COMMAND_NODE = "RollingMill.RollGapCommand"
COMMAND_METHOD = "RollingMill.ApplyCommand"
STATUS_NODE = "RollingMill.Status"
SESSION_NONCE_NODE = "RollingMill.SessionNonce"
SESSION_CREDENTIAL_NODE = "RollingMill.SessionCredential"
DIAGNOSTIC_NODE = "RollingMill.Diagnostic"
MILL_OBJECT = "RollingMill"
# a vendor namespace whose URI the profile does not know (gateways and modules name their own): ours, per profile
VENDOR_NAMESPACE_URI = NAMESPACE_URI + ":{profile}"

# verify(envelope bytes) -> (sequence, values, failsafe); raises with a reason on rejection.
CommandVerifier = Callable[[bytes], tuple[int, Sequence[float], bool]]
# accept(credential bytes, nonce) -> the CommandVerifier for that session; raises with a reason.
SessionAcceptor = Callable[[bytes, bytes], CommandVerifier]


class CommandRejected(Exception):
    def __init__(self, reason: str, code: str = "rejected") -> None:
        super().__init__(reason)
        self.code = code


@dataclass
class SimulatorSettings:
    udp_url: str
    interface: str = "127.0.0.1"
    rate_hz: float = 100.0
    seed: int = 1
    publisher_id: int | str = 7
    publisher_id_type: str = "uint16"  # byte | uint16 | uint32 | uint64 | string: the PublisherId's wire type
    writer_group_id: int = 1
    writer_id: int = 1
    command_timeout_s: float = 0.1
    host: str = "127.0.0.1"
    port: int = 0
    publish_opcua_frames: bool = False
    eth_url: str | None = None  # publish over raw Ethernet (opc.eth://...) instead of UDP
    eth_interface: str | None = None
    field_encoding: str = "variant"  # variant | raw (RawData, Annex A style)
    profile: str = "simulator"  # emulate this vendor's status word and diagnostic texts
    launch_offset_us: float | None = None  # raw Ethernet: ask for SO_TXTIME launch at send time + offset
    security: str = "none"  # none | sign | sign-and-encrypt (Basic256Sha256)
    pki_dir: str | None = None  # created with a self-signed server certificate when empty
    application_uri: str = "urn:sits2026:plc-simulator"
    fault: str | None = None  # inject one fault: KIND@SECONDS[:SIGNAL][xMAGNITUDE] (plc/simulator/faults.py)




class RollingMillSimulator:
    def __init__(self, settings: SimulatorSettings, verifier: CommandVerifier | None,
                 params: MillParameters | None = None, session_acceptor: SessionAcceptor | None = None) -> None:
        self.s = settings
        self.p = params or MillParameters()
        # without a session acceptor, `verifier` checks every command; with one, commands are refused
        # until a session credential written to SessionCredential has been accepted
        self.verify = verifier if verifier is not None else self._no_session
        self.session_acceptor = session_acceptor
        # one use: a fresh nonce after every credential write, accepted or refused (_on_credential_write), so a
        # captured credential cannot be written again; SessionNonce reads always return the current one
        self.session_nonce = os.urandom(32)
        self.session_nonces_issued = 1
        self.sessions_accepted = 0
        self.sessions_rejected = 0
        self.sessions_ended = 0  # open sessions ended by a refused credential (_on_credential_write)
        self.session_open = False
        dt = 1.0 / settings.rate_hz
        self.dt = dt
        self.publish_factor = 1  # frames per physics tick (set_publish_factor)
        self._disturbances = DisturbanceSequence(self.p, settings.seed, dt)
        self.fault = FaultInjector(parse_fault(settings.fault, settings.profile), self.p) if settings.fault else None
        self.closed = Stand(self.p, dt)
        self.open = Stand(self.p, dt)
        self._layout = compile_layout(len(SIGNALS), settings.field_encoding, settings.publisher_id_type,
                                      settings.publisher_id)
        self._lock = threading.Lock()
        self._setpoint = 0.0
        self._last_command_mono = 0.0
        self._in_fallback = True
        self.steps = 0
        self.accepted = 0
        self.failsafe_commands = 0
        self.rejected = 0
        self.reject_reasons: Counter[str] = Counter()
        self.last_reject = ""
        self.fallbacks = 0
        self._err_closed = 0.0
        self._err_open = 0.0
        self._err_steps = 0
        self.launch_time_status = "not requested"
        self.clock_offset_ns = 0  # set_clock_offset_ms: a jump of the PLC's clock, added to every sender stamp
        self._stop = threading.Event()
        self.server: Server | None = None
        self.endpoint = ""
        self._frame_node = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._twins: dict[ua.NodeId, list] = {}  # a RollingMill variable -> its twins at vendor addresses (start)
        self.vendor_node_ids: dict[str, str] = {}  # simulator variable name -> the vendor NodeId text it also has

    # -- OPC UA side -------------------------------------------------------------------------
    async def start(self) -> None:
        logging.getLogger("asyncua").setLevel(logging.CRITICAL)
        server = Server()
        await server.init()
        server.set_endpoint(f"opc.tcp://{self.s.host}:{self.s.port}/sits/plcsim")
        server.set_server_name("sits2026 rolling-mill PLC simulator")
        if self.s.security == "none":
            server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        else:
            await self._secure(server)
        profile = get_profile(self.s.profile)
        idx, vendor_idx = await _register_namespaces(server, profile)
        mill = await server.nodes.objects.add_object(ua.NodeId("RollingMill", idx), "RollingMill")
        self._signal_nodes = []
        for name in SIGNALS:
            node = await mill.add_variable(ua.NodeId(f"RollingMill.{name}", idx), name, 0.0, ua.VariantType.Double)
            self._signal_nodes.append(node)
        self._frame_node = await mill.add_variable(
            ua.NodeId(FRAME_NODE, idx), "SensorFrame", [0.0] * len(SIGNALS), ua.VariantType.Double)
        cmd = await mill.add_variable(ua.NodeId(COMMAND_NODE, idx), "RollGapCommand", b"", ua.VariantType.ByteString)
        await cmd.set_writable()
        server.set_attribute_value_setter(cmd.nodeid, self._on_command_write)
        await mill.add_method(ua.NodeId(COMMAND_METHOD, idx), "ApplyCommand", self._on_command_call,
                              [ua.VariantType.ByteString], [ua.VariantType.UInt32])
        nonce = await mill.add_variable(ua.NodeId(SESSION_NONCE_NODE, idx), "SessionNonce", self.session_nonce,
                                        ua.VariantType.ByteString)
        server.set_attribute_value_callback(nonce.nodeid, self._read_nonce)  # always the current nonce
        credential = await mill.add_variable(ua.NodeId(SESSION_CREDENTIAL_NODE, idx), "SessionCredential", b"",
                                             ua.VariantType.ByteString)
        await credential.set_writable()
        server.set_attribute_value_setter(credential.nodeid, self._on_credential_write)
        self._status_node = await mill.add_variable(ua.NodeId(STATUS_NODE, idx), "Status", 0, ua.VariantType.UInt32)
        self._diagnostic_node = await mill.add_variable(ua.NodeId(DIAGNOSTIC_NODE, idx), "Diagnostic", "",
                                                        ua.VariantType.String)
        if vendor_idx is not None:
            await self._add_vendor_nodes(server, profile, vendor_idx, {
                **{name: node for name, node in zip(SIGNALS, self._signal_nodes)},
                "SensorFrame": self._frame_node, "RollGapCommand": cmd, "SessionNonce": nonce,
                "SessionCredential": credential, "Status": self._status_node, "Diagnostic": self._diagnostic_node})
        await server.start()
        self.server = server
        self.endpoint = f"opc.tcp://{self.s.host}:{server.bserver.port}/sits/plcsim"
        self.namespace_index = idx
        self._loop = asyncio.get_running_loop()
        self._vendor_task = self._loop.create_task(self._emulate_vendor())

    async def _add_vendor_nodes(self, server: Server, profile, vendor_idx: int, originals: dict) -> None:
        """The profile's `simulator_tags`, each a twin of the RollingMill variable of that name: same type and
        value; command and credential writes and nonce reads answered by the same handlers."""
        folder = await server.nodes.objects.add_folder(ua.NodeId(1, vendor_idx), f"{profile.name} tags")
        uri = (await server.get_namespace_array())[vendor_idx]
        for name, address in profile.simulator_tags().items():
            original = originals.get(name)
            if original is None:
                raise ValueError(f"profile {profile.name}: simulator_tags names {name!r}, which the simulator does not "
                                 f"have; it has {', '.join(originals)}")
            node_id = _node_id(profile.node_id_for(name), uri, vendor_idx)
            value = await original.read_data_value()
            twin = await folder.add_variable(node_id, ua.QualifiedName(profile.parse(address).text, vendor_idx),
                                             value.Value.Value, value.Value.VariantType)
            if name == "RollGapCommand":
                await twin.set_writable()
                server.set_attribute_value_setter(twin.nodeid, self._on_command_write)
            elif name == "SessionCredential":
                await twin.set_writable()
                server.set_attribute_value_setter(twin.nodeid, self._on_credential_write)
            elif name == "SessionNonce":
                server.set_attribute_value_callback(twin.nodeid, self._read_nonce)
            self._twins.setdefault(original.nodeid, []).append(twin)
            self.vendor_node_ids[name] = node_id.to_string()

    async def _write_value(self, node, value: ua.Variant) -> None:
        """A RollingMill variable and its vendor twins."""
        await node.write_value(value)
        for twin in self._twins.get(node.nodeid, ()):
            await twin.write_value(value)

    async def _emulate_vendor(self, period_s: float = 1.0) -> None:
        """Cycle through the profile's example status words and diagnostic texts, as its controllers show them."""
        profile = get_profile(self.s.profile)
        statuses, texts = profile.example_status(), profile.example_diagnostics()
        i = 0
        while self.server is not None and (statuses or texts):
            if statuses:
                status = ua.Variant(statuses[i % len(statuses)], ua.VariantType.UInt32)
                await self._write_value(self._status_node, status)
            if texts:
                await self._write_value(self._diagnostic_node, ua.Variant(texts[i % len(texts)], ua.VariantType.String))
            i += 1
            await asyncio.sleep(period_s)

    async def _secure(self, server: Server) -> None:
        """Only Basic256Sha256 endpoints; clients must be in the simulator's trust list, like a real PLC."""
        if not self.s.pki_dir:
            raise ValueError("security other than none needs pki_dir")
        pki = Pki(Path(self.s.pki_dir))
        if not pki.has_own():
            pki.create_own(self.s.application_uri, "sits2026 PLC simulator", server=True,
                           hostnames=[socket.gethostname(), "localhost"], ips=[self.s.host])
        await server.set_application_uri(self.s.application_uri)
        server.set_security_policy([SERVER_POLICIES[self.s.security]])
        await server.load_certificate(str(pki.own_cert))
        await server.load_private_key(str(pki.own_key))
        self.client_validator = TrustListValidator(pki, peer_is_server=False)
        server.set_certificate_validator(self.client_validator)

    @staticmethod
    def _no_session(_envelope: bytes):
        raise CommandRejected("no session: write a session credential to SessionCredential first", "key")

    @staticmethod
    def _refused_session(refusal: Exception):
        def verify(_envelope: bytes):
            raise CommandRejected(f"no session: the last session credential was refused ({refusal}); write one "
                                  "this PLC accepts to SessionCredential", "key")
        return verify

    def _read_nonce(self, _nodeid, _attr) -> ua.DataValue:
        now = datetime.now(timezone.utc)
        return ua.DataValue(ua.Variant(self.session_nonce, ua.VariantType.ByteString), SourceTimestamp=now,
                            ServerTimestamp=now)

    def _on_credential_write(self, node_data, attr, datavalue: ua.DataValue) -> None:
        """A session credential: the device's TPM quote binding a session key to this PLC's nonce. The nonce is
        used up by the write, accepted or refused: the next credential must be quoted against a fresh one (read
        SessionNonce again), so a credential captured on the wire cannot be written again.

        A genuine credential refused for what it says runs (`SESSION_ENDING_CODES`: its quote by the trusted AK over
        this nonce verified, its log replayed) also ends the current session: no command is accepted until a
        credential is. The device re-binds after each measurement (a reload, a hot swap), so such a refusal says
        that what runs now is not what this PLC accepts (its pins), and the earlier credential no longer describes
        it. A forged, garbled, altered or replayed credential (another AK, another nonce, a bad quote, a log that
        does not replay) is refused without ending the session: any client that can write the node (`security
        none`) could write one."""
        payload = datavalue.Value.Value if datavalue.Value is not None else None
        if self.session_acceptor is None:
            raise ua.UaStatusCodeError(ua.StatusCodes.BadNotWritable)
        nonce = self.session_nonce
        self.session_nonce = os.urandom(32)  # before the check: nothing written from now on can use `nonce`
        self.session_nonces_issued += 1
        try:
            verifier = self.session_acceptor(bytes(payload or b""), nonce)
        except Exception as exc:  # the acceptor's error says why (quote, nonce, PCR, model)
            with self._lock:
                if getattr(exc, "code", None) in SESSION_ENDING_CODES:
                    if self.session_open:
                        self.sessions_ended += 1
                    self.session_open = False
                    # the session ends with the refusal (see above): in the acceptor's replay state, so the accepted
                    # session's verifier itself refuses further commands (`ended`), and here, for a clear reason
                    state = getattr(self.session_acceptor, "replay_state", None)
                    if hasattr(state, "end_current_session"):
                        state.end_current_session(f"a credential was refused: {exc}")
                    self.verify = self._refused_session(exc)
                self.sessions_rejected += 1
                self.reject_reasons["session"] += 1
                self.last_reject = f"session credential refused: {exc}"
            raise ua.UaStatusCodeError(ua.StatusCodes.BadSecurityChecksFailed) from exc
        with self._lock:
            self.verify = verifier
            self.session_open = True
            self.sessions_accepted += 1
        node_data.attributes[attr].value = datavalue

    def _on_command_write(self, node_data, attr, datavalue: ua.DataValue) -> None:
        """asyncua calls this on the server's loop for every write to RollGapCommand."""
        self._apply(datavalue.Value.Value if datavalue.Value is not None else None)
        node_data.attributes[attr].value = datavalue

    def _on_command_call(self, parent, envelope: ua.Variant) -> list[ua.Variant]:
        """The method-call form of the same command (ApplyCommand(ByteString) -> UInt32 0)."""
        self._apply(envelope.Value if isinstance(envelope, ua.Variant) else envelope)
        return [ua.Variant(0, ua.VariantType.UInt32)]

    def _apply(self, payload) -> None:
        """Verify a command envelope and apply it to the stand, or count it and answer a Bad status."""
        try:
            if not isinstance(payload, (bytes, bytearray)):
                raise CommandRejected(f"command must be a ByteString envelope, got {type(payload).__name__}",
                                      "malformed")
            try:
                _seq, values, failsafe = self.verify(bytes(payload))
            except CommandRejected:
                raise
            except Exception as exc:  # the verifier's own error type carries the reason
                raise CommandRejected(str(exc), getattr(exc, "code", "rejected")) from exc
            if len(values) != 1 or not np.isfinite(values[0]):
                raise CommandRejected(f"roll-gap command needs one finite value, got {list(values)}", "malformed")
        except CommandRejected as exc:
            self.rejected += 1
            self.reject_reasons[exc.code] += 1
            self.last_reject = str(exc)
            raise ua.UaStatusCodeError(ua.StatusCodes.BadSecurityChecksFailed) from exc
        with self._lock:
            self._setpoint = float(values[0])
            self._last_command_mono = time.monotonic()
            self._in_fallback = False
            self.accepted += 1
            self.failsafe_commands += bool(failsafe)

    # -- physics and publishing -------------------------------------------------------------------
    def run_publisher(self, duration_s: float | None = None) -> None:
        """Steps the physics and publishes one frame per tick until stop() (call on its own thread)."""
        if self.s.eth_url:
            offset = None if self.s.launch_offset_us is None else int(self.s.launch_offset_us * 1000)
            publisher = EthPublisher(self.s.eth_url, self.s.eth_interface, launch_offset_ns=offset)
            self.launch_time_status = publisher.launch_time_status
        else:
            publisher = UdpPublisher(self.s.udp_url, self.s.interface)
        reading = np.zeros(len(SIGNALS))
        next_tick = time.monotonic()
        end = None if duration_s is None else next_tick + duration_s
        net_seq = 0
        try:
            while not self._stop.is_set() and (end is None or next_tick < end):
                self._step(reading)
                burst = self.publish_factor  # read once per physics tick (set from another thread)
                for i in range(burst):
                    if i:  # the extra frames of a burst, spread over the tick: same physics, fresh stamps
                        delay = next_tick + i * self.dt / burst - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                    net_seq += 1
                    msg = UadpMessage(self.s.publisher_id, self.s.writer_group_id, self.s.writer_id,
                                      net_seq, net_seq, self._sender_ns(), tuple(reading.tolist()))
                    publisher.send(self._layout.encode(msg))
                    if i == 0 and self._loop is not None and (self.s.publish_opcua_frames or net_seq % 10 == 0):
                        # every frame when a subscriber reads frames over OPC UA; else 10 Hz for people browsing
                        self._loop.call_soon_threadsafe(self._publish_opcua, reading.tolist(), msg.timestamp_ns,
                                                        net_seq % 10 == 0)
                next_tick += self.dt
                delay = next_tick - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                elif delay < -0.5:  # far behind (suspended): resynchronise instead of bursting
                    next_tick = time.monotonic()
        finally:
            publisher.close()

    def set_publish_factor(self, factor: int) -> int:
        """Publish `factor` frames per physics tick from now on (1: the nominal rate), evenly spread over the
        tick, each with its own sequence number and sender stamp: a PLC whose publishing interval was set
        shorter than its cycle floods the subscriber at `factor` times the nominal rate (fault injection)."""
        if not 1 <= factor <= 100:
            raise ValueError(f"publish factor must be 1..100, got {factor}")
        self.publish_factor = int(factor)  # one int store: read by the publisher thread once per tick
        return self.publish_factor

    def set_clock_offset_ms(self, offset_ms: float) -> int:
        """Make the PLC's clock jump: every frame sent from now on is stamped `offset_ms` later (earlier when
        negative) than the host clock; 0 puts it back. Only the sender stamps move (UADP and the OPC UA
        SensorFrame's SourceTimestamp), not the command verifier's freshness clock. Returns the offset in ns."""
        if not np.isfinite(offset_ms):
            raise ValueError(f"clock offset must be a finite number of ms, got {offset_ms}")
        self.clock_offset_ns = int(round(offset_ms * 1e6))  # one int store: read by the publisher thread
        return self.clock_offset_ns

    def _sender_ns(self) -> int:
        """The frame's sender stamp: our clock plus any clock jump set by set_clock_offset_ms, unless a fault
        also skews the PLC clock or delays the network (a frame that waited in a queue arrives with an older stamp)."""
        if self.fault is None:
            return time.time_ns() + self.clock_offset_ns
        offset, delay = self.fault.timing(self.steps * self.dt)
        return time.time_ns() + self.clock_offset_ns + offset - delay

    def _step(self, reading: np.ndarray) -> None:
        d = self._disturbances.next()
        t_s = self.steps * self.dt
        if self.fault is not None:
            self.fault.plant(t_s, d)
        with self._lock:
            if not self._in_fallback and time.monotonic() - self._last_command_mono > self.s.command_timeout_s:
                self._in_fallback = True
                self.fallbacks += 1
            setpoint = 0.0 if self._in_fallback else self._setpoint
            setpoint = self.fault.setpoint(t_s, setpoint) if self.fault is not None else setpoint
            self.closed.step(setpoint, d)
            self.open.step(0.0, d)
            self.steps += 1
            if self.accepted:
                self._err_closed += abs(self.closed.exit - self.p.exit_target)
                self._err_open += abs(self.open.exit - self.p.exit_target)
                self._err_steps += 1
        self.closed.measure(d, reading)
        if self.fault is not None:
            self.fault.sensors(t_s, reading)
            diagnostic = self.fault.diagnostic(t_s)
            if diagnostic is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._report_fault, *diagnostic)

    def _report_fault(self, text: str, word: int) -> None:
        """plc_fault: the controller shows its vendor's diagnostic text and status word."""
        if self.server is not None:
            self._loop.create_task(self._write_value(self._diagnostic_node, ua.Variant(text, ua.VariantType.String)))
            self._loop.create_task(self._write_value(self._status_node, ua.Variant(word, ua.VariantType.UInt32)))

    def _publish_opcua(self, values: list[float], sent_ns: int, with_signals: bool) -> None:
        if self.server is None:
            return
        stamp = _EPOCH + timedelta(microseconds=sent_ns // 1000)
        dv = ua.DataValue(ua.Variant(values, ua.VariantType.Double), SourceTimestamp=stamp,
                          ServerTimestamp=stamp)
        for node in (self._frame_node, *self._twins.get(self._frame_node.nodeid, ())):
            self._loop.create_task(self.server.write_attribute_value(node.nodeid, dv))
        if not with_signals:
            return
        for node, v in zip(self._signal_nodes, values):
            dv = ua.DataValue(ua.Variant(v, ua.VariantType.Double))
            for target in (node, *self._twins.get(node.nodeid, ())):
                self._loop.create_task(self.server.write_attribute_value(target.nodeid, dv))

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        self.stop()
        if getattr(self, "_vendor_task", None) is not None:
            self._vendor_task.cancel()
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def stats(self) -> dict:
        with self._lock:
            n = max(self._err_steps, 1)
            return {
                "steps": self.steps,
                "accepted": self.accepted,
                "failsafe_commands": self.failsafe_commands,
                "rejected": self.rejected,
                "reject_reasons": dict(self.reject_reasons),
                "last_reject": self.last_reject,
                "fallbacks": self.fallbacks,
                "clock_offset_ms": self.clock_offset_ns / 1e6,  # the injected clock jump (set_clock_offset_ms)
                "sessions_accepted": self.sessions_accepted,
                "sessions_rejected": self.sessions_rejected,
                "sessions_ended": self.sessions_ended,
                "session_open": self.session_open,
                "session_nonces_issued": self.session_nonces_issued,
                "compared_steps": self._err_steps,
                "thickness_error_um": {"closed_loop": self._err_closed / n * 1000.0,
                                       "open_loop": self._err_open / n * 1000.0},
            }


async def _register_namespaces(server: Server, profile) -> tuple[int, int | None]:
    """Register the simulator's namespace and, for a vendor profile with `simulator_tags`, the vendor's at the
    profile's namespace index (the index a real controller's server uses, which that profile's NodeIds name).
    Returns (simulator index, vendor index or None). Indexes below the vendor's that neither takes get a
    placeholder namespace, so the vendor's lands where the profile expects it."""
    if not profile.simulator_tags():
        return await server.register_namespace(NAMESPACE_URI), None
    want = profile.namespace_index
    uri = getattr(profile, "namespace_uri", None) or VENDOR_NAMESPACE_URI.format(profile=profile.name)
    taken = await server.get_namespace_array()
    if want < len(taken):
        raise ValueError(f"profile {profile.name}: namespace index {want} is the server's own ({taken[want]}); "
                         f"a vendor namespace needs index {len(taken)} or higher")
    sim_idx = None
    while (n := len(await server.get_namespace_array())) <= want:
        if n == want:
            await server.register_namespace(uri)
        elif sim_idx is None:
            sim_idx = await server.register_namespace(NAMESPACE_URI)
        else:
            await server.register_namespace(f"{NAMESPACE_URI}:unused:{n}")
    if sim_idx is None:
        sim_idx = await server.register_namespace(NAMESPACE_URI)
    return sim_idx, want


def _node_id(text: str, uri: str, idx: int) -> ua.NodeId:
    """A profile's NodeId text (`ns=<i>;...` or `nsu=<vendor uri>;...`) as a NodeId in the vendor namespace."""
    if text.startswith("nsu="):
        named, rest = text[4:].split(";", 1)
        if named != uri:
            raise ValueError(f"{text}: namespace {named!r} is not the vendor namespace {uri!r}")
        text = f"ns={idx};{rest}"
    node_id = ua.NodeId.from_string(text)
    if node_id.NamespaceIndex != idx:
        raise ValueError(f"{text}: not in the vendor namespace (index {idx})")
    return node_id
