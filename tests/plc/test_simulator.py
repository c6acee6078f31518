"""The PLC simulator in process: an asyncua client writes commands, the injected verifier decides."""
import asyncio
import threading

import pytest
from asyncua import Client, ua

from plc.simulator.server import COMMAND_NODE, NAMESPACE_URI, CommandRejected, RollingMillSimulator, SimulatorSettings


def _verifier(env: bytes):
    if env.startswith(b"OK"):
        return int(env[2:4]), (float(env[4:].decode()),), False
    raise CommandRejected("bad signature on command", "signature")


async def _scenario():
    sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9", command_timeout_s=0.05), _verifier)
    await sim.start()
    publisher = threading.Thread(target=sim.run_publisher, daemon=True)
    publisher.start()
    try:
        async with Client(sim.endpoint) as client:
            idx = await client.get_namespace_index(NAMESPACE_URI)
            node = client.get_node(ua.NodeId(COMMAND_NODE, idx))
            await node.write_value(ua.DataValue(ua.Variant(b"OK010.05", ua.VariantType.ByteString)))
            await asyncio.sleep(0.1)
            accepted_setpoint = sim._setpoint
            with pytest.raises(ua.UaStatusCodeError):
                await node.write_value(ua.DataValue(ua.Variant(b"forged", ua.VariantType.ByteString)))
            with pytest.raises(ua.UaStatusCodeError):
                await node.write_value(ua.DataValue(ua.Variant(b"OK02nan", ua.VariantType.ByteString)))
            await asyncio.sleep(0.3)  # no valid command for longer than the 50 ms timeout
            entry = await client.get_node(ua.NodeId("RollingMill.entry_thickness", idx)).read_value()
        return sim.stats(), accepted_setpoint, entry
    finally:
        await sim.close()
        publisher.join(2)


def test_commands_are_verified_rejected_counted_and_fallback_engages():
    stats, setpoint, entry = asyncio.run(_scenario())
    assert setpoint == pytest.approx(0.05)
    assert stats["accepted"] == 1
    assert stats["rejected"] == 2
    assert stats["reject_reasons"] == {"signature": 1, "malformed": 1}
    assert stats["fallbacks"] >= 1
    assert stats["steps"] > 10
    assert 3.5 < entry < 4.5  # the sensor variables follow the physics
