"""The OPC UA session to the PLC: connect (message security, command node checks, the tpm-session
binding, event and frame subscriptions) and send commands as writes or method calls.

Owned by the daemon's I/O thread; a reconnect builds a new session the same way.

A dead session is reported through `on_lost(reason)`, never by raising into the caller: asyncua's
connection supervisor (the socket closing, or its server-state probe every `WATCHDOG_S` failing)
fires the client's `connection_lost_callback`, and the frame subscription reports its end
(`plc.opcua_source`). Reports from a session that was already replaced or closed are ignored.
The daemon decides what to do (sitsd/daemon.py: `_link_down`, `_reconnect`).
"""
from __future__ import annotations

import asyncio
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


class PlcLink:
    def __init__(self, cfg: Config, *, signer, source, on_plc_event, device_key_file: Path, model_sha256: bytes,
                 log, on_lost: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
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
            node = client.get_node(await resolve_node(client, p.node_id(p.command_node), "plc.command_node"))
            owner = None
            try:
                if p.command_mode == "method":
                    owner = client.get_node(await resolve_node(client, p.node_id(p.command_object),
                                                                     "plc.command_object"))
                    if await node.read_node_class() != ua.NodeClass.Method:
                        raise StartupError(f"plc.command_node {p.command_node}: is not a Method node "
                                           f"(command_mode: method)")
                else:
                    vtype = await node.read_data_type_as_variant_type()
                    if vtype != ua.VariantType.ByteString:
                        raise StartupError(f"plc.command_node {p.command_node}: is {vtype.name}, expected "
                                           f"ByteString (the command envelope)")
            except ua.UaStatusCodeError as exc:
                raise StartupError(f"plc.command_node {p.command_node}: not found on the PLC ({exc})") from exc
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
        from attestation.session import call_in_thread

        try:
            credential = await call_in_thread(self.signer.bind, bytes(nonce))
        except AttestationError as exc:
            raise StartupError(f"cannot bind the session key for the PLC: {exc}\n  fix: see the `tpm` alert and "
                               "`tpm` in sitsctl status; sitsd retries by itself once the TPM answers and the running "
                               "model is re-measured (docs/alerts.md, tpm)") from exc
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
            await cred_node.write_value(ua.DataValue(ua.Variant(credential.to_cbor(), ua.VariantType.ByteString)))
        except ua.UaStatusCodeError as exc:
            raise StartupError(
                f"the PLC refused the session credential ({exc}): it does not trust this device's attestation key "
                f"or expects another model{uncertified}\n  fix: enrol {self.device_key_file} and "
                f"the model hash {self.model_sha256.hex()[:16]}… in the PLC's session verifier") from exc
        self.log.info("session key bound to the TPM quote", session_key=self.signer.key_id.hex(),
                      nonce=bytes(nonce).hex()[:16], certified=credential.certification is not None)

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

