"""Waiting for a thread to be really gone. mlx keeps each thread's streams in thread-local
storage, released when the operating-system thread exits; a process that exits while a thread
that held an mlx stream is still running its thread-local destructors aborts with "terminate
called without an active exception" (exit 134; seen on the CPU backend, in CI, after the README's
server block). ``Thread.join`` returns once Python is done with a thread, a moment *before* those
destructors run, so the main thread can win that race at interpreter exit. Python's threading
offers no way to wait for the OS thread itself, hence this module."""

from __future__ import annotations

import os
import threading
import time
from typing import Optional


def wait_for_os_thread_exit(thread: threading.Thread, timeout_s: float = 2.0) -> None:
    """Wait (up to ``timeout_s``) until a joined thread's OS thread has exited. Linux lists live
    threads under /proc/self/task; elsewhere a short sleep gives the thread that moment."""
    tid = getattr(thread, "native_id", None)
    if tid is None or not os.path.isdir("/proc/self/task"):
        time.sleep(0.1)
        return
    task = f"/proc/self/task/{tid}"
    deadline = time.monotonic() + timeout_s
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.001)


def join_fully(thread: threading.Thread, timeout_s: Optional[float] = None) -> bool:
    """``thread.join(timeout_s)``, then :func:`wait_for_os_thread_exit` if it ended; True when the
    thread has ended (False: still running after the timeout)."""
    if thread is threading.current_thread() or thread.ident is None:
        return not thread.is_alive()
    thread.join(timeout_s)
    if thread.is_alive():
        return False
    wait_for_os_thread_exit(thread)
    return True
