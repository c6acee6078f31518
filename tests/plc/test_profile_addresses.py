"""Vendor addresses against a live server: the simulator emulating each profile exposes its variables where that
controller would (the profile's `simulator_tags`), and sitsd's PLC link, configured with the vendor's own
address syntax, resolves them through the profile's parser, reads a sensor value and writes a command there."""
import asyncio
import threading

import pytest
from asyncua import Client, ua

from plc.profiles import S7Profile, get_profile
from plc.simulator.physics import SIGNALS
from plc.simulator.server import NAMESPACE_URI, RollingMillSimulator, SimulatorSettings
from sitsd.config import load_config
from sitsd.errors import StartupError
from sitsd.plc_link import PlcLink, resolve_node

from ..conftest import EXAMPLE_CONFIG

# per profile: (the exit-thickness sensor, the command variable, status word, diagnostic text), as a plant engineer
# writes them in sitsd's config: the vendor's own syntax, not NodeIds
PROFILES = {
    "s7-1500": ('"DB_Line"."Thickness"', "DB_AGC.RollGapCommand", "DB_Diag.ModeByte", "DB_Diag.LastMessage",
                'ns=3;s="DB_Line"."Thickness"', "S7."),
    "controllogix": ("Program:Mill.ExitThickness", "Program:AGC.RollGapCommand", "Diag.StatusWord", "Diag.LastFault",
                     "ns=2;s=[PLC]Program:Mill.ExitThickness", "LOGIX."),
    "melsec-iq-r": ("D104", "D1000", "SM0", "D4000", "ns=2;s=D104", "MELSEC."),
}


def _verifier(envelope: bytes):
    """The test's stand-in for the signature check: b"CMD<gap>" is accepted."""
    if not envelope.startswith(b"CMD"):
        raise ValueError("not a test command")
    return 1, (float(envelope[3:].decode()),), False


class _Log:
    def __getattr__(self, _name):
        return lambda *args, **kwargs: None


async def _scenario(profile_name: str) -> dict:
    sensor, command, status, diagnostic, sensor_node_id, _ = PROFILES[profile_name]
    credentials = []

    def accept(credential: bytes, nonce: bytes):  # the PLC's session check: records what it was given
        credentials.append((credential, nonce))
        return _verifier

    sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9", port=0, profile=profile_name),
                               None, session_acceptor=accept)
    await sim.start()
    try:
        # physics for a while, then stopped: the variables hold still for the comparisons below
        publisher = threading.Thread(target=sim.run_publisher, args=(0.4,), daemon=True)
        publisher.start()
        await asyncio.to_thread(publisher.join, 5)
        await asyncio.sleep(0.2)  # the last writes the publisher scheduled on this loop

        cfg = load_config(EXAMPLE_CONFIG, {"plc.profile": profile_name, "plc.endpoint": sim.endpoint,
                                           "plc.security": "none", "plc.command_node": command,
                                           "plc.status_node": status, "plc.diagnostic_node": diagnostic})
        events = []
        link = PlcLink(cfg, signer=object(), source=None, on_plc_event=events.append, device_key_file=EXAMPLE_CONFIG,
                       model_sha256=b"\0" * 32, log=_Log())
        await link.connect()  # resolves command, status and diagnostic through the profile, checks the command node
        try:
            assert cfg.plc.node_id(sensor) == sensor_node_id
            profile = get_profile(profile_name)
            assert profile.node_id_for("exit_thickness") == sensor_node_id  # the simulator name, through the mapping
            vendor = link.client.get_node(await resolve_node(link.client, cfg.plc.node_id(sensor), "sensor"))
            mill_idx = await link.client.get_namespace_index(NAMESPACE_URI)
            mill = link.client.get_node(ua.NodeId("RollingMill.exit_thickness", mill_idx))
            vendor_value, mill_value = await link.client.read_values([vendor, mill])
            frame_node = link.client.get_node(ua.NodeId.from_string(profile.node_id_for("SensorFrame")))
            frame = await frame_node.read_value()

            # the session handshake at the vendor addresses: the nonce read there is the one the credential must use
            nonce_node = link.client.get_node(ua.NodeId.from_string(profile.node_id_for("SessionNonce")))
            nonce = await nonce_node.read_value()
            credential_node = link.client.get_node(ua.NodeId.from_string(profile.node_id_for("SessionCredential")))
            await credential_node.write_value(ua.DataValue(ua.Variant(b"credential", ua.VariantType.ByteString)))
            assert credentials == [(b"credential", nonce)]

            await link.send(b"CMD0.025")  # sitsd's command path: a ByteString write to the vendor address
            with pytest.raises(ua.UaStatusCodeError):
                await link.send(b"forged")  # the same verifier behind the vendor node
            for _ in range(50):  # the first status and diagnostic notifications
                if len(events) >= 2:
                    break
                await asyncio.sleep(0.05)
        finally:
            await link.close()
        return {"vendor": vendor_value, "mill": mill_value, "frame": frame, "stats": sim.stats(),
                "setpoint": sim._setpoint, "events": [e.code for e in events], "vendor_nodes": sim.vendor_node_ids}
    finally:
        await sim.close()


@pytest.mark.parametrize("profile_name", sorted(PROFILES))
def test_vendor_address_reads_a_sensor_and_takes_a_command(profile_name):
    r = asyncio.run(_scenario(profile_name))
    assert 2.5 < r["vendor"] < 3.5  # exit thickness around the 3 mm target, read at the vendor address...
    assert r["vendor"] == r["mill"]  # ...the same value as the simulator's own variable
    assert r["frame"][SIGNALS.index("exit_thickness")] == r["vendor"]
    assert r["stats"]["sessions_accepted"] == 1 and r["stats"]["session_open"]
    assert r["stats"]["accepted"] == 1 and r["setpoint"] == pytest.approx(0.025)
    assert r["stats"]["rejected"] == 1
    prefix = PROFILES[profile_name][-1]
    assert r["events"] and all(code.startswith(prefix) for code in r["events"]), r["events"]
    profile = get_profile(profile_name)
    assert r["vendor_nodes"] == {name: profile.node_id_for(name) for name in profile.simulator_tags()}


def test_s7_namespace_uri_form_resolves_on_the_server():
    """An S7 address in the `nsu=` form finds the Siemens namespace by its URI, wherever the server put it."""
    async def scenario():
        sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9", profile="s7-1500"), _verifier)
        await sim.start()
        try:
            text = S7Profile(use_namespace_uri=True).parse("DB_AGC.RollGapCommand").node_id
            assert text.startswith("nsu=http://www.siemens.com/simatic-s7-opcua;")
            async with Client(sim.endpoint) as client:
                node = client.get_node(await resolve_node(client, text, "command"))
                await node.write_value(ua.DataValue(ua.Variant(b"CMD0.01", ua.VariantType.ByteString)))
            return sim.stats()["accepted"]
        finally:
            await sim.close()

    assert asyncio.run(scenario()) == 1


def test_an_unmapped_vendor_address_is_a_clear_startup_error():
    async def scenario():
        sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9", profile="melsec-iq-r"),
                                   _verifier)
        await sim.start()
        try:
            cfg = load_config(EXAMPLE_CONFIG, {"plc.profile": "melsec-iq-r", "plc.endpoint": sim.endpoint,
                                               "plc.security": "none", "plc.command_node": "D1001"})
            link = PlcLink(cfg, signer=object(), source=None, on_plc_event=None, device_key_file=EXAMPLE_CONFIG,
                           model_sha256=b"\0" * 32, log=_Log())
            with pytest.raises(StartupError) as info:
                await link.connect()
            return str(info.value)
        finally:
            await sim.close()

    message = asyncio.run(scenario())
    assert "plc.command_node D1001" in message and "ns=2;s=D1001" in message and "not found" in message


def test_the_plain_simulator_keeps_only_its_own_namespace():
    async def scenario():
        sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9"), _verifier)
        await sim.start()
        try:
            async with Client(sim.endpoint) as client:
                return await client.get_namespace_array(), sim.vendor_node_ids
        finally:
            await sim.close()

    namespaces, vendor = asyncio.run(scenario())
    assert namespaces[2:] == [NAMESPACE_URI] and vendor == {}


def test_closed_loop_with_every_plc_address_in_s7_syntax():
    """The whole demo (daemon, signer, simulator as an S7-1500) with the plc section written in S7 addresses."""
    from sitsd.demo import run_demo

    r = run_demo(seconds=2.5, progress=None, force_software=True, security="none", profile="s7-1500", overrides={
        "plc.command_node": "DB_AGC.RollGapCommand", "plc.session_nonce_node": "DB_AGC.SessionNonce",
        "plc.session_credential_node": "DB_AGC.SessionCredential", "plc.status_node": "DB_Diag.ModeByte",
        "plc.diagnostic_node": "DB_Diag.LastMessage"})
    assert r["plc_profile"] == "s7-1500" and r["commands"] > 50 and r["rejected_by_plc"] == 0
    assert r["plc_accepted"] >= r["commands"] - 1
    assert r["plc_events"] and all(code.startswith("S7.") for code in r["plc_events"])
