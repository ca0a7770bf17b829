"""The processes a test starts: waiting until one accepts connections, and stopping the
coordinator processes a scenario started: SIGTERM (a clean stop, as Kubernetes stops a pod),
then SIGKILL for one that does not stop in time."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterable


async def until_accepting(
    port: int, process: asyncio.subprocess.Process, what: str, bound_s: float = 30
) -> None:
    """Wait until ``process`` accepts a connection on ``port``; fail if it exits first."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert process.returncode is None, f"{what} exited"
            assert time.monotonic() < deadline, f"{what} accepts nothing on port {port}"
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return


def stop_all(processes: Iterable[subprocess.Popen[bytes]], timeout: float = 20) -> None:
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    for process in running:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
