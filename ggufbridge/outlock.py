"""Exclusive locks on outputs, held for a whole write: a conversion's output folder, a quantised file, an
importance matrix.

Two `convert` runs into one folder used to both pass the "folder already holds a conversion" check (it was empty
for both), and the second's commit then deleted the first's files as if `--force` had replaced them. With the lock
the second run stops at once with one line naming the process that holds it.

The lock is `flock` on a small file beside the output (`.ggufbridge.lock` in a folder, `.NAME.lock` for a file)
that holds the owner's pid. The kernel drops a flock when its process dies, however it dies (SIGKILL, power loss
aside), so the lock of a dead process is simply taken over: no pid liveness guess, no stale-lock timeout. The file
is removed by its owner while still locked; a process that locked the file just before it was unlinked notices
(the path no longer names the file it locked) and locks the new one.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from contextlib import contextmanager
from pathlib import Path

from ggufbridge.errors import OutputError

log = logging.getLogger(__name__)
FOLDER_LOCK = ".ggufbridge.lock"


def lock_path(output: Path, is_folder: bool) -> Path:
    return output / FOLDER_LOCK if is_folder else output.with_name(f".{output.name}.lock")


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@contextmanager
def exclusive(output: str | os.PathLike, *, is_folder: bool):
    """Hold the lock of `output` (a folder, which must exist, or a file path) while the block runs; OutputError at
    once when another live process holds it."""
    output = Path(output)
    path = lock_path(output, is_folder)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise OutputError(f"cannot create the lock file {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f"process {holder}" if holder else "another process"
                raise OutputError(f"{output} is being written by another ggufbridge run ({who}, lock {path.name}): "
                                  f"refused; wait for it to finish or stop it") from None
            # a file system without flock (ENOLCK, EOPNOTSUPP): proceed unlocked rather than refuse all work
            log.debug("%s: no lock (%s)", path, e.strerror)
            yield
            return
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its owner unlinked it between our open and our lock: lock the file now at that path
    try:
        previous = _read_pid(fd)
        if previous is not None and previous != os.getpid():
            log.debug("%s: took over the lock of process %d (no longer running)", output, previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # while still locked: nobody can have taken it in between
        finally:
            os.close(fd)
