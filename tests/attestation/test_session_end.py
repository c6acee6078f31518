"""SessionReplayState.end_current_session (attestation/session.py), the hook a PLC gateway uses when it refuses a
genuine re-bind (SESSION_ENDING_CODES), as the PLC simulator does; and sitsd's stale-credential gauge. Real swtpm."""
from types import SimpleNamespace

from asyncua import ua

from attestation.session import SESSION_ENDING_CODES, CredentialError, SessionReplayState, SessionVerifier
from plc.simulator import server
from plc.simulator.server import RollingMillSimulator, SimulatorSettings
from sitsd.metrics import credential_stale

from .test_session_replay import MODEL, bound, command, command_refused, signer_for


def test_ending_the_current_session_refuses_its_commands_until_a_new_credential(swtpm):
    signer = signer_for(swtpm)
    try:
        state = SessionReplayState()
        verifier = SessionVerifier(signer.device_public_key_pem(), MODEL, replay_state=state)
        assert verifier.end_current_session() is False  # nothing accepted yet
        session = verifier.accept(*bound(signer))
        session.verify(signer.sign_command(command(100)))
        assert verifier.end_current_session("its config is not pinned") is True
        assert state.end_current_session() is False  # already ended
        err = command_refused(session, signer.sign_command(command(101)))
        assert err.code == "ended" and "its config is not pinned" in err.reason
        # the same key binds again with a fresh nonce; the ended session stays ended, the new one runs
        again = verifier.accept(*bound(signer))
        again.verify(signer.sign_command(command(102)))
        assert command_refused(session, signer.sign_command(command(103))).code == "ended"
        # a later accept supersedes the new one as before
        verifier.accept(*bound(signer))
        assert command_refused(again, signer.sign_command(command(104))).code == "superseded"
    finally:
        signer.close()


def test_the_simulator_ends_the_acceptors_session_on_a_session_ending_refusal(swtpm):
    assert server.SESSION_ENDING_CODES is SESSION_ENDING_CODES  # re-exported for existing importers
    signer = signer_for(swtpm)
    try:
        class Acceptor:  # a gateway's acceptor: one replay state, refuses the second credential by its pins
            replay_state = SessionReplayState()
            sessions: list = []

            def __call__(self, credential: bytes, nonce: bytes):
                if self.sessions:
                    raise CredentialError("the config the log names is not the pinned one", "config")
                session = SessionVerifier(signer.device_public_key_pem(), MODEL,
                                          replay_state=self.replay_state).accept(credential, nonce)
                self.sessions.append(session)
                return session.verify

        acceptor = Acceptor()
        sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9"), None, session_acceptor=acceptor)
        node = SimpleNamespace(attributes={"value": SimpleNamespace(value=None)})

        def write_credential():
            nonce = sim.session_nonce
            data = signer.bind(nonce).to_cbor()
            sim._on_credential_write(node, "value", ua.DataValue(ua.Variant(data, ua.VariantType.ByteString)))

        write_credential()
        (session,) = acceptor.sessions
        session.verify(signer.sign_command(command(200)))
        try:
            write_credential()
            raise AssertionError("the refused credential was accepted")
        except ua.UaStatusCodeError:
            pass
        assert sim.stats()["sessions_ended"] == 1 and sim.stats()["session_open"] is False
        assert command_refused(session, signer.sign_command(command(201))).code == "ended"
    finally:
        signer.close()


def test_the_stale_credential_gauge():
    log = SimpleNamespace(value=b"\1" * 32)
    assert credential_stale(SimpleNamespace(last_bound_value=None), log) is False  # never bound (or version 1)
    assert credential_stale(SimpleNamespace(last_bound_value=b"\1" * 32), log) is False
    assert credential_stale(SimpleNamespace(last_bound_value=b"\2" * 32), log) is True
