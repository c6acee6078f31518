"""A running sitsd (tpm-session, real swtpm, real PLC simulator) hands the PLC a new session credential whenever it
measures something into PCR 23 after binding: a config reload, a module hot swap, a rollback. The PLC then sees
what runs (the credential's PCR 23 log, replayed to the quoted value). A PLC that refuses the new credential ends
the session: nothing more is sent under the stale one, and the reconnect binds again."""
from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import time

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.session import SessionCredential, SessionVerifier
from attestation.tpm import Swtpm
from sitsd.control import request

from ..conftest import DEMO_MODEL, REPO, example_config_data, sim_stats, sitsd_args, wait_for, wait_ready
from ..sitsd.test_hotswap import module_versions

MODEL = hashlib.sha256(DEMO_MODEL.read_bytes()).digest()
CREDENTIAL_NODE = "nsu=urn:sits2026:plc-simulator;s=RollingMill.SessionCredential"


def plc_credential(endpoint: str) -> SessionCredential:
    """The credential the PLC accepted last (the simulator keeps it in its SessionCredential variable)."""
    from asyncua import Client

    from sitsd.plc_link import resolve_node

    async def read() -> bytes:
        async with Client(endpoint, timeout=5) as client:
            return await client.get_node(await resolve_node(client, CREDENTIAL_NODE, "credential")).read_value()

    return SessionCredential.from_cbor(asyncio.run(read()))


def verified(cred: SessionCredential, ak_pem: bytes, **pins):
    """The credential checked as a PLC checks it (a fresh verifier: the simulator consumed its nonce already)."""
    return SessionVerifier(ak_pem, MODEL, freshness=False, **pins).accept(cred.to_cbor(), cred.verifier_nonce)


def start_line(plcsim, tmp_path, data: dict, plc_args: tuple = ()):
    """swtpm, the PLC simulator (tpm-session, trusting the daemon's AK, pinning the demo model, plus `plc_args`) and
    sitsd on `data`: (tpm, audit, control, log, config, endpoint, sim, proc)."""
    tpm = Swtpm(tmp_path / "tpm").start()
    audit, control, log = tmp_path / "audit", tmp_path / "c.sock", tmp_path / "sitsd.log"
    config = tmp_path / "rolling-mill.yaml"
    config.write_text(yaml.safe_dump(data))
    endpoint, udp_url, sim = plcsim(audit / "device.pub.pem", model_sha256=MODEL.hex(), session=True,
                                    extra_args=tuple(plc_args))
    proc = subprocess.Popen(sitsd_args(config, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__tcti=tpm.tcti, plc__security="none", plc__timeout_s=2,
                                       audit__directory=audit, control__socket=control),
                            stderr=open(log, "wb"), cwd=REPO, env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))
    return tpm, audit, control, log, config, endpoint, sim, proc


def test_reload_and_hot_swap_hand_the_plc_a_new_credential_that_shows_them(plcsim, tmp_path):
    data = example_config_data()
    tpm, audit, control, log, config, endpoint, sim, proc = start_line(plcsim, tmp_path, data)

    def status() -> dict:
        return request(control, "status")

    def credential_where(predicate, what: str) -> SessionCredential:
        deadline = time.monotonic() + 20
        while True:
            cred = plc_credential(endpoint)
            if predicate(verified(cred, ak).measured):
                return cred
            assert time.monotonic() < deadline, f"{what}: the PLC's credential still says {verified(cred, ak).measured}"
            time.sleep(0.1)

    try:
        wait_ready(proc, log)
        wait_for(lambda s: s["counters"]["commands"] > 20, 20, "commands flowing", status)
        ak = (audit / "device.pub.pem").read_bytes()
        # at start: the credential proves the model, both modules and the config file's bytes
        first = plc_credential(endpoint)
        assert first.version == 2 and sorted(first.quote.pcrs) == [16, 23]
        config_sha = hashlib.sha256(config.read_bytes()).hexdigest()
        measured = verified(first, ak, expected_config_sha256=config_sha).measured
        assert measured.model[1] == MODEL.hex() and set(measured.modules) == {"pre", "post"}
        assert measured.config == (config.name, config_sha)
        accepted_sessions = sim_stats(sim)["sessions_accepted"]

        # a config reload (sitsctl reload / SIGHUP): measured into PCR 23 and re-bound at once
        data["timing"]["max_consecutive_drops"] += 1
        config.write_text(yaml.safe_dump(data))
        new_sha = hashlib.sha256(config.read_bytes()).hexdigest()
        out = request(control, "reload", timeout_s=120)
        assert out["reloaded"] and out["measured"]["sha256"] == new_sha, out
        cred = credential_where(lambda m: m.config == (config.name, new_sha), "the reloaded config")
        verified(cred, ak, expected_config_sha256=new_sha)
        assert cred.session_public_pem == first.session_public_pem  # the same session key, bound again
        assert sim_stats(sim)["sessions_accepted"] > accepted_sessions
        # a reload of unchanged bytes measures nothing (and so needs no re-bind)
        assert "measured" not in request(control, "reload", timeout_s=120)

        # a module hot swap: the new module's SHA-256 in the PLC's credential
        pre_v2 = module_versions(tmp_path / "pre", "pre_filter", versions=(2,))[0]
        out = request(control, "update", timeout_s=120, module=str(pre_v2))
        v2_sha = out["sha256"]  # of the wasm bytes the .wat compiles to
        assert v2_sha != measured.modules["pre"][1]
        cred = credential_where(lambda m: m.modules["pre"] == ("pre_filter", v2_sha), "the swapped module")
        post = verified(cred, ak).measured.modules["post"]
        verified(cred, ak, expected_modules={"pre": v2_sha, "post": post[1]}, expected_config_sha256=new_sha)
        # and rolled back: the PLC sees the first version again
        request(control, "rollback", timeout_s=120, module="pre_filter")
        cred = credential_where(lambda m: m.modules["pre"] == measured.modules["pre"], "the rolled-back module")
        kinds = [k for k, _, _ in cred.measured_entries()]
        assert kinds[-3:] == ["config", "module:pre", "rollback:module:pre"], kinds
        stats = sim_stats(sim)
        assert stats["rejected"] == 0 and stats["sessions_rejected"] == 0, stats
        assert status()["plc_link"]["losses"] == 0

        # a PLC that refuses the new credential (here: it no longer trusts this AK) ends the session: nothing is
        # sent under the stale credential; once it trusts the AK again the reconnect binds and commands resume
        stranger = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        (audit / "device.pub.pem").write_bytes(stranger)
        data["timing"]["max_consecutive_drops"] += 1
        config.write_text(yaml.safe_dump(data))
        assert request(control, "reload", timeout_s=120)["reloaded"]
        lost = wait_for(lambda s: s["plc_link"]["losses"] >= 1, 20, "the refused re-bind ending the session", status)
        assert "re-binding the session key after measured config" in lost["plc_link"]["last_loss"], lost["plc_link"]
        time.sleep(1.0)
        held = sim_stats(sim)["accepted"]
        time.sleep(1.0)
        assert sim_stats(sim)["accepted"] == held  # nothing reached the PLC without a credential it accepted
        (audit / "device.pub.pem").write_bytes(ak)
        wait_for(lambda s: s["state"] == "running" and s["plc_link"]["reconnects"] >= 1, 30, "reconnected", status)
        deadline = time.monotonic() + 20
        while sim_stats(sim)["accepted"] < held + 20:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        newest = hashlib.sha256(config.read_bytes()).hexdigest()
        assert verified(plc_credential(endpoint), ak).measured.config == (config.name, newest)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpm.stop()


def test_the_plc_simulator_ends_the_session_when_it_refuses_a_new_credential(swtpm, tmp_path):
    """A PLC that refuses a re-bind's credential (here: its config pin no longer matches what the device measured)
    ends the session it had accepted: the same session key's commands are refused until a credential is accepted
    again (the simulator used to keep the old session)."""
    from attestation.session import SessionReplayState
    from plc.simulator.server import RollingMillSimulator, SimulatorSettings

    from .plc_session import session_nodes, write

    from .test_session import MODEL as MEASURED
    from .test_session_measured import CONFIG, started
    from .test_session_replay import command  # one roll-gap value, as the simulator takes

    signer, log = started(swtpm, tmp_path)
    replay = SessionReplayState()

    def acceptor(credential: bytes, nonce: bytes):  # a PLC gateway that pins the config
        session = SessionVerifier(signer.device_public_key_pem(), MEASURED, expected_config_sha256=CONFIG,
                                  replay_state=replay).accept(credential, nonce)
        return lambda envelope: (lambda env: (env.command.sequence, env.command.values, env.command.failsafe))(
            session.verify(envelope))

    async def scenario() -> dict:
        sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9"), None, session_acceptor=acceptor)
        await sim.start()
        seen: dict = {}
        try:
            async with session_nodes(sim.endpoint) as (nonce_node, cred_node, cmd_node):

                async def rebind() -> bool:
                    nonce = bytes(await nonce_node.read_value())
                    return await write(cred_node, await asyncio.to_thread(lambda: signer.bind(nonce, log).to_cbor()))

                seen["bound"] = await rebind()
                seen["cmd_1"] = await write(cmd_node, signer.sign_command(command(1)))
                # a garbled credential (anyone can write the node) is refused and leaves the session running
                seen["garbage_refused"] = not await write(cred_node, b"\xa0")
                seen["open_after_garbage"] = sim.stats()["session_open"]
                log.record("config", "rolling-mill.yaml", hashlib.sha256(b"an unpinned config").hexdigest())
                seen["rebind_refused"] = not await rebind()
                seen["refusal"] = sim.last_reject
                seen["stats_after_refusal"] = sim.stats()
                seen["cmd_2"] = await write(cmd_node, signer.sign_command(command(2)))
                seen["cmd_2_reject"] = sim.last_reject
                log.record("rollback:config", "rolling-mill.yaml", CONFIG)  # back to what the PLC accepts
                seen["rebound"] = await rebind()
                seen["cmd_3"] = await write(cmd_node, signer.sign_command(command(3)))
            seen["stats"] = sim.stats()
            return seen
        finally:
            await sim.close()

    try:
        seen = asyncio.run(scenario())
    finally:
        signer.close()
    assert seen["bound"] and seen["cmd_1"] and seen["garbage_refused"] and seen["open_after_garbage"] is True
    assert seen["rebind_refused"] and "session credential refused" in seen["refusal"] and "config" in seen["refusal"]
    after = seen["stats_after_refusal"]
    assert after["sessions_ended"] == 1 and after["session_open"] is False
    assert not seen["cmd_2"] and "no session: the last session credential was refused" in seen["cmd_2_reject"]
    assert seen["rebound"] and seen["cmd_3"]
    stats = seen["stats"]
    assert stats["accepted"] == 2 and stats["reject_reasons"]["key"] == 1 and stats["session_open"] is True
    assert stats["sessions_accepted"] == 2 and stats["sessions_rejected"] == 2


def test_a_swap_whose_rebind_the_plc_refuses_is_rolled_back_and_the_session_comes_back(plcsim, tmp_path):
    """A PLC that pins the modules (`--expect-module`) refuses the credential that measures a new pre module: the
    session ends (nothing is sent under the stale credential), the hot swap's health watch rolls the module back on
    its own, and the reconnect binds a credential the PLC accepts again: commands resume without an operator."""
    from sitsd.wasm import WasmHost

    host = WasmHost(tmp_path / "cache")
    try:
        pins = {stage: host.load(name, stage, REPO / "wasm_modules" / f"{name}.wat", n, n).sha256
                for stage, name, n in (("pre", "pre_filter", 6), ("post", "post_command", 1))}
    finally:
        host.close()
    tpm, audit, control, log, _, endpoint, sim, proc = start_line(
        plcsim, tmp_path, example_config_data(),
        ("--expect-module", f"pre={pins['pre']}", "--expect-module", f"post={pins['post']}"))

    def status() -> dict:
        return request(control, "status")

    try:
        wait_ready(proc, log)
        wait_for(lambda s: s["counters"]["commands"] > 20, 20, "commands flowing", status)
        assert sim_stats(sim)["sessions_rejected"] == 0
        pre_v2 = module_versions(tmp_path / "pre", "pre_filter", versions=(2,))[0]
        out = request(control, "update", timeout_s=120, module=str(pre_v2))
        assert out.get("updated"), out
        back = wait_for(lambda s: s["alerts"].get("rollback", 0) >= 1, 30, "the automatic rollback", status)
        assert back["alerts"]["rollback"] == 1
        assert back["plc_link"]["rebind_failures"] >= 1, back["plc_link"]
        stats = sim_stats(sim)
        assert stats["sessions_rejected"] >= 1, stats  # the credential measuring pre v2
        assert "re-binding the session key after measured module:pre" in back["plc_link"]["last_loss"], back
        # the reconnect binds the rolled-back set, which the PLC's pins accept: commands resume
        held = sim_stats(sim)["accepted"]
        deadline = time.monotonic() + 30
        while sim_stats(sim)["accepted"] < held + 50:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        cred = plc_credential(endpoint)
        ak = (audit / "device.pub.pem").read_bytes()
        measured = verified(cred, ak, expected_modules=pins).measured
        assert measured.modules["pre"][1] == pins["pre"]
        assert [k for k, _, _ in cred.measured_entries()][-2:] == ["module:pre", "rollback:module:pre"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        tpm.stop()
