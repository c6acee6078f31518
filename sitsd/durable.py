"""Writes that survive a power cut: a file is the old one or the new one, never torn, and a rename or unlink
is not undone by the next boot (the directory's entry is fsynced too)."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make the renames and unlinks in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, content: bytes, mode: int = 0o640, *, tmp: Path | None = None) -> None:
    """`content` at `path` through a temporary file (`tmp`, default `<name>.tmp<pid>`), fsynced before it is
    renamed over `path`; the temporary file is removed on any failure. The caller fsyncs the directory
    (fsync_dir) when the rename itself must be durable before what it does next."""
    path = Path(path)
    tmp = tmp if tmp is not None else path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
