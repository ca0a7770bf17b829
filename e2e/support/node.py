"""A Kubernetes node of our own: registers a Ready Node and runs the pods bound to it as local
processes, as a kubelet would run their containers.

``python e2e/support/node.py --config CONFIG.json`` (the ``node`` fixture starts it). It

- registers the Node, renews its Lease in ``kube-node-lease`` and its Ready condition;
- watches the pods bound to it; for each, gives it a loopback address of its own (its
  ``status.podIP``), writes its volumes (emptyDir, Secret, ConfigMap, downward API, projected
  ServiceAccount tokens from the TokenRequest API) under its directory, and runs its init
  containers (native sidecars included: ``restartPolicy: Always``) then its containers, each
  with the environment the kubelet would give it (``pods.container_env``), restarted after an
  exit as ``restartPolicy`` says (10 s doubling back-off from the second restart);
- probes them (httpGet, tcpSocket, exec: startup, readiness, liveness) and reports phase,
  conditions and container states on the pod's status;
- on deletion sends SIGTERM, waits the grace period (sidecars last), then SIGKILLs the
  container's process group, and deletes the pod;
- resolves Services for the pods: it writes the name table ``podnet.c`` answers from;
- serves ``kubectl logs`` (``/containerLogs``) on its kubelet port, over TLS for the API
  server's client certificate. There is no ``exec``, ``attach`` or ``port-forward``; tests
  run a command in a pod with ``exec_in``.

Each container process starts through ``launch.py`` in a mount and UTS namespace of its own
(volumes under ``/var/run`` and over ``/tmp``, the pod's host name), with ``podnet.so``
preloaded (the pod's address, its own 127.0.0.1, cluster names); see ``pods`` for how images
map to this source tree. Its PID is the container id (``process://PID``). Not emulated:
resource limits, security contexts (processes run as the node's user), image pulls, Service
environment variables, PersistentVolumes, hostPorts, preStop hooks.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import json
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

if __package__ in (None, ""):  # run as a script: the repository root holds the e2e package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from e2e.support import pods

logger = logging.getLogger("node")

LAUNCH = Path(__file__).resolve().parent / "launch.py"
LEASE_SECONDS = 40
RENEW_SECONDS = 10
BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0
# A container that ran this long starts its back-off over.
BACKOFF_RESET_S = 600.0
# After a pod's last container stops, how long the kubelet still waits for sidecars.
SIDECAR_MIN_GRACE_S = 2.0
POD_NET_MOUNT = "/run/podnet"
WORKDIR = "/run/workdir"


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class NodeConfig:
    """What the node needs (the ``node`` fixture writes it as JSON)."""

    name: str
    api_url: str
    token: str
    ca_file: str
    # The kubelet's serving certificate, and the port the API server reaches it on.
    certificate_file: str
    key_file: str
    kubelet_port: int
    # The pods' addresses: 127.<subnet>.x.y.
    subnet: int
    state_dir: str
    # podnet.so, built for this machine.
    podnet: str
    root: str
    venv_bin: str

    @classmethod
    def load(cls, path: Path) -> NodeConfig:
        return cls(**json.loads(path.read_text()))


class Api:
    """The few calls the node makes, as the admin."""

    def __init__(self, config: NodeConfig) -> None:
        self.base = config.api_url
        context = ssl.create_default_context(cafile=config.ca_file)
        self.session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {config.token}"},
            connector=aiohttp.TCPConnector(ssl=context, limit=50),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 60,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        async with self.session.request(
            method,
            self.base + path,
            data=data,
            params=params,
            headers={"Content-Type": content_type},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            text = await response.text()
            try:
                decoded = json.loads(text) if text else None
            except ValueError:
                decoded = text
            return response.status, decoded

    async def get(self, path: str) -> Any:
        status, body = await self.call("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise ApiError(f"GET {path}: {status} {body}")
        return body

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[dict[str, Any]]:
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "240",
        }
        async with self.session.get(
            self.base + path,
            params=query,
            timeout=aiohttp.ClientTimeout(total=300, sock_read=290),
        ) as response:
            if response.status != 200:
                raise ApiError(f"watch {path}: {response.status} {await response.text()}")
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)

    async def close(self) -> None:
        await self.session.close()


class ApiError(RuntimeError):
    pass


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


async def informer(
    api: Api,
    path: str,
    params: Mapping[str, str],
    handle: Any,
    synced: asyncio.Event | None = None,
) -> None:
    """List and watch ``path`` forever: ``handle("SYNC", items)`` after each list, then
    ``handle(type, object)`` per event."""
    while True:
        try:
            listing = await api.call("GET", path, params=params)
            if listing[0] != 200:
                raise ApiError(f"list {path}: {listing}")
            version = listing[1]["metadata"]["resourceVersion"]
            handle("SYNC", listing[1]["items"])
            if synced is not None:
                synced.set()
            while True:
                async for event in api.watch(path, params, version):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone()
                        raise ApiError(f"watch {path}: {obj}")
                    version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        handle(kind, obj)
        except Gone:
            continue
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a broken watch is listed again, after a pause
            logger.warning("%s: %s; listing again", path, error)
            await asyncio.sleep(1)


# ----------------------------------------------------------------------------- containers


@dataclass
class Instance:
    """One run of a container: its process, log and outcome."""

    process: asyncio.subprocess.Process
    started_at: str
    started_monotonic: float
    log: Path
    exit_code: int | None = None
    signal: int | None = None
    finished_at: str | None = None
    killed_reason: str | None = None


class Container:
    """A container of a pod: its runs, probes and state."""

    def __init__(self, pod: Pod, spec: Mapping[str, Any], kind: str) -> None:
        self.pod = pod
        self.spec = spec
        self.name = str(spec["name"])
        self.kind = kind  # "init", "sidecar" or "main"
        self.dir = pod.dir / "containers" / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.restart_count = 0
        self.instance: Instance | None = None
        self.last: Instance | None = None
        self.waiting: tuple[str, str] | None = ("ContainerCreating", "")
        self.ready = False
        self.started = False
        self.started_event = asyncio.Event()
        self.succeeded = asyncio.Event()
        self.finished = asyncio.Event()  # no more runs will come
        self.stopping = False
        self.task: asyncio.Task[None] | None = None
        self._backoff_s = 0.0

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"{self.pod.key}/{self.name}")

    def _restarts(self, exit_code: int) -> bool:
        if self.kind == "sidecar":
            return True
        policy = self.pod.spec.get("restartPolicy", "Always")
        if self.kind == "init":
            return exit_code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and exit_code != 0)

    async def _run(self) -> None:
        try:
            while not self.stopping:
                try:
                    spec = self.pod.launch_spec(self)
                except pods.ConfigError as error:
                    self._wait_state("CreateContainerConfigError", str(error))
                    await self.pod.pause(2.0)
                    continue
                instance = await self._spawn(spec)
                probes = asyncio.create_task(self._probe(instance))
                await instance.process.wait()
                probes.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probes
                self._finish(instance)
                code = instance.exit_code or 0
                if code == 0 and self.kind == "init":
                    self.succeeded.set()
                if self.stopping or not self._restarts(code):
                    break
                ran_s = time.monotonic() - instance.started_monotonic
                delay = self._next_backoff(ran_s)
                if delay > 0:
                    self._wait_state(
                        "CrashLoopBackOff",
                        f"back-off {delay:.0f}s restarting failed container={self.name} "
                        f"pod={self.pod.name}_{self.pod.namespace}({self.pod.uid})",
                    )
                    await self.pod.pause(delay)
                if self.stopping:
                    break
                self.restart_count += 1
        finally:
            self.finished.set()
            self.pod.changed()

    def _next_backoff(self, ran_s: float) -> float:
        if ran_s >= BACKOFF_RESET_S:
            self._backoff_s = 0.0
        delay = self._backoff_s
        self._backoff_s = BACKOFF_INITIAL_S if delay == 0 else min(delay * 2, BACKOFF_MAX_S)
        return delay

    def _wait_state(self, reason: str, message: str) -> None:
        self.waiting = (reason, message)
        self.ready = False
        self.pod.changed()

    async def _spawn(self, spec: Mapping[str, Any]) -> Instance:
        spec_path = self.dir / "launch.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        log = self.dir / f"{self.restart_count}.log"
        with log.open("ab") as output:
            process = await asyncio.create_subprocess_exec(
                *self.pod.node.launcher(spec_path),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        (self.dir / "pid").write_text(str(process.pid))
        instance = Instance(process, now_rfc3339(), time.monotonic(), log)
        self.instance = instance
        self.waiting = None
        self.started = "startupProbe" not in self.spec
        self.ready = self.started and "readinessProbe" not in self.spec
        if self.started:
            self.started_event.set()
        logger.info(
            "%s: started %s (pid %d): %s",
            self.pod.key, self.name, process.pid, " ".join(spec["argv"])[:200],
        )  # fmt: skip
        self.pod.changed()
        return instance

    def _finish(self, instance: Instance) -> None:
        returncode = instance.process.returncode
        assert returncode is not None
        instance.finished_at = now_rfc3339()
        if returncode < 0:
            instance.signal = -returncode
            instance.exit_code = 128 - returncode
        else:
            instance.exit_code = returncode
        # Whatever the process left behind goes with it, as a container's cgroup would.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(instance.process.pid, signal.SIGKILL)
        self.last = instance
        self.instance = None
        self.ready = False
        self.started = False
        logger.info("%s: %s exited with %s", self.pod.key, self.name, instance.exit_code)
        self.pod.changed()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, ``grace_s``, SIGKILL; no restart after."""
        self.stopping = True
        self.pod.wake.set()
        instance = self.instance
        if instance is not None and instance.process.returncode is None:
            await self._kill(instance, grace_s)
        if self.task is not None:
            await asyncio.wait({self.task}, timeout=grace_s + 10)

    async def _kill(self, instance: Instance, grace_s: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            instance.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(instance.process.wait(), timeout=max(grace_s, 0.0))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(instance.process.pid, signal.SIGKILL)
            await instance.process.wait()

    # -------------------------------------------------------------------------- probes

    async def _probe(self, instance: Instance) -> None:
        startup = self.spec.get("startupProbe")
        if startup is not None:
            if not await self._until(instance, startup, want=True):
                await self._fail_liveness(instance, "startup")
                return
            self.started = True
            self.started_event.set()
            self.ready = "readinessProbe" not in self.spec
            self.pod.changed()
        loops = []
        if "readinessProbe" in self.spec:
            loops.append(self._readiness(instance, self.spec["readinessProbe"]))
        if "livenessProbe" in self.spec:
            loops.append(self._liveness(instance, self.spec["livenessProbe"]))
        if loops:
            await asyncio.gather(*loops)

    async def _until(self, instance: Instance, probe: Mapping[str, Any], want: bool) -> bool:
        """Probe until ``want`` holds (``successThreshold`` or ``failureThreshold`` in a
        row, counted from ``initialDelaySeconds``); False when the threshold of the other
        outcome came first."""
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        need = int(probe.get("successThreshold", 1))
        allowed = int(probe.get("failureThreshold", 3))
        successes = failures = 0
        while instance.process.returncode is None:
            if await self.pod.run_probe(self, probe):
                successes, failures = successes + 1, 0
                if want and successes >= need:
                    return True
            else:
                successes, failures = 0, failures + 1
                if failures >= allowed:
                    return False
            await asyncio.sleep(period)
        return False

    async def _readiness(self, instance: Instance, probe: Mapping[str, Any]) -> None:
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        need = int(probe.get("successThreshold", 1))
        allowed = int(probe.get("failureThreshold", 3))
        successes = failures = 0
        while instance.process.returncode is None:
            if await self.pod.run_probe(self, probe):
                successes, failures = successes + 1, 0
                if successes >= need and not self.ready:
                    self.ready = True
                    self.pod.changed()
            else:
                successes, failures = 0, failures + 1
                if failures >= allowed and self.ready:
                    self.ready = False
                    self.pod.changed()
            await asyncio.sleep(period)

    async def _liveness(self, instance: Instance, probe: Mapping[str, Any]) -> None:
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        allowed = int(probe.get("failureThreshold", 3))
        failures = 0
        while instance.process.returncode is None:
            if await self.pod.run_probe(self, probe):
                failures = 0
            else:
                failures += 1
                if failures >= allowed:
                    await self._fail_liveness(instance, "liveness")
                    return
            await asyncio.sleep(period)

    async def _fail_liveness(self, instance: Instance, which: str) -> None:
        logger.warning("%s: %s failed its %s probe: restarting it", self.pod.key, self.name, which)
        instance.killed_reason = "Error"
        probe = self.spec.get(f"{which}Probe") or {}
        grace = probe.get("terminationGracePeriodSeconds")
        if grace is None:
            grace = self.pod.spec.get("terminationGracePeriodSeconds", 30)
        # The probe task is cancelled when the process exits: kill from a task of its own.
        self.pod.node.spawn(self._kill(instance, float(grace)))

    # -------------------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": str(self.spec.get("image", "")),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.started,
        }
        if self.instance is not None:
            status["containerID"] = f"process://{self.instance.process.pid}"
            status["state"] = {"running": {"startedAt": self.instance.started_at}}
        elif self.waiting is not None:
            reason, message = self.waiting
            waiting = {"reason": reason}
            if message:
                waiting["message"] = message
            status["state"] = {"waiting": waiting}
        elif self.last is not None:
            status["state"] = {"terminated": _terminated(self.last)}
        else:
            status["state"] = {"waiting": {"reason": "PodInitializing"}}
        if self.last is not None and "terminated" not in status["state"]:
            status["lastState"] = {"terminated": _terminated(self.last)}
        if self.last is not None and self.instance is None and self.waiting is None:
            status.pop("lastState", None)
        if self.last is not None and "containerID" not in status:
            status["containerID"] = f"process://{self.last.process.pid}"
        return status


def _terminated(instance: Instance) -> dict[str, Any]:
    code = instance.exit_code or 0
    terminated: dict[str, Any] = {
        "exitCode": code,
        "reason": instance.killed_reason or ("Completed" if code == 0 else "Error"),
        "startedAt": instance.started_at,
        "finishedAt": instance.finished_at,
        "containerID": f"process://{instance.process.pid}",
    }
    if instance.signal is not None:
        terminated["signal"] = instance.signal
    return terminated


def launcher_command(spec_path: Path) -> list[str]:
    """The command that starts ``launch.py``'s spec in namespaces of its own; arguments
    appended to it replace the spec's command line."""
    namespaces = ["unshare", "--mount", "--uts", "--propagation", "private"]
    if os.geteuid() != 0:
        namespaces[1:1] = ["--user", "--map-root-user"]
    return [*namespaces, "--", sys.executable, "-I", str(LAUNCH), str(spec_path)]


# ------------------------------------------------------------------------------------ pods


class Pod:
    """One pod bound to the node, from its volumes to its deletion."""

    def __init__(self, node: Node, manifest: Mapping[str, Any], ip: str) -> None:
        self.node = node
        self.manifest = manifest
        metadata = manifest["metadata"]
        self.name = str(metadata["name"])
        self.namespace = str(metadata["namespace"])
        self.uid = str(metadata["uid"])
        self.key = f"{self.namespace}/{self.name}"
        self.spec: Mapping[str, Any] = manifest["spec"]
        self.ip = ip
        self.dir = Path(node.config.state_dir) / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hostname = str(self.spec.get("hostname") or self.name)[:63]
        self.start_time = now_rfc3339()
        self.containers: list[Container] = []
        self.volume_error: str | None = None
        self.volumes: dict[str, Path] = {}
        self.terminating = False
        self.grace_s: float = 30.0
        self.termination = asyncio.Event()
        self.wake = asyncio.Event()
        self.dirty = asyncio.Event()
        self.gone = False
        self.phase = "Pending"
        self.transitions: dict[str, tuple[str, str]] = {}
        self.last_status: dict[str, Any] | None = None
        self.done = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=self.key)
        self.status_task = asyncio.create_task(self._publish(), name=f"{self.key} status")

    # ------------------------------------------------------------------ lifecycle

    def update(self, manifest: Mapping[str, Any]) -> None:
        self.manifest = manifest
        metadata = manifest["metadata"]
        if metadata.get("deletionTimestamp") and not self.terminating:
            self.request_termination(float(metadata.get("deletionGracePeriodSeconds") or 0))

    def request_termination(self, grace_s: float) -> None:
        if self.terminating:
            return
        self.terminating = True
        self.grace_s = grace_s
        for container in self.containers:
            container.stopping = True
        self.termination.set()
        self.wake.set()

    def changed(self) -> None:
        self.dirty.set()

    async def pause(self, seconds: float) -> None:
        """Sleep, cut short by the pod's termination."""
        self.wake.clear()
        if self.terminating:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=seconds)

    async def _run(self) -> None:
        try:
            await self._prepare_volumes()
            if not self.terminating:
                await self._start_containers()
            await self.termination.wait()
            await self._shut_down()
        except Exception:
            logger.exception("%s: failed", self.key)
            raise
        finally:
            self.done.set()

    async def _prepare_volumes(self) -> None:
        while not self.terminating:
            try:
                await self._write_volumes()
                self.volume_error = None
                return
            except (pods.ConfigError, ApiError) as error:
                self.volume_error = str(error)
                logger.info("%s: volumes: %s", self.key, error)
                self.changed()
                await self.pause(2.0)

    async def _start_containers(self) -> None:
        for spec in self.spec.get("initContainers") or []:
            kind = "sidecar" if spec.get("restartPolicy") == "Always" else "init"
            container = Container(self, spec, kind)
            self.containers.append(container)
            container.start()
            awaited = container.started_event if kind == "sidecar" else container.succeeded
            waiters = {
                asyncio.create_task(awaited.wait()),
                asyncio.create_task(self.termination.wait()),
                asyncio.create_task(container.finished.wait()),
            }
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if self.terminating:
                return
            if not awaited.is_set():  # an init container that failed for good
                self.phase = "Failed"
                self.changed()
                return
        for spec in self.spec.get("containers") or []:
            container = Container(self, spec, "main")
            self.containers.append(container)
            container.start()
        self.changed()

    async def _shut_down(self) -> None:
        deadline = time.monotonic() + self.grace_s
        logger.info("%s: stopping (grace %.0f s)", self.key, self.grace_s)
        main = [c for c in self.containers if c.kind != "sidecar"]
        sidecars = [c for c in self.containers if c.kind == "sidecar"]
        await asyncio.gather(*(c.stop(deadline - time.monotonic()) for c in main))
        for sidecar in reversed(sidecars):
            remaining = max(deadline - time.monotonic(), SIDECAR_MIN_GRACE_S)
            await sidecar.stop(remaining)
        self.phase = (
            "Succeeded"
            if all((c.last is None or c.last.exit_code == 0) for c in main)
            else "Failed"
        )
        self.changed()
        await self._flush_status()
        if not self.gone:
            status, body = await self.node.api.call(
                "DELETE",
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
            if status not in (200, 202, 404, 409):
                logger.warning("%s: final delete: %s %s", self.key, status, body)
        logger.info("%s: stopped", self.key)

    # ------------------------------------------------------------------ volumes

    async def _write_volumes(self) -> None:
        base = self.dir / "volumes"
        for volume in self.spec.get("volumes") or []:
            name = str(volume["name"])
            target = base / name
            if "hostPath" in volume:
                self.volumes[name] = Path(volume["hostPath"]["path"])
                continue
            files = await self._volume_files(volume)
            if files is None:
                raise pods.ConfigError(f"volume {name}: unsupported source {sorted(volume)}")
            target.mkdir(parents=True, exist_ok=True)
            for relative, (content, mode) in files.items():
                path = target / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
                path.chmod(mode)
            self.volumes[name] = target
        work = self.dir / "work"
        work.mkdir(exist_ok=True)

    async def _volume_files(self, volume: Mapping[str, Any]) -> dict[str, tuple[bytes, int]] | None:
        if "emptyDir" in volume:
            return {}
        if "secret" in volume:
            source = volume["secret"]
            return await self._object_files(
                "Secret", str(source["secretName"]), source, int(source.get("defaultMode", 0o644))
            )
        if "configMap" in volume:
            source = volume["configMap"]
            return await self._object_files(
                "ConfigMap", str(source["name"]), source, int(source.get("defaultMode", 0o644))
            )
        if "downwardAPI" in volume:
            source = volume["downwardAPI"]
            return self._downward_files(source, int(source.get("defaultMode", 0o644)))
        if "projected" in volume:
            projected = volume["projected"]
            mode = int(projected.get("defaultMode", 0o644))
            files: dict[str, tuple[bytes, int]] = {}
            for source in projected.get("sources") or []:
                if "serviceAccountToken" in source:
                    token = source["serviceAccountToken"]
                    files[str(token["path"])] = (await self._token(token), mode)
                elif "secret" in source:
                    secret = source["secret"]
                    files.update(
                        await self._object_files("Secret", str(secret["name"]), secret, mode)
                    )
                elif "configMap" in source:
                    config_map = source["configMap"]
                    files.update(
                        await self._object_files(
                            "ConfigMap", str(config_map["name"]), config_map, mode
                        )
                    )
                elif "downwardAPI" in source:
                    files.update(self._downward_files(source["downwardAPI"], mode))
                else:
                    raise pods.ConfigError(f"unsupported projection {sorted(source)}")
            return files
        return None

    async def _object_files(
        self, kind: str, name: str, source: Mapping[str, Any], mode: int
    ) -> dict[str, tuple[bytes, int]]:
        plural = "secrets" if kind == "Secret" else "configmaps"
        obj = await self.node.api.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        if obj is None:
            if source.get("optional"):
                return {}
            raise pods.ConfigError(f'{kind.lower()} "{name}" not found')
        if kind == "Secret":
            values = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        else:
            values = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
            values.update(
                {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
            )
        items = source.get("items")
        if not items:
            return {key: (value, mode) for key, value in values.items()}
        files = {}
        for item in items:
            key = str(item["key"])
            if key not in values:
                if source.get("optional"):
                    continue
                raise pods.ConfigError(f"{kind} {name} has no key {key}")
            files[str(item["path"])] = (values[key], int(item.get("mode", mode)))
        return files

    def _downward_files(self, source: Mapping[str, Any], mode: int) -> dict[str, tuple[bytes, int]]:
        facts = pods.PodFacts(self.manifest, self.ip, self.node.host_ip)
        files = {}
        for item in source.get("items") or []:
            if "fieldRef" in item:
                value = pods.field_value(facts, str(item["fieldRef"]["fieldPath"]))
            else:
                raise pods.ConfigError("downwardAPI: only fieldRef items are supported")
            files[str(item["path"])] = (value.encode(), int(item.get("mode", mode)))
        return files

    async def _token(self, projection: Mapping[str, Any]) -> bytes:
        account = str(self.spec.get("serviceAccountName") or "default")
        audience = projection.get("audience")
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": int(projection.get("expirationSeconds", 3607)),
                "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid,
                },
            },
        }  # fmt: skip
        status, body = await self.node.api.call(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
            request,
        )
        if status != 201:
            raise ApiError(f"token of ServiceAccount {account}: {status} {body}")
        return str(body["status"]["token"]).encode()

    # ------------------------------------------------------------------ launching

    def launch_spec(self, container: Container) -> dict[str, Any]:
        """How ``launch.py`` starts the container: command line, environment, mounts."""
        config = self.node.config
        spec = container.spec
        facts = pods.PodFacts(self.manifest, self.ip, self.node.host_ip)
        own = pods.container_env(spec, facts, self.node.lookup)
        env = {
            "PATH": f"{config.venv_bin}:{pods.SYSTEM_PATH}",
            "HOSTNAME": self.hostname,
            "HOME": os.environ.get("HOME", "/root"),
            **pods.IMAGE_ENV,
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.node.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.node.api_port),
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{self.node.api_port}",
        }
        for name in ("XDG_CACHE_HOME", "JAVA_HOME", "LANG"):
            if name in os.environ:
                env[name] = os.environ[name]
        env.update(own)
        mounts: list[dict[str, Any]] = [
            {"source": str(Path(config.podnet).parent), "target": POD_NET_MOUNT, "read_only": True},
            {"source": str(self.dir / "work"), "target": WORKDIR, "read_only": False},
        ]
        rewrites: dict[str, str] = {}
        for mount in spec.get("volumeMounts") or []:
            source = self.volumes.get(str(mount["name"]))
            if source is None:
                raise pods.ConfigError(f"volumeMount {mount['name']}: no such volume")
            if mount.get("subPath"):
                source = source / str(mount["subPath"])
            target = str(mount["mountPath"]).rstrip("/") or "/"
            run_path = target.startswith(("/run/", "/var/run/"))
            if run_path or Path(target).is_dir():
                mounts.append(
                    {
                        "source": str(source),
                        "target": target,
                        "read_only": bool(mount.get("readOnly")),
                    }
                )
            else:
                # Nowhere to mount it without touching the machine: the paths are rewritten.
                rewrites[target] = str(source)
        for name, value in env.items():
            for target, source in rewrites.items():
                if value == target or value.startswith(target + "/"):
                    env[name] = source + value[len(target) :]
        words = pods.argv(spec, env, Path(config.root), env["PATH"])
        for index, word in enumerate(words):
            for target, source in rewrites.items():
                if word == target or word.startswith(target + "/"):
                    words[index] = source + word[len(target) :]
        env.update(
            {
                "LD_PRELOAD": f"{POD_NET_MOUNT}/{Path(config.podnet).name}",
                "PODNET_IP": self.ip,
                "PODNET_HOSTS": f"{POD_NET_MOUNT}/hosts",
                "PODNET_NAMESPACE": self.namespace,
                "PODNET_HOSTNAME": self.hostname,
            }
        )
        working_dir = spec.get("workingDir")
        cwd = pods.image_path(str(working_dir), Path(config.root)) if working_dir else WORKDIR
        return {"argv": words, "env": env, "cwd": cwd, "hostname": self.hostname, "mounts": mounts}

    # ------------------------------------------------------------------ probes

    async def run_probe(self, container: Container, probe: Mapping[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                action = probe["httpGet"]
                port = self._port(container, action["port"])
                scheme = str(action.get("scheme", "HTTP")).lower()
                host = action.get("host") or self.ip
                headers = {h["name"]: h["value"] for h in action.get("httpHeaders") or []}
                url = f"{scheme}://{host}:{port}{action.get('path', '/')}"
                async with self.node.probes.get(
                    url,
                    headers=headers,
                    ssl=False,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                ) as response:
                    return 200 <= response.status < 400
            if "tcpSocket" in probe:
                action = probe["tcpSocket"]
                port = self._port(container, action["port"])
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(action.get("host") or self.ip, port), timeout
                )
                writer.close()
                return True
            if "exec" in probe:
                spec = self.launch_spec(container)
                spec["argv"] = pods.argv(
                    {"command": probe["exec"]["command"]},
                    spec["env"],
                    Path(self.node.config.root),
                    spec["env"]["PATH"],
                )
                path = container.dir / "probe.json"
                path.write_text(json.dumps(spec))
                process = await asyncio.create_subprocess_exec(
                    *self.node.launcher(path),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    return await asyncio.wait_for(process.wait(), timeout) == 0
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    await process.wait()
                    return False
        except (OSError, aiohttp.ClientError, TimeoutError, pods.ConfigError):
            return False
        logger.warning("%s: unsupported probe %s: taken as a success", self.key, sorted(probe))
        return True

    def _port(self, container: Container, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for item in container.spec.get("ports") or []:
            if item.get("name") == port:
                return int(item["containerPort"])
        raise pods.ConfigError(f"no port named {port}")

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        init = [c for c in self.containers if c.kind != "main"]
        main = [c for c in self.containers if c.kind == "main"]
        init_specs = self.spec.get("initContainers") or []
        initialized = len(init) == len(init_specs) and all(
            (c.started if c.kind == "sidecar" else c.succeeded.is_set()) for c in init
        )
        main_specs = self.spec.get("containers") or []
        containers_ready = (
            initialized
            and len(main) == len(main_specs)
            and all(c.ready for c in main)
            and all(c.ready for c in init if c.kind == "sidecar")
        )
        if self.phase not in ("Succeeded", "Failed"):
            running = any(c.instance is not None or c.restart_count > 0 for c in main)
            self.phase = "Running" if running else "Pending"
        conditions = {
            "PodReadyToStartContainers": True,
            "Initialized": initialized,
            "ContainersReady": containers_ready and not self.terminating,
            "Ready": containers_ready and not self.terminating,
        }
        status: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": self.node.host_ip,
            "hostIPs": [{"ip": self.node.host_ip}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": [self._condition(kind, value) for kind, value in conditions.items()],
        }
        statuses = {c.name: c.status() for c in self.containers}
        status["initContainerStatuses"] = [
            statuses.get(spec["name"]) or _pending(spec, "PodInitializing") for spec in init_specs
        ]
        waiting_reason = "ContainerCreating" if initialized else "PodInitializing"
        status["containerStatuses"] = [
            statuses.get(spec["name"]) or _pending(spec, waiting_reason) for spec in main_specs
        ]
        if self.volume_error is not None:
            for item in status["containerStatuses"]:
                if "waiting" in item["state"]:
                    item["state"]["waiting"] = {
                        "reason": "ContainerCreating",
                        "message": self.volume_error,
                    }
        return status

    def _condition(self, kind: str, value: bool) -> dict[str, Any]:
        text = "True" if value else "False"
        previous = self.transitions.get(kind)
        if previous is None or previous[0] != text:
            self.transitions[kind] = (text, now_rfc3339())
        return {
            "type": kind,
            "status": text,
            "lastProbeTime": None,
            "lastTransitionTime": self.transitions[kind][1],
        }

    async def _publish(self) -> None:
        while not self.gone:
            await self.dirty.wait()
            self.dirty.clear()
            await self._flush_status()
            # Changes within this window go out together.
            await asyncio.sleep(0.05)

    async def _flush_status(self) -> None:
        status = self.status()
        if status == self.last_status or self.gone:
            return
        for attempt in range(30):
            try:
                code, body = await self.node.api.call(
                    "PATCH",
                    f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                    {"metadata": {"uid": self.uid}, "status": status},
                    content_type="application/strategic-merge-patch+json",
                )
            except (aiohttp.ClientError, TimeoutError) as error:
                code, body = 0, str(error)
            if code == 200:
                self.last_status = status
                return
            if code in (404, 409, 422) and self.gone:
                return
            if code == 404:
                self.gone = True
                return
            logger.warning("%s: status: %s %s", self.key, code, str(body)[:300])
            await asyncio.sleep(min(0.2 * (attempt + 1), 2))


def _pending(spec: Mapping[str, Any], reason: str) -> dict[str, Any]:
    return {
        "name": spec["name"],
        "image": str(spec.get("image", "")),
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "started": False,
        "state": {"waiting": {"reason": reason}},
    }


# ------------------------------------------------------------------------------------ node


@dataclass
class Node:
    config: NodeConfig
    api: Api = field(init=False)
    host_ip: str = "127.0.0.1"
    pods: dict[str, Pod] = field(default_factory=dict)
    manifests: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    services: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    cache: dict[tuple[str, str, str], Mapping[str, Any] | None] = field(default_factory=dict)
    next_address: int = 1
    admitting: set[str] = field(default_factory=set)
    background: set[asyncio.Task[None]] = field(default_factory=set)
    table_dirty: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.api = Api(self.config)
        self.api_port = int(self.config.api_url.rsplit(":", 1)[1])
        self.probes = aiohttp.ClientSession()
        self.net_dir = Path(self.config.podnet).parent
        self.refusing_ip = f"127.{self.config.subnet}.255.254"

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background (kept referenced until done)."""
        task = asyncio.create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def launcher(self, spec_path: Path) -> list[str]:
        return launcher_command(spec_path)

    def allocate_ip(self) -> str:
        index = self.next_address
        self.next_address += 1
        return f"127.{self.config.subnet}.{index // 250}.{index % 250 + 1}"

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A Secret or ConfigMap, read just before (``prefetch``) the container starts."""
        return self.cache.get((kind, namespace, name))

    async def prefetch(self, pod: Mapping[str, Any]) -> None:
        namespace = pod["metadata"]["namespace"]
        wanted: set[tuple[str, str]] = set()
        spec = pod["spec"]
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            for source in container.get("envFrom") or []:
                if "secretRef" in source:
                    wanted.add(("Secret", source["secretRef"]["name"]))
                if "configMapRef" in source:
                    wanted.add(("ConfigMap", source["configMapRef"]["name"]))
            for item in container.get("env") or []:
                value_from = item.get("valueFrom") or {}
                if "secretKeyRef" in value_from:
                    wanted.add(("Secret", value_from["secretKeyRef"]["name"]))
                if "configMapKeyRef" in value_from:
                    wanted.add(("ConfigMap", value_from["configMapKeyRef"]["name"]))
        for kind, name in wanted:
            plural = "secrets" if kind == "Secret" else "configmaps"
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ApiError):
                self.cache[(kind, namespace, name)] = await self.api.get(
                    f"/api/v1/namespaces/{namespace}/{plural}/{name}"
                )

    # ------------------------------------------------------------------ registration

    async def register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.config.name,
                "labels": {
                    "kubernetes.io/hostname": self.config.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "spec": {},
            "status": self._node_status(),
        }
        status, body = await self.api.call("POST", "/api/v1/nodes", node)
        if status == 409:
            status, body = await self.api.call(
                "PATCH",
                f"/api/v1/nodes/{self.config.name}/status",
                {"status": self._node_status()},
                content_type="application/strategic-merge-patch+json",
            )
        if status not in (200, 201):
            raise ApiError(f"registering the node: {status} {body}")

    def _node_status(self) -> dict[str, Any]:
        now = now_rfc3339()
        resources = {"cpu": "64", "memory": "256Gi", "pods": "250", "ephemeral-storage": "100Gi"}

        def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
            return {
                "type": kind, "status": status, "reason": reason, "message": reason,
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }  # fmt: skip

        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("Ready", "True", "KubeletReady"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.host_ip},
                {"type": "Hostname", "address": self.config.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.config.kubelet_port}},
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "",
                "kernelVersion": os.uname().release, "osImage": "kafka-group-operator e2e node",
                "containerRuntimeVersion": "process://1", "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }  # fmt: skip

    async def heartbeat(self) -> None:
        lease_path = (
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.config.name}"
        )
        last_status = 0.0
        while True:
            try:
                lease = await self.api.get(lease_path)
                if lease is None:
                    await self.api.call(
                        "POST",
                        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                        {
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {"name": self.config.name},
                            "spec": {
                                "holderIdentity": self.config.name,
                                "leaseDurationSeconds": LEASE_SECONDS,
                                "renewTime": now_micro(),
                            },
                        },
                    )
                else:
                    lease["spec"]["renewTime"] = now_micro()
                    await self.api.call("PUT", lease_path, lease)
                if time.monotonic() - last_status > 30:
                    await self.api.call(
                        "PATCH",
                        f"/api/v1/nodes/{self.config.name}/status",
                        {"status": {"conditions": self._node_status()["conditions"]}},
                        content_type="application/strategic-merge-patch+json",
                    )
                    last_status = time.monotonic()
            except (aiohttp.ClientError, TimeoutError, ApiError) as error:
                logger.warning("heartbeat: %s", error)
            await asyncio.sleep(RENEW_SECONDS)

    # ------------------------------------------------------------------ pods and services

    def on_pod(self, kind: str, obj: Any) -> None:
        if kind == "SYNC":
            seen = {item["metadata"]["uid"] for item in obj}
            for uid in list(self.manifests):
                if uid not in seen:
                    self._pod_deleted(self.manifests[uid])
            for item in obj:
                self._pod_seen(item)
        elif kind == "DELETED":
            self._pod_deleted(obj)
        else:
            self._pod_seen(obj)
        self.table_dirty.set()

    def _pod_seen(self, manifest: Mapping[str, Any]) -> None:
        uid = manifest["metadata"]["uid"]
        self.manifests[uid] = manifest
        pod = self.pods.get(uid)
        if pod is not None:
            pod.update(manifest)
            return
        if (manifest.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        if manifest["metadata"].get("deletionTimestamp"):
            # Never started here: nothing to stop, only the deletion to finish.
            self.spawn(self._delete_unstarted(manifest))
            return
        self.spawn(self._admit(manifest))

    async def _admit(self, manifest: Mapping[str, Any]) -> None:
        uid = manifest["metadata"]["uid"]
        if uid in self.pods or uid in self.admitting:
            return
        self.admitting.add(uid)
        try:
            await self.prefetch(manifest)
            pod = Pod(self, self.manifests.get(uid, manifest), self.allocate_ip())
            self.pods[uid] = pod
        finally:
            self.admitting.discard(uid)
        latest = self.manifests.get(uid)
        if latest is not None:
            pod.update(latest)
        logger.info("%s: admitted at %s", pod.key, pod.ip)

    async def _delete_unstarted(self, manifest: Mapping[str, Any]) -> None:
        metadata = manifest["metadata"]
        await self.api.call(
            "DELETE",
            f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}},
        )

    def _pod_deleted(self, manifest: Mapping[str, Any]) -> None:
        uid = manifest["metadata"]["uid"]
        self.manifests.pop(uid, None)
        pod = self.pods.get(uid)
        if pod is not None:
            pod.gone = True
            pod.request_termination(
                float(manifest["metadata"].get("deletionGracePeriodSeconds") or 2)
            )

    def on_service(self, kind: str, obj: Any) -> None:
        if kind == "SYNC":
            self.services = {
                f"{s['metadata']['namespace']}/{s['metadata']['name']}": s for s in obj
            }
        elif kind == "DELETED":
            self.services.pop(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}", None)
        else:
            self.services[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj
        self.table_dirty.set()

    async def write_table(self) -> None:
        path = self.net_dir / "hosts"
        written = None
        while True:
            await self.table_dirty.wait()
            self.table_dirty.clear()
            table = pods.name_table(
                list(self.services.values()),
                list(self.manifests.values()),
                ("127.0.0.1", self.api_port),
                self.refusing_ip,
            )
            if table != written:
                temporary = path.with_suffix(".new")
                temporary.write_text(table)
                temporary.replace(path)
                written = table
            await asyncio.sleep(0.02)

    async def reap(self) -> None:
        """Forget pods whose work is done."""
        while True:
            for uid, pod in list(self.pods.items()):
                if pod.done.is_set() and (pod.gone or uid not in self.manifests):
                    pod.gone = True
                    pod.status_task.cancel()
                    del self.pods[uid]
            await asyncio.sleep(1)

    # ------------------------------------------------------------------ kubelet API

    async def serve_kubelet(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.config.ca_file)
        context.load_cert_chain(self.config.certificate_file, self.config.key_file)
        context.verify_mode = ssl.CERT_REQUIRED
        await web.TCPSite(
            runner, "127.0.0.1", self.config.kubelet_port, ssl_context=context
        ).start()
        return runner

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _find(self, namespace: str, name: str) -> Pod | None:
        found = [
            p for p in self.pods.values()
            if p.namespace == namespace and p.name == name
        ]  # fmt: skip
        found.sort(key=lambda p: p.start_time)
        return found[-1] if found else None

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        pod = self._find(request.match_info["namespace"], request.match_info["pod"])
        name = request.match_info["container"]
        container = (
            None if pod is None else next((c for c in pod.containers if c.name == name), None)
        )
        if container is None:
            raise web.HTTPNotFound(text=f"container {name} not found")
        previous = request.query.get("previous") == "true"
        instance = container.last if previous else (container.instance or container.last)
        if instance is None:
            raise web.HTTPBadRequest(text=f"container {name} has not run yet")
        data = instance.log.read_bytes()
        tail = request.query.get("tailLines")
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(tail) :]) if int(tail) > 0 else b""
        limit = request.query.get("limitBytes")
        if limit is not None:
            data = data[: int(limit)]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        if request.query.get("follow") == "true" and not previous:
            offset = instance.log.stat().st_size
            while True:
                with instance.log.open("rb") as log:
                    log.seek(offset)
                    more = log.read()
                if more:
                    offset += len(more)
                    await response.write(more)
                elif instance.process.returncode is not None:
                    break
                await asyncio.sleep(0.2)
        await response.write_eof()
        return response

    # ------------------------------------------------------------------ shutdown

    async def stop_all(self) -> None:
        active = list(self.pods.values())
        for pod in active:
            pod.gone = True
            pod.request_termination(0)
        await asyncio.gather(*(asyncio.wait({pod.task}, timeout=20) for pod in active))
        await self.probes.close()
        await self.api.close()


async def run(config: NodeConfig) -> None:
    node = Node(config)
    (node.net_dir / "hosts").touch()
    node.table_dirty.set()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    runner = await node.serve_kubelet()
    await node.register()
    tasks = [
        asyncio.create_task(node.heartbeat()),
        asyncio.create_task(node.write_table()),
        asyncio.create_task(node.reap()),
        asyncio.create_task(informer(node.api, "/api/v1/services", {}, node.on_service)),
        asyncio.create_task(
            informer(
                node.api,
                "/api/v1/pods",
                {"fieldSelector": f"spec.nodeName={config.name}"},
                node.on_pod,
            )
        ),
    ]
    logger.info("node %s ready: pods on 127.%d.0.0/16", config.name, config.subnet)
    await stopping.wait()
    logger.info("stopping every pod")
    for task in tasks:
        task.cancel()
    await node.stop_all()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(run(NodeConfig.load(args.config)))


if __name__ == "__main__":
    main()
