"""A child process's stdout, line by line, for tests that wait for a line (`ready: ...`) with a deadline.

select() on a text pipe is not enough: readline() pulls everything the pipe holds into Python's buffer, so when the
child writes two lines at once (serve's "chat page: ..." and "ready: ..."), the second sits in that buffer and
select() never fires for it again. A thread that reads the pipe to its end and hands over lines has no such gap."""

from __future__ import annotations

import queue
import subprocess
import threading
import time


class Lines:
    def __init__(self, stream):
        self._q: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self._q.put(line)
        self._q.put(None)  # end of the stream

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        """The first line starting with `prefix` (every line read is kept in `seen`); None at the end of the
        stream or at the deadline."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        return None


def stderr_of(proc: subprocess.Popen) -> str:
    """What a child wrote on stderr, after killing it: reading the pipe of a live child would wait for its end."""
    proc.kill()
    try:
        return proc.communicate(timeout=10)[1] or ""
    except subprocess.TimeoutExpired:  # a grandchild still holds the pipe
        return "(stderr still open: a child of the process holds it)"
