"""Starts one container process of the node simulator: ``unshare --mount --uts`` runs this script
(standard library only, run with ``python -I``), which sets the pod's view of the machine up and
then becomes the container's command (``execve``: the same process, so the node signals it).

In its own mount namespace the process gets a fresh ``/run`` (so ``/var/run``), where the pod's
volumes under it are bound (``/var/run/secrets/kubernetes.io/serviceaccount``), and the
node's network files (``/run/podnet``); a volume mounted elsewhere is bound over the directory
there (``/tmp``), whatever the order. In its own UTS namespace its host name is the pod's. It
dies with the node (``PR_SET_PDEATHSIG``).

Usage: ``python -I launch.py SPEC.json [ARGV...]``; SPEC holds ``argv``, ``env``, ``cwd``,
``hostname`` and ``mounts`` (``source``, ``target``, ``read_only``); ARGV replaces the spec's
``argv`` (to run another command in the pod, as ``kubectl exec`` would).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
PR_SET_PDEATHSIG = 1

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise SystemExit(f"launch: {what}: {os.strerror(error)}")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    _check(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _inside_run(path: str) -> bool:
    return path == "/run" or path.startswith("/run/")


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    argv = sys.argv[2:] or spec["argv"]
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    hostname = spec["hostname"].encode()
    _check(libc.sethostname(hostname, len(hostname)), "sethostname")
    # Sources are opened first: a mount over /tmp must not hide the sources under it.
    sources = [os.open(mount["source"], os.O_PATH) for mount in spec["mounts"]]
    _mount("tmpfs", "/run", "tmpfs", 0, "mode=0755,size=64m")
    for mount, source in zip(spec["mounts"], sources, strict=True):
        target = mount["target"]
        if target.startswith("/var/run/"):
            target = "/run/" + target[len("/var/run/") :]
        if _inside_run(target):
            if os.path.isdir(f"/proc/self/fd/{source}"):
                os.makedirs(target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "a").close()
        _mount(f"/proc/self/fd/{source}", target, None, MS_BIND, None)
        if mount.get("read_only"):
            _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    os.chdir(spec["cwd"])
    try:
        os.execve(argv[0], argv, spec["env"])
    except OSError as error:
        raise SystemExit(f"launch: {argv[0]}: {error.strerror}") from None


if __name__ == "__main__":
    main()
