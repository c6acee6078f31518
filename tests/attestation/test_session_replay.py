"""Replay protection across tpm-session sessions (real swtpm): a credential is usable once (the PLC's nonce is
consumed by every credential write), a new session cannot accept a command sequence an earlier one accepted, and
an earlier session's key is refused. Both the reusable SessionVerifier and the PLC simulator over OPC UA."""
import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from attestation.envelope import Command
from attestation.errors import EnvelopeError
from attestation.session import (CredentialError, SessionReplayState, SessionVerifier, TpmSessionSigner)
from plc.simulator.server import RollingMillSimulator, SimulatorSettings
from sitsd.plcsim import SessionAcceptor

from .plc_session import session_nodes, write

MODEL = hashlib.sha256(b"rolling mill model").digest()


def command(seq: int, values=(0.01,)) -> Command:
    now = time.time_ns()
    return Command("ns=2;s=RollingMill.RollGapCommand", values, seq, seq, now, now + 500_000_000, MODEL)


def signer_for(swtpm) -> TpmSessionSigner:
    signer = TpmSessionSigner(swtpm.tcti)
    signer.measure_model(MODEL)
    return signer


def bound(signer: TpmSessionSigner) -> tuple[bytes, bytes]:
    """(credential CBOR, nonce) for a fresh nonce."""
    nonce = os.urandom(32)
    return signer.bind(nonce).to_cbor(), nonce


def refused(verifier: SessionVerifier, data: bytes, nonce: bytes) -> CredentialError:
    with pytest.raises(CredentialError) as info:
        verifier.accept(data, nonce)
    return info.value


def command_refused(session, envelope: bytes) -> EnvelopeError:
    with pytest.raises(EnvelopeError) as info:
        session.verify(envelope)
    return info.value


# --- SessionVerifier (the reusable PLC-side library) --------------------------------------------------------------

def test_a_credential_is_accepted_once_per_nonce(swtpm):
    signer = signer_for(swtpm)
    try:
        verifier = SessionVerifier(signer.device_public_key_pem(), MODEL)
        data, nonce = bound(signer)
        session = verifier.accept(data, nonce)
        session.verify(signer.sign_command(command(100)))
        err = refused(verifier, data, nonce)  # the same credential written again, for the same nonce
        assert err.code == "nonce-used" and "already accepted" in err.reason
        # the refusal changed nothing: the accepted session goes on
        session.verify(signer.sign_command(command(101)))
        assert verifier.sequence_high_water == 101
    finally:
        signer.close()


def test_a_re_accepted_session_does_not_reset_replay_protection(swtpm):
    """The PoC of the review: command 100 accepted, the session accepted again (a reconnect binds the same key
    against a fresh nonce), command 100 replayed: refused, as on the first session."""
    signer = signer_for(swtpm)
    try:
        verifier = SessionVerifier(signer.device_public_key_pem(), MODEL)
        first = verifier.accept(*bound(signer))
        captured = signer.sign_command(command(100))
        first.verify(captured)
        assert command_refused(first, captured).code == "replay"

        second = verifier.accept(*bound(signer))  # the current key binds again: accepted
        assert second.last_sequence == 100  # seeded with the high-water mark
        err = command_refused(second, captured)
        assert err.code == "replay" and "earlier session accepted up to 100" in err.reason
        assert command_refused(second, signer.sign_command(command(50))).code == "replay"
        second.verify(signer.sign_command(command(101)))
        # the earlier session's verifier is over: nothing goes through it any more, not even a new sequence
        err = command_refused(first, signer.sign_command(command(102)))
        assert err.code == "superseded"
        second.verify(signer.sign_command(command(102)))
        assert verifier.sequence_high_water == 102
    finally:
        signer.close()


def test_an_earlier_sessions_key_is_refused(swtpm):
    """A daemon restart makes a new session key; the PLC cannot be rolled back to the earlier run's key, even with a
    credential quoted against a fresh nonce."""
    old = signer_for(swtpm)
    new = None
    try:
        verifier = SessionVerifier(old.device_public_key_pem(), MODEL)
        verifier.accept(*bound(old)).verify(old.sign_command(command(10)))
        new = signer_for(swtpm)  # resets the PCR and measures the same model: old's quotes still add up
        session = verifier.accept(*bound(new))
        session.verify(new.sign_command(command(20)))
        err = refused(verifier, *bound(old))
        assert err.code == "retired" and old.key_id.hex() in err.reason
        assert verifier.replay_state.is_retired(old.key_id) and not verifier.replay_state.is_retired(new.key_id)
        session.verify(new.sign_command(command(21)))  # the refusal did not end the current session
        # a verifier on the same PLC state (rebuilt, e.g. for a re-provisioned device key) remembers all of it
        rebuilt = SessionVerifier(old.device_public_key_pem(), MODEL, replay_state=verifier.replay_state)
        assert refused(rebuilt, *bound(old)).code == "retired"
        again = rebuilt.accept(*bound(new))
        assert command_refused(again, new.sign_command(command(21))).code == "replay"
        again.verify(new.sign_command(command(22)))
    finally:
        old.close()
        if new is not None:
            new.close()


def test_replay_memory_is_bounded(swtpm):
    signer = signer_for(swtpm)
    try:
        state = SessionReplayState(max_remembered=2)
        verifier = SessionVerifier(signer.device_public_key_pem(), MODEL, replay_state=state)
        creds = [bound(signer) for _ in range(3)]
        for data, nonce in creds:
            verifier.accept(data, nonce)
        assert len(state._nonces) == 2 and creds[0][1] not in state._nonces
        assert refused(verifier, *creds[2]).code == "nonce-used"
        with pytest.raises(ValueError):
            SessionReplayState(max_remembered=0)
    finally:
        signer.close()


# --- the PLC simulator over OPC UA ----------------------------------------------------------------------------------

async def _plc_scenario(swtpm, key_file: Path) -> dict:
    signer = signer_for(swtpm)
    key_file.write_bytes(signer.device_public_key_pem())
    sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9"), None,
                               session_acceptor=SessionAcceptor(key_file, MODEL))
    await sim.start()
    seen: dict = {}
    try:
        async with session_nodes(sim.endpoint) as (nonce_node, cred_node, cmd_node):  # security none: any client may write SessionCredential

            async def bind() -> bytes:
                nonce = await nonce_node.read_value()
                return await asyncio.to_thread(lambda: signer.bind(bytes(nonce)).to_cbor())

            first_nonce = await nonce_node.read_value()
            credential = await asyncio.to_thread(lambda: signer.bind(bytes(first_nonce)).to_cbor())
            seen["first_accepted"] = await write(cred_node, credential)
            second_nonce = await nonce_node.read_value()
            seen["nonce_changed_on_accept"] = second_nonce != first_nonce
            seen["same_credential_again"] = await write(cred_node, credential)  # captured and written again
            seen["reject_after_rewrite"] = sim.last_reject
            third_nonce = await nonce_node.read_value()
            seen["nonce_changed_on_refusal"] = third_nonce not in (first_nonce, second_nonce)
            seen["garbage_credential"] = await write(cred_node, b"\xa0")
            seen["nonce_changed_on_garbage"] = await nonce_node.read_value() != third_nonce

            captured = signer.sign_command(command(100))
            seen["command_100"] = await write(cmd_node, captured)
            seen["rebind"] = await write(cred_node, await bind())  # a reconnect: fresh nonce, same key
            seen["replayed_100"] = await write(cmd_node, captured)
            seen["reject_after_replay"] = sim.last_reject
            seen["command_101"] = await write(cmd_node, signer.sign_command(command(101)))

            newer = signer_for(swtpm)  # a daemon restart: a new session key
            try:
                nonce = await nonce_node.read_value()
                seen["new_key"] = await write(cred_node, await asyncio.to_thread(
                    lambda: newer.bind(bytes(nonce)).to_cbor()))
                seen["old_key"] = await write(cred_node, await bind())
                seen["reject_after_old_key"] = sim.last_reject
                seen["new_key_102"] = await write(cmd_node, newer.sign_command(command(102)))
                seen["new_key_101"] = await write(cmd_node, newer.sign_command(command(101)))
            finally:
                newer.close()
        seen["stats"] = sim.stats()
        return seen
    finally:
        signer.close()
        await sim.close()


def test_plc_simulator_consumes_the_nonce_and_keeps_replay_protection(swtpm, tmp_path):
    seen = asyncio.run(_plc_scenario(swtpm, tmp_path / "device.pub.pem"))
    assert seen["first_accepted"] and seen["nonce_changed_on_accept"]
    assert not seen["same_credential_again"] and "another nonce" in seen["reject_after_rewrite"]
    assert seen["nonce_changed_on_refusal"]
    assert not seen["garbage_credential"] and seen["nonce_changed_on_garbage"]
    assert seen["command_100"] and seen["rebind"]
    assert not seen["replayed_100"] and "earlier session accepted up to 100" in seen["reject_after_replay"]
    assert seen["command_101"]
    assert seen["new_key"] and not seen["old_key"] and "earlier session" in seen["reject_after_old_key"]
    assert seen["new_key_102"] and not seen["new_key_101"]
    stats = seen["stats"]
    assert stats["sessions_accepted"] == 3 and stats["sessions_rejected"] == 3
    # forged, replayed and garbled credentials (another nonce, a retired key, not CBOR) leave the open session
    # running: anyone who can write the node could write one (only an authentic refusal ends it)
    assert stats["sessions_ended"] == 0 and stats["session_open"] is True
    assert stats["session_nonces_issued"] == 1 + 6  # one at start, one per credential write
    assert stats["accepted"] == 3 and stats["reject_reasons"]["replay"] == 2


# --- sitsd against the simulator: re-binding still works ----------------------------------------------------------

def test_a_restarted_daemon_binds_a_new_session_key_on_the_same_plc(plcsim, tmp_path):
    """sitsd restarted against a PLC that stays up: the new run reads the fresh nonce, its new session key is
    accepted (the old one is retired) and its commands go through the PLC's cross-session sequence check."""
    import subprocess

    from attestation.tpm import Swtpm

    from ..conftest import EXAMPLE_CONFIG, REPO, sim_stats, sitsd_args, wait_for, wait_ready
    from .test_tpm_reset import _Daemon

    tpm = Swtpm(tmp_path / "tpm").start()
    d = None
    try:
        d = _Daemon(plcsim, tmp_path, tpm)
        wait_for(lambda s: s["counters"]["commands"] > 30, 30, "commands flowing", d.status)
        d.sigterm()
        assert d.proc.returncode == 0, d.log.read_text()[-3000:]
        before = sim_stats(d.sim)
        assert before["sessions_accepted"] == 1 and before["accepted"] > 30

        d.log = tmp_path / "sitsd-2.log"
        d.proc = subprocess.Popen(
            sitsd_args(EXAMPLE_CONFIG, plc__endpoint=d.endpoint, transport__url=d.udp_url,
                       attestation__tcti=tpm.tcti, plc__security="none", plc__timeout_s=2,
                       audit__directory=d.audit, control__socket=d.control),
            stderr=open(d.log, "wb"), cwd=REPO, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
        wait_ready(d.proc, d.log)
        after = wait_for(lambda s: s["accepted"] >= before["accepted"] + 50, 30,
                         "the restarted daemon's commands accepted by the same PLC", lambda: sim_stats(d.sim))
        assert after["sessions_accepted"] == 2 and after["sessions_rejected"] == 0
        assert after["rejected"] == before["rejected"] == 0, after["reject_reasons"]
        assert after["session_nonces_issued"] == 3
        assert "session key bound to the TPM quote" in d.log.read_text()
        assert d.sigterm() < 10 and d.proc.returncode == 0
    finally:
        if d is not None:
            d.kill()
        tpm.stop()
