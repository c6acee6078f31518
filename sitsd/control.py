"""The control socket: one JSON request per line in, one JSON answer per line out (unix stream).

Served on the I/O thread's event loop; `request()` is the blocking client used by sitsctl.
"""
from __future__ import annotations

import asyncio
import grp
import inspect
import json
import os
import pwd
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

from .errors import ControlError


# Commands any client that can open the socket may run; every other command (reload, update,
# rollback, stop, deploy, and any command added later) needs the operator role.
READ_LIMIT = 1 << 20  # bytes of one request line (a deploy request names paths and hashes: far below)
READ_ONLY = frozenset({"status", "events", "diagnose", "versions"})


class RawJsonString:
    """A JSON string value already encoded: ASCII bytes that need no escaping (base64, hex), without the quotes.
    A handler puts it in its answer where a large string goes; `encode_answer` splices the bytes in instead of
    having `json.dumps` scan them (the I/O thread encodes answers with the GIL held, and the loop thread waits
    meanwhile: megabytes of base64 cost it tens of ms through json.dumps, about one memcpy this way)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def encode_answer(answer: dict) -> bytes:
    """`answer` as one JSON line (without the newline): `json.dumps`, with every RawJsonString (in dicts and lists
    at any depth) spliced in as a string. The placeholders carry a random token drawn for this call, so no string
    of the answer itself can stand for one."""
    raws: list[bytes] = []
    token = os.urandom(8).hex()

    def swap(value):
        if isinstance(value, RawJsonString):
            raws.append(value.data)
            return f"sitsraw-{token}-{len(raws) - 1}"
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [swap(v) for v in value]
        return value

    skeleton = json.dumps(swap(answer)).encode()
    if not raws:
        return skeleton
    parts, pos = [], 0
    for m in re.finditer(rb'"sitsraw-' + token.encode() + rb'-(\d+)"', skeleton):
        parts += [skeleton[pos:m.start()], b'"', raws[int(m.group(1))], b'"']
        pos = m.end()
    parts.append(skeleton[pos:])
    return b"".join(parts)


class Peer:
    """The process on the other end of the socket, from the kernel (SO_PEERCRED), not from the request."""

    __slots__ = ("pid", "uid", "gid")

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    @classmethod
    def of(cls, sock: socket.socket | None) -> "Peer | None":
        if sock is None:
            return None
        pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return cls(pid, uid, gid)

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    def __repr__(self) -> str:
        return f"pid {self.pid} uid {self.uid} ({self.user})"


class ControlAccess:
    """Roles on the control socket. Operators: root, the daemon's own user, and members of
    control.operator_group. Everyone else who can open the socket (its file mode is 0660) is a viewer
    and may run only READ_ONLY commands."""

    def __init__(self, operator_group: str | None = None) -> None:
        self.operator_group = operator_group
        self._gid = None
        if operator_group:
            try:
                self._gid = grp.getgrnam(operator_group).gr_gid
            except KeyError:
                self._gid = None  # refused below with a message that names the missing group

    def is_operator(self, peer: Peer) -> bool:
        if peer.uid in (0, os.geteuid()):
            return True
        if self._gid is None:
            return False
        if peer.gid == self._gid:
            return True
        try:
            return peer.user in grp.getgrgid(self._gid).gr_mem
        except KeyError:
            return False

    def check(self, command: str, peer: Peer | None) -> str | None:
        """None if allowed, else the reason (sent back to the client)."""
        if command in READ_ONLY or (peer is not None and self.is_operator(peer)):
            return None
        if peer is None:  # no SO_PEERCRED answer: nothing says who asks, so only read-only commands (fail closed)
            return (f"command {command!r} needs the operator role and the kernel did not report the peer's "
                    f"credentials (SO_PEERCRED); read-only commands: {', '.join(sorted(READ_ONLY))}")
        group = (f"not in group {self.operator_group}" if self._gid is not None else
                 f"group {self.operator_group!r} does not exist" if self.operator_group else
                 "no control.operator_group is configured")
        return (f"command {command!r} needs the operator role: {peer} is not root, not the daemon's user and "
                f"{group}; read-only commands: {', '.join(sorted(READ_ONLY))}")


async def serve(path: Path, handlers: dict[str, Callable[[dict], dict | Awaitable[dict]]],
                access: ControlAccess | None = None,
                on_command: Callable[[str, "Peer | None"], None] | None = None) -> asyncio.AbstractServer:
    """Serve `handlers` on a unix socket. `access` decides per command from the peer's kernel
    credentials; `on_command` is told about every allowed command that is not read-only (for the log)."""
    access = access or ControlAccess()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            peer = Peer.of(writer.get_extra_info("socket"))
        except OSError:
            peer = None
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than the stream's limit: answered, then the connection is closed
                    writer.write(encode_answer({"ok": False, "error": f"bad request: longer than {READ_LIMIT} "
                                                "bytes (a request is one JSON line)"}) + b"\n")
                    await writer.drain()
                    break
                if not line:
                    break
                try:
                    req = json.loads(line)
                    command = req.get("command")
                    if not isinstance(command, str):
                        raise ValueError(f"\"command\" must be a string, got {type(command).__name__}")
                    refused = access.check(command, peer) if command in handlers else None
                    if command not in handlers:
                        answer = {"ok": False, "error": f"unknown command {command!r}; known: {', '.join(handlers)}"}
                    elif refused:
                        answer = {"ok": False, "error": refused, "refused": True}
                    else:
                        if on_command is not None and command not in READ_ONLY:
                            on_command(command, peer)
                        answer = handlers[command](req)
                        if inspect.isawaitable(answer):  # async handlers: long work off this event loop
                            answer = await answer
                        answer = {"ok": True, **answer}
                except (ValueError, AttributeError) as exc:
                    answer = {"ok": False, "error": f"bad request: {exc}"}
                except Exception as exc:  # a handler's failure is answered; the connection and the daemon go on
                    answer = {"ok": False, "error": f"failed: {exc!r}"}
                writer.write(encode_answer(answer))
                writer.write(b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, path=str(path), limit=READ_LIMIT)
    os.chmod(path, 0o660)  # the daemon's user and group open it; roles are decided per command (ControlAccess)
    return server


def recv_line(sock: socket.socket) -> bytes:
    """One message of the control protocol (a JSON line) from a blocking socket: the bytes up to and including the
    newline, or what came before the peer closed (no newline at the end then: the caller says it was cut)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


# Commands whose work the daemon finishes even when the client stopped waiting: a swap can still land after a timeout.
_SWAPS = frozenset({"update", "rollback"})


def request(path: str | os.PathLike, command: str, timeout_s: float = 3.0, **params) -> dict:
    """Send one command to the control socket at `path` and return the daemon's answer (a dict with "ok": true).

    Raises ControlError when the socket cannot be reached, when no answer comes within `timeout_s` (the daemon may
    still be working on the command), when the daemon closes the connection without a complete JSON answer, or when
    it answers with an error."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(path))
            s.sendall(json.dumps({"command": command, **params}).encode() + b"\n")
            data = recv_line(s)
    except FileNotFoundError:
        raise ControlError(f"no control socket at {path}: is sitsd running? (control.socket in its config)") from None
    except TimeoutError:  # socket.timeout; an OSError, so before the clause below
        still = (f" The update may still be applied: `sitsctl versions` shows what runs (`sitsctl {command} "
                 f"--timeout SECONDS` waits longer)." if command in _SWAPS else "")
        raise ControlError(f"control socket {path}: no answer to {command!r} within {timeout_s:g} s; sitsd may "
                           f"still be working on it.{still}") from None
    except OSError as exc:
        raise ControlError(f"control socket {path}: {exc}") from None
    problem = ("no answer at all" if not data else
               f"{len(data)} bytes without the end of the line" if not data.endswith(b"\n") else None)
    if problem is None:
        try:
            answer = json.loads(data)
        except ValueError as exc:
            problem = f"{len(data)} bytes that are not JSON: {exc}"
        else:
            if not isinstance(answer, dict):
                problem = f"a JSON {type(answer).__name__}, not an object"
    if problem is not None:
        raise ControlError(f"control socket {path}: sitsd closed the connection without answering {command!r} "
                           f"({problem}): did it stop? See `systemctl status sitsd` and `journalctl -u sitsd`")
    if not answer.get("ok"):
        raise ControlError(f"sitsd answered: {answer.get('error')}")
    return answer
