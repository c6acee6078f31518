"""The control socket: one JSON request per line in, one JSON answer per line out (unix stream).

Served on the I/O thread's event loop; `request()` is the blocking client used by sitsctl.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from .errors import ControlError


async def serve(path: Path, handlers: dict[str, Callable[[dict], dict]]) -> asyncio.AbstractServer:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    command = req.get("command")
                    if command not in handlers:
                        answer = {"ok": False, "error": f"unknown command {command!r}; known: {', '.join(handlers)}"}
                    else:
                        answer = {"ok": True, **handlers[command](req)}
                except (ValueError, AttributeError) as exc:
                    answer = {"ok": False, "error": f"bad request: {exc}"}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, path=str(path))
    os.chmod(path, 0o660)
    return server


def request(path: str | os.PathLike, command: str, timeout_s: float = 3.0, **params) -> dict:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(path))
            s.sendall(json.dumps({"command": command, **params}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except FileNotFoundError:
        raise ControlError(f"no control socket at {path}: is sitsd running? (control.socket in its config)") from None
    except OSError as exc:
        raise ControlError(f"control socket {path}: {exc}") from None
    answer = json.loads(data)
    if not answer.get("ok"):
        raise ControlError(f"sitsd answered: {answer.get('error')}")
    return answer
