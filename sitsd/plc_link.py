"""The OPC UA session to the PLC: connect (message security, command node checks, the tpm-session
binding, event and frame subscriptions) and send commands as writes or method calls.

Owned by the daemon's I/O thread; a reconnect builds a new session the same way.

A dead session is reported through `on_lost(reason)`, never by raising into the caller: asyncua's
connection supervisor (the socket closing, or its server-state probe every `WATCHDOG_S` failing)
fires the client's `connection_lost_callback`, and the frame subscription reports its end
(`plc.opcua_source`). Reports from a session that was already replaced or closed are ignored.
The daemon decides what to do (sitsd/daemon.py: `_link_down`, `_reconnect`).

tpm-session: the credential the PLC checks covers the session PCR and the measurement PCR with its log
(attestation/session.py), so it goes stale when something is measured after the bind (a config reload, a hot
swap or rollback, a live deploy, a re-measurement after a TPM reset). `watch_measurements` subscribes to the
daemon's measurement log; each event (and `request_rebind`) binds the session key again on the live session: a
fresh nonce, a new quote, a new credential written to the PLC. Events that come in a burst are bound once. A
re-bind the PLC refuses (its pins do not match what now runs), or that cannot be made (TPM), ends the session
(`on_lost`): nothing more is sent under a credential that no longer says what runs, and every reconnect binds
again with the then-current log. While the session key is unbound (a TPM reset being re-measured) the re-bind
waits for the re-measurement, which requests one when it is done.

A credential carries at most 256 log entries in at most 32 KiB, and the log grows by one event per reload or swap, so
the link has every log it watches compacted (attestation/measurement.py): a measurement that finds the log at
`compact_at_events()` events (COMPACT_AT_EVENTS, 128; the environment variable SITSD_MEASUREMENT_COMPACT_AT overrides
it, for tests) or COMPACT_AT_BYTES of credential entries first archives it as measurements-compacted-<ns>.jsonl,
resets PCR 23 and measures what runs again from reset, on the measuring thread (never this event loop) with the
TPM calls bounded; the re-bind that event asks for carries the short log. A bind also compacts first when the log
is due (a compaction that failed before is retried there). A log a credential cannot carry fails the bind with a
message that says so (a `plc_link` alert when it was a re-bind). Counters: `rebinds`, `rebind_failures`,
`compactions` (sitsctl status: plc_link, measurement_log).
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from asyncua import Client, ua

from plc.errors import TransportError
from plc.opcua_events import PlcEventWatcher
from plc.opcua_security import SECURITY_MODES, SECURITY_POLICY, Pki, TrustListValidator, thumbprint
from plc.opcua_source import OpcUaSubscriptionSource
from plc.profiles import get_profile

from .config import Config
from .errors import StartupError

# status codes a server answers with when it does not accept the client's certificate
_CERT_REFUSED = {ua.StatusCodes.BadSecurityChecksFailed, ua.StatusCodes.BadCertificateUntrusted,
                 ua.StatusCodes.BadCertificateInvalid, ua.StatusCodes.BadIdentityTokenRejected,
                 ua.StatusCodes.BadCertificateUriInvalid, ua.StatusCodes.BadCertificateUseNotAllowed}
# asyncua reads the server state this often (and gives the read as long to answer) to catch a PLC that went
# away without closing the socket: a dead link is noticed within about 2 * WATCHDOG_S
WATCHDOG_S = 1.0
CLOSE_TIMEOUT_S = 1.0  # a polite CloseSession to a PLC that may be gone waits no longer than this
COMPACT_AT_ENV = "SITSD_MEASUREMENT_COMPACT_AT"  # overrides COMPACT_AT_EVENTS (tests: a short log compacts soon)


def compact_at_events() -> int:
    """The measurement-log length at which the link's log is compacted: COMPACT_AT_EVENTS, or
    SITSD_MEASUREMENT_COMPACT_AT when it holds a whole number in MIN_COMPACT_AT..MAX_LOG_EVENTS / 2 (else ignored)."""
    from attestation.measurement import COMPACT_AT_EVENTS, MIN_COMPACT_AT
    from attestation.session import MAX_LOG_EVENTS

    raw = os.environ.get(COMPACT_AT_ENV, "").strip()
    if raw.isdigit() and MIN_COMPACT_AT <= int(raw) <= MAX_LOG_EVENTS // 2:
        return int(raw)
    return COMPACT_AT_EVENTS


class PlcLink:
    def __init__(self, cfg: Config, *, signer, source, on_plc_event, device_key_file: Path, model_sha256: bytes,
                 log, on_lost: Callable[[str], None] | None = None, measurements: Callable[[], object] | None = None) \
            -> None:
        self.cfg = cfg
        self.measurements = measurements  # the daemon's current MeasurementLog (PCR 23), bound with the session key
        self.on_lost = on_lost
        self.signer = signer
        self.source = source
        self.on_plc_event = on_plc_event
        self.device_key_file = device_key_file
        self.model_sha256 = model_sha256
        self.log = log
        self.client: Client | None = None
        self.command_node = None
        self.command_owner = None
        self._generation = 0  # bumped by connect() and close(): loss reports of older sessions are ignored
        self._aio: asyncio.AbstractEventLoop | None = None  # the I/O loop the session lives on (set by connect)
        self._rebind_pending = False
        self._rebind_task: asyncio.Task | None = None
        self._watched = None  # the measurement log whose listeners hold `_on_measured`
        self.rebinds = 0  # credentials written after a measurement (not counting connect's own bind)
        self.rebind_failures = 0
        self.last_bound_value: bytes | None = None  # the measurement PCR value of the newest credential written
        self.compactions = 0  # measurement-log compactions since start (all logs: a TPM reset starts a new one)
        self.compaction_failures = 0

    @property
    def connected(self) -> bool:
        return self.command_node is not None

    @property
    def generation(self) -> int:
        """Identifies the current session; pass it to report_lost() for something noticed on it."""
        return self._generation

    def report_lost(self, generation: int, reason: str) -> None:
        """The session `generation` is dead; ignored when that session was already replaced or closed."""
        if generation == self._generation and self.on_lost is not None:
            self.on_lost(reason)

    async def connect(self) -> None:
        p = self.cfg.plc
        self._aio = asyncio.get_running_loop()
        self.watch_measurements()
        self._rebind_pending = False  # this connect binds with the log as it is now
        self._generation += 1
        generation = self._generation
        # auto_reconnect stays off: a new session has to be checked and bound (tpm-session) again, which
        # is connect()'s job, and requests must fail at once instead of waiting for asyncua to reconnect
        client = Client(p.endpoint, timeout=p.timeout_s, watchdog_intervall=WATCHDOG_S, auto_reconnect=False)

        async def connection_lost(exc: Exception) -> None:  # asyncua's supervisor, on the I/O thread
            self.report_lost(generation, f"session lost: {exc!r}")

        client.connection_lost_callback = connection_lost
        validator = None
        try:
            if p.security != "none":
                validator = await self._secure(client)
            await client.connect()
        except StartupError:
            raise
        except ua.UaStatusCodeError as exc:
            if validator is not None and validator.last_rejected is not None:
                raise StartupError(f"the PLC at {p.endpoint}: {validator.explain()}") from exc
            if validator is not None and exc.code in _CERT_REFUSED:
                pki = Pki(p.pki_dir)
                raise StartupError(
                    f"the PLC at {p.endpoint} refused this client's certificate (SHA-1 "
                    f"{thumbprint(pki.load_own())}): {type(exc).__name__}\n  fix: add {pki.own_cert} to the "
                    f"PLC's trusted certificates") from exc
            raise StartupError(f"cannot connect to the PLC at {p.endpoint}: {exc}") from exc
        except (OSError, asyncio.TimeoutError, ua.UaError) as exc:
            raise StartupError(f"cannot connect to the PLC at {p.endpoint}: {exc or type(exc).__name__}\n"
                               f"  fix: check plc.endpoint and that the PLC's OPC UA server is running") from exc
        try:
            # vendor addresses (S7 `DB_AGC.RollGapCommand`, Logix `Program:AGC.Gap`, MELSEC `D1000`) go through the
            # profile's parser (PlcSection.node_id); errors name the address as written and the NodeId it became
            command_id = p.node_id(p.command_node)
            command = _shown(p.command_node, command_id)
            node = client.get_node(await resolve_node(client, command_id, "plc.command_node"))
            owner = None
            try:
                if p.command_mode == "method":
                    owner = client.get_node(await resolve_node(client, p.node_id(p.command_object),
                                                                     "plc.command_object"))
                    if await node.read_node_class() != ua.NodeClass.Method:
                        raise StartupError(f"plc.command_node {command}: is not a Method node "
                                           f"(command_mode: method)")
                else:
                    vtype = await node.read_data_type_as_variant_type()
                    if vtype != ua.VariantType.ByteString:
                        raise StartupError(f"plc.command_node {command}: is {vtype.name}, expected "
                                           f"ByteString (the command envelope)")
            except ua.UaStatusCodeError as exc:
                raise StartupError(f"plc.command_node {command}: not found on the PLC ({exc})") from exc
            if hasattr(self.signer, "bind"):
                await self._bind_session(client)
            if p.status_node or p.diagnostic_node:
                status = await resolve_node(client, p.node_id(p.status_node), "plc.status_node") \
                    if p.status_node else None
                diagnostic = await resolve_node(client, p.node_id(p.diagnostic_node), "plc.diagnostic_node") \
                    if p.diagnostic_node else None
                await PlcEventWatcher(get_profile(p.profile), self.on_plc_event).subscribe(client, status, diagnostic)
            if isinstance(self.source, OpcUaSubscriptionSource):
                frames = await resolve_node(client, self.cfg.transport.node, "transport.node")
                try:
                    await self.source.subscribe(client, frames,
                                                on_lost=lambda reason: self.report_lost(generation, reason))
                except TransportError as exc:
                    raise StartupError(str(exc)) from exc
        except BaseException:
            await _close_client(client)
            raise
        self.client, self.command_node, self.command_owner = client, node, owner
        if self._rebind_pending:  # measured after this connect's bind: the PLC's credential is already stale
            self._start_rebind("a measurement during connect")

    async def _bind_session(self, client: Client) -> None:
        """tpm-session: quote the session key against the PLC's fresh nonce and hand it the credential."""
        p = self.cfg.plc
        if not (p.session_nonce_node and p.session_credential_node):
            raise StartupError("attestation.signing tpm-session needs plc.session_nonce_node and "
                               "plc.session_credential_node")
        nonce_node = client.get_node(await resolve_node(client, p.node_id(p.session_nonce_node),
                                                              "plc.session_nonce_node"))
        cred_node = client.get_node(await resolve_node(client, p.node_id(p.session_credential_node),
                                                             "plc.session_credential_node"))
        nonce = await nonce_node.read_value()
        if not isinstance(nonce, (bytes, bytearray)) or not 16 <= len(nonce) <= 64:
            raise StartupError(f"plc.session_nonce_node {p.session_nonce_node}: expected a 16-64 byte nonce")
        # the quote needs the TPM: on a thread of its own (bounded by the signer), never on this event loop, whose
        # stall by a hung TPM kept SIGTERM from being handled
        from attestation.errors import AttestationError
        from attestation.session import MAX_CREDENTIAL_BYTES, call_in_thread

        log = self.measurements() if self.measurements is not None else None
        if getattr(self.cfg.attestation, "session_credential", "measured") == "model-only":
            log = None  # a version 1 credential (PCR 16 only) for a PLC verifier that predates version 2
        if log is not None and getattr(log, "tpm", None) is not None:
            await self._compact_before_bind(log)
        try:
            credential = await call_in_thread(self.signer.bind, bytes(nonce), log)
        except AttestationError as exc:
            raise StartupError(f"cannot bind the session key for the PLC: {exc}\n  fix: see the `tpm` alert and "
                               "`tpm` in sitsctl status; sitsd retries by itself once the TPM answers and the running "
                               "model is re-measured (docs/alerts.md, tpm)") from exc
        data = credential.to_cbor()
        if len(data) > MAX_CREDENTIAL_BYTES:  # the PLC would refuse it as malformed: say why here
            raise StartupError(f"the session credential is {len(data)} bytes, more than a PLC takes "
                               f"({MAX_CREDENTIAL_BYTES}): its measurement log has {len(credential.measurement_log)} "
                               f"events{self._compaction_note(log)}\n  fix: see `measurement_log` in sitsctl status; a "
                               "restart measures from reset")
        if credential.certification is not None:
            uncertified = ""
        elif getattr(self.signer, "certification", None) is not None:
            uncertified = (", or requires a certified session key (attestation.certify_session), which ended when a "
                           "model or module other than the certified ones was swapped in: restart sitsd with an "
                           "approved deployment")
        else:
            uncertified = (", or requires a session key certified by the device's policy key (set "
                           "attestation.certify_session: true with an approval)")
        try:
            await cred_node.write_value(ua.DataValue(ua.Variant(data, ua.VariantType.ByteString)))
        except ua.UaStatusCodeError as exc:
            raise StartupError(
                f"the PLC refused the session credential ({exc}): it does not trust this device's attestation key "
                f"or expects another model{uncertified}\n  fix: enrol {self.device_key_file} and "
                f"the model hash {self.model_sha256.hex()[:16]}… in the PLC's session verifier") from exc
        measured = getattr(credential, "measurement_pcr", None)
        self.last_bound_value = credential.measurement_value if measured is not None else None
        self.log.info("session key bound to the TPM quote", session_key=self.signer.key_id.hex(),
                      nonce=bytes(nonce).hex()[:16], certified=credential.certification is not None,
                      measurement_pcr=measured, measured_events=len(credential.measurement_log) if measured else None,
                      measured_value=credential.measurement_value.hex()[:16] if measured else None)

    async def _compact_before_bind(self, log) -> None:
        """Compact a log that is due (long, or damaged by a failed compaction) before it is bound, on a thread of its
        own (TPM calls, bounded). A failure matters only when the log cannot be bound as it is: StartupError then."""
        from attestation.session import MAX_LOG_EVENTS, call_in_thread

        self._enable_compaction(log)
        due = log.compaction_due() if hasattr(log, "compaction_due") else None
        if due is None:
            return
        try:
            await call_in_thread(log.compact, f"before binding: {due}")
        except Exception as exc:  # MeasurementError: logged (and counted) by _on_compacted already
            first = (str(exc) or type(exc).__name__).splitlines()[0]
            if log.damaged is not None:
                why = (f"it does not explain PCR {log.pcr} ({log.damaged}) and resetting and re-measuring the PCR "
                       f"failed ({first})")
            elif len(log.events) > MAX_LOG_EVENTS:
                why = (f"it has {len(log.events)} events (a credential carries at most {MAX_LOG_EVENTS}) and "
                       f"compacting it failed ({first})")
            else:
                return  # bound as it is; compacted at a later record or bind
            raise StartupError(f"the measurement log of PCR {log.pcr} cannot be bound: {why}\n  fix: see `tpm` and "
                               "`measurement_log` in sitsctl status; each reconnect and each measurement retries the "
                               "compaction, a restart measures from reset") from exc

    def _compaction_note(self, log) -> str:
        if log is None or not hasattr(log, "compaction_due"):
            return ""
        if log.compaction_error:
            return f"; compacting it failed ({log.compaction_error})"
        return f" (compacted at {log.compact_at} events or {log.compact_bytes} bytes of entries)"

    def _enable_compaction(self, log) -> None:
        """Have a tpm-session log compacted long before a credential could not carry it (attestation/measurement.py)."""
        if log is None or getattr(log, "tpm", None) is None or not hasattr(log, "compact_at"):
            return
        from attestation.measurement import COMPACT_AT_BYTES

        if log.compact_at is None:
            log.compact_at = compact_at_events()
        if log.compact_bytes is None:
            log.compact_bytes = COMPACT_AT_BYTES
        log.on_compacted = self._on_compacted

    def _on_compacted(self, info: dict) -> None:
        """From the measuring thread (attestation.measurement.MeasurementLog.on_compacted): a line in the journal."""
        if info.get("error"):
            self.compaction_failures += 1
            self.log.error("measurement log compaction failed", reason=info.get("reason"), error=info["error"],
                           damaged=info.get("damaged"))
            return
        self.compactions += 1
        self.log.info("measurement log compacted: PCR 23 reset and what runs measured again from reset",
                      reason=info.get("reason"), archived=info.get("archived"), events_before=info.get("events_before"),
                      events_after=info.get("events_after"), value=str(info.get("value", ""))[:16], ms=info.get("ms"),
                      file_error=info.get("file_error"))

    # -- re-binding after a measurement -----------------------------------------------------------------------
    def watch_measurements(self) -> None:
        """Subscribe to the daemon's current measurement log (again, when a re-measurement replaced it), and have it
        compacted when it grows long."""
        log = self.measurements() if self.measurements is not None else None
        if log is self._watched or not hasattr(self.signer, "bind"):
            return
        if self._watched is not None and self._on_measured in self._watched.listeners:
            self._watched.listeners.remove(self._on_measured)
        self._watched = log
        if log is not None and self._on_measured not in log.listeners:
            log.listeners.append(self._on_measured)
        self._enable_compaction(log)

    def _on_measured(self, event) -> None:
        self.request_rebind(f"measured {event.kind} {event.name}")

    def request_rebind(self, reason: str = "requested") -> None:
        """Thread-safe: bind the session key again on the live session (a new credential for the PLC), soon. Requests
        that come while one is bound are coalesced into one more bind. Nothing while no session is up: the
        next connect binds anyway."""
        aio = self._aio
        if aio is None or aio.is_closed() or not hasattr(self.signer, "bind"):
            return
        try:
            aio.call_soon_threadsafe(self._schedule_rebind, reason)
        except RuntimeError:  # the loop closed meanwhile: stopping
            pass

    def _schedule_rebind(self, reason: str) -> None:
        self.watch_measurements()  # a re-measurement after a TPM reset replaces the log
        self._rebind_pending = True  # a connect that starts from now binds the log as it is then (and clears this)
        self._start_rebind(reason)

    def _start_rebind(self, reason: str) -> None:
        if self.client is None:
            return  # not connected: a connect in progress re-binds when it is done (`_rebind_pending`), else the next
        if self._rebind_task is None or self._rebind_task.done():
            self._rebind_task = asyncio.get_running_loop().create_task(self._rebind(reason), name="plc-rebind")

    async def _rebind(self, reason: str) -> None:
        while self._rebind_pending:
            self._rebind_pending = False
            client, generation = self.client, self._generation
            if client is None or self.command_node is None:
                return
            if getattr(self.signer, "bound", True) is False:
                # a TPM reset being re-measured: nothing can be quoted now; the re-measurement requests a re-bind
                self.log.info("session re-bind deferred until the TPM is re-measured", reason=reason)
                return
            try:
                await self._bind_session(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # StartupError (the PLC refused, the TPM failed), a dead session
                if generation != self._generation:
                    return  # that session is gone anyway: the reconnect binds
                self.rebind_failures += 1
                first = str(exc).splitlines()[0]
                self.log.warning("session re-bind failed: the PLC session ends (nothing is sent under a credential "
                                 "that no longer says what runs); reconnecting binds again", reason=reason,
                                 error=first)
                self.report_lost(generation, f"re-binding the session key after {reason} failed: {first}")
                return
            self.rebinds += 1

    async def _secure(self, client: Client) -> TrustListValidator:
        """Basic256Sha256 with this device's certificate; the PLC's certificate must be in the trust list."""
        p = self.cfg.plc
        pki = Pki(p.pki_dir)
        if not pki.has_own():
            raise StartupError(f"plc.security is {p.security} but {pki.root} holds no client certificate\n"
                               f"  fix: sitsctl pki init --config <this config>, then add {pki.own_cert} to the "
                               f"PLC's trusted certificates (or set plc.security: none on an isolated test bench)")
        client.application_uri = p.application_uri
        validator = TrustListValidator(pki, peer_is_server=True)
        client.certificate_validator = validator
        try:
            await client.set_security(SECURITY_POLICY, str(pki.own_cert), str(pki.own_key),
                                      mode=SECURITY_MODES[p.security])
        except ua.UaError as exc:  # no endpoint with this policy and mode
            raise StartupError(f"the PLC at {p.endpoint} offers no Basic256Sha256 {p.security} endpoint: {exc}\n"
                               f"  fix: enable that security policy on the PLC or change plc.security") from exc
        return validator

    async def send(self, envelope: bytes) -> None:
        """One command to the PLC, as a variable write or a method call; a Bad status raises."""
        value = ua.Variant(envelope, ua.VariantType.ByteString)
        if self.command_owner is not None:
            await self.command_owner.call_method(self.command_node, value)
        else:
            await self.command_node.write_value(ua.DataValue(value))

    def mark_lost(self) -> None:
        """Stop using this session at once (`connected` turns False); close() tears it down."""
        self.command_node = self.command_owner = None

    async def close(self) -> None:
        """Forget the session and close it; bounded, so a PLC that is gone cannot hold up a reconnect."""
        task, self._rebind_task = self._rebind_task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        client, self.client = self.client, None
        self.command_node = self.command_owner = None
        self._generation += 1  # what the old client still reports is ignored
        if client is not None:
            await _close_client(client)


async def _close_client(client: Client) -> None:
    try:
        await asyncio.wait_for(client.disconnect(), CLOSE_TIMEOUT_S)
    except Exception:  # the session is already gone (or not answering): drop the socket
        try:
            client.disconnect_socket()
        except Exception:
            pass


def _shown(address: str, node_id: str) -> str:
    """An address for messages: as configured, and the NodeId a vendor profile made of it."""
    return address if address == node_id else f"{address} ({node_id})"


async def resolve_node(client: Client, text: str, field: str) -> ua.NodeId:
    """NodeId from config text; `nsu=<uri>;...` is looked up in the server's namespace array."""
    if text.startswith("nsu="):
        uri, rest = text[4:].split(";", 1)
        try:
            idx = await client.get_namespace_index(uri)
        except ValueError:
            raise StartupError(f"{field}: the PLC has no namespace {uri!r}") from None
        text = f"ns={idx};{rest}"
    return ua.NodeId.from_string(text)

