"""Stopping the coordinator processes a scenario started: SIGTERM (a clean stop, as
Kubernetes stops a pod), then SIGKILL for one that does not stop in time."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterable


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
