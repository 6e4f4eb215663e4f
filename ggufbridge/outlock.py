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

The lock file is opened without following links (O_NOFOLLOW) and must be a plain file with one name: a
`.ggufbridge.lock` planted as a link to another file would otherwise have that file truncated and overwritten with
a pid. Such a lock is refused with one line.

A file written into a folder (`quantize -o DIR/x.gguf`, `imatrix -o DIR/imatrix.gguf`) also holds the folder's lock,
shared (`sharing`): any number of such writers may share a folder, but not with a `convert` writing it, which holds
the folder's lock exclusively and would otherwise replace or delete their files in its commit.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
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


def _open(path: Path) -> int:
    """The lock file's descriptor: created if absent, never through a link, never a file with another name."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputError(f"the lock file {path} is a symbolic link: refused (a lock file is a plain file that "
                              f"ggufbridge creates; remove the link)") from None
        raise OutputError(f"cannot create the lock file {path}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        what = "not a plain file" if not stat.S_ISREG(st.st_mode) else f"a hard link ({st.st_nlink} names)"
        raise OutputError(f"the lock file {path} is {what}: refused (a lock file is a plain file that ggufbridge "
                          f"creates; remove it)")
    return fd


@contextmanager
def exclusive(output: str | os.PathLike, *, is_folder: bool):
    """Hold the lock of `output` (a folder, which must exist, or a file path) while the block runs; OutputError at
    once when another live process holds it."""
    with _hold(Path(output), is_folder, shared=False):
        yield


@contextmanager
def sharing(folder: str | os.PathLike):
    """Hold `folder`'s lock shared while the block writes a file into it: refused at once while a `convert` holds
    it (exclusive), and a `convert` is refused while this is held."""
    with _hold(Path(folder), True, shared=True):
        yield


@contextmanager
def _hold(output: Path, is_folder: bool, *, shared: bool):
    path = lock_path(output, is_folder)
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
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
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its owner unlinked it between our open and our lock: lock the file now at that path
    try:
        if not shared:  # the owner's pid, for the message of a run refused; sharers leave it to the owner
            previous = _read_pid(fd)
            if previous is not None and previous != os.getpid():
                log.debug("%s: took over the lock of process %d (no longer running)", output, previous)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            if shared:
                # remove the file only when no other sharer holds it: as its sole (now exclusive) holder
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    shared = False
                except OSError:
                    pass
            if not shared:
                path.unlink(missing_ok=True)  # while still locked: nobody can have taken it in between
        finally:
            os.close(fd)
