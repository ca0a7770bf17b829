"""A Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, started from the binaries ``e2e/controlplane/build.sh`` builds (and caches).

The API server runs with RBAC, a static token for the admin (group ``system:masters``),
ServiceAccount tokens signed by a key generated here, and the OwnerReferencesPermissionEnforcement
admission plugin; its serving certificate names ``kubernetes.default.svc``, so that in-cluster
clients verify it with the ServiceAccount's ``ca.crt``. Every wait follows a condition (a
component's ``/readyz``, the default ServiceAccount); the bounds only turn a component that
never comes up into an error carrying its log.

Everything listens on 127.0.0.1, on ports below the kernel's ephemeral range: pods bind theirs
from that range on their own loopback addresses (``podnet.c``), and a connection a pod makes to
127.0.0.1 goes to the pod's own address only when the pod listens on that port.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "e2e" / "controlplane" / "build.sh"
# The Services' virtual range: the API server allocates from it, nobody connects to it (pods
# resolve Services to their endpoints, see podnet.c).
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
API_SERVER_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "localhost",
)
# Below /proc/sys/net/ipv4/ip_local_port_range's usual start (32768).
PORTS = (20000, 32767)
# A component that is not ready within this long will not be: the bound reports it.
READY_BOUND_S = 300.0


class ControlPlaneError(RuntimeError):
    """A component could not be built, started or reached."""


def kubernetes_version() -> str:
    for line in (BUILD.parent / "go.mod").read_text().splitlines():
        if line.startswith("require k8s.io/kubernetes "):
            return line.split()[-1]
    raise ControlPlaneError("e2e/controlplane/go.mod names no k8s.io/kubernetes release")


def binaries() -> Path:
    """The directory of the three binaries: built once per release (see build.sh)."""
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"{BUILD.name} failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def etcd_binary() -> str:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found is None:
        raise ControlPlaneError("etcd is missing: apt-get install etcd-server (see .ci/run)")
    return found


def loopback_port() -> int:
    """A free port on 127.0.0.1 outside the ephemeral range (see the module docstring)."""
    for _ in range(1000):
        port = random.randint(*PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ControlPlaneError(f"no free port in {PORTS}")


@dataclass
class Authority:
    """A CA of our own and the certificates it issues (PEM files in ``directory``)."""

    directory: Path
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    certificate: x509.Certificate | None = None

    def __post_init__(self) -> None:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kgo-e2e-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        _write(self.directory / "ca.crt", self.certificate.public_bytes(serialization.Encoding.PEM))

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    def issue(
        self,
        name: str,
        *,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        client: bool = False,
        organization: str | None = None,
    ) -> tuple[Path, Path]:
        """A serving (or, with ``client``, a client) certificate and its key: their paths."""
        assert self.certificate is not None
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
        )
        alternative: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        alternative += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        if alternative:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(alternative), critical=False
            )
        certificate = builder.sign(self.key, hashes.SHA256())
        certificate_path = self.directory / f"{name}.crt"
        key_path = self.directory / f"{name}.key"
        _write(certificate_path, certificate.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _private_pem(key))
        return certificate_path, key_path


def _private_pem(key: Any) -> bytes:
    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


@dataclass
class Component:
    """One control-plane process, its log in a file of its own."""

    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(grace_s)
        self.process = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


def wait_until(
    condition: Callable[[], bool],
    what: str,
    components: list[Component],
    bound_s: float = READY_BOUND_S,
) -> None:
    """Poll ``condition`` until it holds; fail at once when a component exits."""
    deadline = time.monotonic() + bound_s
    delay = 0.05
    while not condition():
        for component in components:
            if not component.running():
                raise ControlPlaneError(
                    f"{component.name} exited while waiting for {what}:\n{component.log_tail()}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {c.name}\n{c.log_tail(15)}" for c in components)
            raise ControlPlaneError(f"{what}: not within {bound_s:.0f} s\n{tails}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


class ControlPlane:
    """``start()``; then ``kubeconfig``, ``url``, ``token``; ``stop()``."""

    def __init__(self, directory: Path, bin_dir: Path) -> None:
        self.directory = directory
        self.bin_dir = bin_dir
        self.pki = directory / "pki"
        self.pki.mkdir(parents=True, exist_ok=True)
        self.api_port = loopback_port()
        self.url = f"https://127.0.0.1:{self.api_port}"
        self.token = secrets.token_urlsafe(32)
        self.kubeconfig = directory / "kubeconfig"
        self.components: list[Component] = []
        self.authority = Authority(self.pki)
        self._ssl = ssl.create_default_context(cafile=str(self.authority.ca_file))

    @property
    def ca_file(self) -> Path:
        return self.authority.ca_file

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        pki = self.pki
        serving, serving_key = self.authority.issue(
            "kube-apiserver", dns=API_SERVER_NAMES, ips=("127.0.0.1", _first_service_ip())
        )
        kubelet_client, kubelet_client_key = self.authority.issue(
            "kube-apiserver-kubelet-client", client=True, organization="system:masters"
        )
        service_accounts = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write(pki / "sa.key", _private_pem(service_accounts))
        _write(
            pki / "sa.pub",
            service_accounts.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )
        (pki / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')
        (pki / "tokens.csv").chmod(0o600)
        self._write_kubeconfig()

        etcd_port, etcd_peer_port = loopback_port(), loopback_port()
        shm = Path("/dev/shm")
        etcd_data = Path(
            os.environ.get("KGO_E2E_ETCD_DIR")
            or (
                str(shm / f"kgo-e2e-etcd-{os.getpid()}-{secrets.token_hex(3)}")
                if shm.is_dir()
                else str(self.directory / "etcd")
            )
        )
        self._etcd_data = etcd_data
        etcd = self._component(
            "etcd",
            [
                etcd_binary(), "--name", "e2e", "--data-dir", str(etcd_data),
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer_port}",
                "--initial-cluster", f"e2e=http://127.0.0.1:{etcd_peer_port}",
                "--listen-metrics-urls", "",
                "--log-level", "warn",
            ],
        )  # fmt: skip
        etcd.start()
        wait_until(
            lambda: self._http_ok(f"http://127.0.0.1:{etcd_port}/health"), "etcd /health", [etcd]
        )
        bin_dir = self.bin_dir
        apiserver = self._component(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving}",
                f"--tls-private-key-file={serving_key}",
                f"--client-ca-file={self.ca_file}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Logs (kubectl logs) come from the node through the API server.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-certificate-authority={self.ca_file}",
                f"--kubelet-client-certificate={kubelet_client}",
                f"--kubelet-client-key={kubelet_client_key}",
                f"--cert-dir={pki / 'apiserver'}",
                "--profiling=false",
                "--v=1",
            ],
        )
        apiserver.start()
        wait_until(lambda: self._api_ok("/readyz"), "kube-apiserver /readyz", [etcd, apiserver])

        controller_manager_port, scheduler_port = loopback_port(), loopback_port()
        kubeconfig = str(self.kubeconfig)
        controller_manager = self._component(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={controller_manager_port}",
                f"--cert-dir={pki / 'controller-manager'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                # Pod addresses are loopback addresses (see podnet.c), which Endpoints and
                # EndpointSlices refuse: the node resolves Services from pods itself.
                "--controllers=*,-endpoints-controller,-endpointslice-controller,"
                "-endpointslice-mirroring-controller",
                "--v=1",
            ],
        )
        scheduler = self._component(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={scheduler_port}",
                f"--cert-dir={pki / 'scheduler'}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        controller_manager.start()
        scheduler.start()
        everything = [etcd, apiserver, controller_manager, scheduler]
        for name, port in (
            ("kube-controller-manager", controller_manager_port),
            ("kube-scheduler", scheduler_port),
        ):
            url = f"https://127.0.0.1:{port}/healthz"
            wait_until(
                lambda url=url: self._http_ok(url, verify=False), f"{name} /healthz", everything
            )
        # The controllers run: the default ServiceAccount exists, pods may be created.
        wait_until(
            lambda: self._api_ok("/api/v1/namespaces/default/serviceaccounts/default"),
            "the default ServiceAccount",
            everything,
        )

    def _component(self, name: str, command: list[str]) -> Component:
        component = Component(name, command, self.directory / f"{name}.log")
        self.components.append(component)
        return component

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.ca_file),
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def _http_ok(self, url: str, verify: bool = True) -> bool:
        context = self._ssl if verify else ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _api_ok(self, path: str) -> bool:
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5, context=self._ssl) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """One request as the admin; the decoded JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30, context=self._ssl) as response:
            return json.loads(response.read() or b"null")

    def stop(self) -> None:
        # The reverse of the start: the API server's clients first, etcd last.
        for component in reversed(self.components):
            component.stop()
        etcd_data = getattr(self, "_etcd_data", None)
        if etcd_data is not None and str(etcd_data).startswith("/dev/shm/"):
            with contextlib.suppress(OSError):
                shutil.rmtree(etcd_data)

    def logs(self, lines: int = 30) -> str:
        return "\n".join(f"--- {c.name}\n{c.log_tail(lines)}" for c in self.components)


def _first_service_ip() -> str:
    return str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
