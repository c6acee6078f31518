"""Faults injected into the live PLC simulator (asyncua server + publisher thread), as a demo uses them."""
import asyncio
import threading

from asyncua import Client, ua

from plc.simulator.server import DIAGNOSTIC_NODE, NAMESPACE_URI, STATUS_NODE, RollingMillSimulator, SimulatorSettings


async def _read_after(fault: str, seconds: float, nodes: list[str]) -> dict:
    sim = RollingMillSimulator(SimulatorSettings(udp_url="opc.udp://127.0.0.1:9", fault=fault), None)
    await sim.start()
    publisher = threading.Thread(target=sim.run_publisher, daemon=True)
    publisher.start()
    try:
        async with Client(sim.endpoint) as client:
            idx = await client.get_namespace_index(NAMESPACE_URI)
            while sim.steps * sim.dt < seconds:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the 10 Hz signal variables catch up
            return {n: await client.get_node(ua.NodeId(n, idx)).read_value() for n in nodes}
    finally:
        await sim.close()
        publisher.join(2)


def test_plc_fault_shows_a_diagnostic_a_status_word_and_leaves_automatic_mode():
    before = asyncio.run(_read_after("plc_fault@5", 0.5, [DIAGNOSTIC_NODE, "RollingMill.mill_mode"]))
    assert before == {DIAGNOSTIC_NODE: "", "RollingMill.mill_mode": 2.0}
    after = asyncio.run(_read_after("plc_fault@0.3", 0.8, [DIAGNOSTIC_NODE, STATUS_NODE, "RollingMill.mill_mode"]))
    assert after == {DIAGNOSTIC_NODE: "I/O station failure", STATUS_NODE: 1, "RollingMill.mill_mode": 1.0}


def test_stuck_sensor_freezes_the_published_value():
    values = []
    for seconds in (0.6, 1.2):
        values.append(asyncio.run(_read_after("stuck_sensor@0.2:strip_tension", seconds,
                                              ["RollingMill.strip_tension", "RollingMill.strip_speed"])))
    # the same disturbance seed: the frozen sensor repeats, a healthy one moves on
    assert values[0]["RollingMill.strip_tension"] == values[1]["RollingMill.strip_tension"]
    assert values[0]["RollingMill.strip_speed"] != values[1]["RollingMill.strip_speed"]
