"""The PLC simulator's session nodes as a client sees them (security none: any client may write them), for tests
that drive the session protocol by hand: read the nonce, write credentials and commands."""
import contextlib

from asyncua import Client, ua

from plc.simulator.server import COMMAND_NODE, NAMESPACE_URI, SESSION_CREDENTIAL_NODE, SESSION_NONCE_NODE


@contextlib.asynccontextmanager
async def session_nodes(endpoint: str):
    """(nonce node, credential node, command node) of the simulator at `endpoint`, over one client session."""
    async with Client(endpoint) as client:
        idx = await client.get_namespace_index(NAMESPACE_URI)
        yield tuple(client.get_node(ua.NodeId(name, idx))
                    for name in (SESSION_NONCE_NODE, SESSION_CREDENTIAL_NODE, COMMAND_NODE))


async def write(node, data: bytes) -> bool:
    """Write `data` as a ByteString: True when the PLC accepted it, False when it answered a Bad status."""
    try:
        await node.write_value(ua.DataValue(ua.Variant(data, ua.VariantType.ByteString)))
        return True
    except ua.UaStatusCodeError:
        return False
