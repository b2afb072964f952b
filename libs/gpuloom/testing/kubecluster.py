"""A real Kubernetes control plane for tests: etcd, kube-apiserver and kube-scheduler
(v1.20.2, built by `make kube`) on free loopback ports, with the flags of
shared/notes/kubernetes-here.md §4. No kubelet and no controller-manager: Nodes are made
through the API with the status they are to have (`make_node`), and pods are only bound,
never run (they stay Pending with `spec.nodeName` set).

    cp = KubeControlPlane(tmp_dir, extender_url="http://127.0.0.1:PORT/scheduler").start()
    async with KubeClient(cp.kube_config()) as kube:
        await make_node(kube, "node-a", gpus=8)
        await make_pod(kube, "default", "p", gpus=1)   # the scheduler asks the extender
    cp.stop()

`binaries()` is None when the control plane is not built: a test skips with `SKIP_REASON`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuloom.kube.scheduler_config import scheduler_config_stanza
from gpuloom.kubeapi import Conflict, KubeClient, KubeConfig, Obj, node_path, pod_path
from gpuloom.natsserver import die_with_parent, free_ports
from gpuloom.testing.cluster import Cluster
from gpuloom.testing.hostproc import terminate

K8S_VERSION = "1.20.2"
#: gpuloom's extended resource: what a pod asks for, and what the extender alone accounts.
GPU_RESOURCE = "gpuloom.io/gpu"
SKIP_REASON = (
    f"no Kubernetes {K8S_VERSION} control plane built (kube-apiserver, kube-scheduler, etcd): "
    "run `make kube` (or set GPULOOM_K8S_BIN to a directory holding them)"
)
#: When nothing at all came from a process, how much of its log a failure shows.
LOG_TAIL_LINES = 40


def binaries(environ: Mapping[str, str] | None = None) -> Path | None:
    """The directory of kube-apiserver, kube-scheduler and etcd: `$GPULOOM_K8S_BIN`, else
    `$GPULOOM_K8S_CACHE/bin`, else `~/.cache/gpuloom/k8s-1.20.2/bin` (where `make kube`
    builds them). None when one of them is missing there."""
    env = os.environ if environ is None else environ
    if env.get("GPULOOM_K8S_BIN"):
        candidate = Path(env["GPULOOM_K8S_BIN"])
    elif env.get("GPULOOM_K8S_CACHE"):
        candidate = Path(env["GPULOOM_K8S_CACHE"]) / "bin"
    else:
        candidate = Path.home() / ".cache" / "gpuloom" / f"k8s-{K8S_VERSION}" / "bin"
    candidate = candidate.expanduser()
    wanted = ("kube-apiserver", "kube-scheduler", "etcd")
    if all(os.access(candidate / name, os.X_OK) for name in wanted):
        return candidate
    return None


def scheduler_config(kubeconfig: Path, health_port: int, extenders: str | None) -> str:
    """A whole kubescheduler.config.k8s.io/v1beta1 configuration: health and metrics on
    loopback (v1beta1 defaults them to 0.0.0.0:10251), no leader election, and the
    `extenders` stanza (`scheduler_config_stanza`) when given."""
    address = json.dumps(f"127.0.0.1:{health_port}")
    text = (
        "apiVersion: kubescheduler.config.k8s.io/v1beta1\n"
        "kind: KubeSchedulerConfiguration\n"
        "clientConnection:\n"
        f"  kubeconfig: {json.dumps(str(kubeconfig))}\n"
        f"healthzBindAddress: {address}\n"
        f"metricsBindAddress: {address}\n"
        "leaderElection:\n"
        "  leaderElect: false\n"
    )
    return text + (extenders or "")


class ControlPlaneError(RuntimeError):
    """A process of the control plane did not start, or did not become healthy."""


class KubeControlPlane:
    """etcd + kube-apiserver + kube-scheduler, in `base_dir` (a new temporary directory
    when None), with their logs in `base_dir/logs/{etcd,apiserver,scheduler}.log`.

    The API server authenticates a static bearer `token` (user `admin`, group
    system:masters) and allows everything; its certificate is self-signed
    (`ca_file`). `kubeconfig_path` (JSON) holds both, for kube-scheduler, kubectl and
    `KubeConfig.load`. The admission plugins ServiceAccount and TaintNodesByCondition are
    off, as no controller would ever make a ServiceAccount or untaint a Node.

    `extender_url` (changeable before `start_scheduler`/`restart_scheduler`) is the
    scheduler extender's URL prefix; None runs kube-scheduler without one."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        extender_url: str | None = None,
        extender_http_timeout: str = "5s",
        node_cache_capable: bool = True,
        managed_resources: Sequence[str] = (GPU_RESOURCE,),
        bin_dir: Path | None = None,
        scheduler_verbosity: int = 2,
    ) -> None:
        #: a directory of its own (base_dir None) goes with `stop`; a given one stays
        self._own_dir = base_dir is None
        self.base_dir = (
            Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="gpuloom-k8s-"))
        )
        self.extender_url = extender_url
        self.extender_http_timeout = extender_http_timeout
        self.node_cache_capable = node_cache_capable
        self.managed_resources = tuple(managed_resources)
        self.scheduler_verbosity = scheduler_verbosity
        self._bin_dir = bin_dir
        self.log_dir = self.base_dir / "logs"
        self.ca_file = self.base_dir / "apiserver.crt"
        self.kubeconfig_path = self.base_dir / "kubeconfig.json"
        self.scheduler_config_path = self.base_dir / "scheduler-config.yaml"
        self.token = ""
        self.etcd_port = self.etcd_peer_port = self.api_port = self.scheduler_port = 0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- where it is -----------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def scheduler_health_url(self) -> str:
        return f"http://127.0.0.1:{self.scheduler_port}/healthz"

    def kube_config(self) -> KubeConfig:
        """The kubeconfig, read as a service would (`KubeConfig.load`)."""
        return KubeConfig.load(self.kubeconfig_path)

    def running(self, name: str) -> bool:
        """Whether process `name` (etcd, apiserver, scheduler) runs."""
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    def pid(self, name: str) -> int | None:
        proc = self._procs.get(name)
        return proc.pid if proc is not None else None

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def log_tail(self, name: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of the log of process `name`."""
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- life ------------------------------------------------------------------------------

    def __enter__(self) -> KubeControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, scheduler: bool = True, timeout: float = 60.0) -> KubeControlPlane:
        """Start etcd, then kube-apiserver (until /readyz answers and the `default`
        namespace exists), then, with `scheduler`, kube-scheduler (until /healthz)."""
        if self.running("apiserver"):
            if scheduler and not self.running("scheduler"):
                self.start_scheduler()
            return self
        bin_dir = self._bin_dir or binaries()
        if bin_dir is None:
            raise ControlPlaneError(SKIP_REASON)
        self._bin_dir = bin_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.etcd_port, self.etcd_peer_port, self.api_port, self.scheduler_port = free_ports(4)
        self._write_credentials()
        deadline = time.monotonic() + timeout
        try:
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            if scheduler:
                self.start_scheduler(timeout=max(5.0, deadline - time.monotonic()))
        except BaseException:
            self._halt()  # the logs stay, for the error's reader
            raise
        return self

    def start_scheduler(self, timeout: float = 30.0) -> None:
        """Start kube-scheduler with the extender of `extender_url` (none when None), once
        the API server runs; returns once its /healthz answers."""
        if not self.running("apiserver"):
            raise ControlPlaneError("start the API server first (start(scheduler=False))")
        if self.running("scheduler"):
            return
        assert self._bin_dir is not None
        stanza = (
            scheduler_config_stanza(
                self.extender_url,
                http_timeout=self.extender_http_timeout,
                managed_resources=self.managed_resources,
                node_cache_capable=self.node_cache_capable,
            )
            if self.extender_url
            else None
        )
        self.scheduler_config_path.write_text(
            scheduler_config(self.kubeconfig_path, self.scheduler_port, stanza)
        )
        self._spawn(
            "scheduler",
            [
                str(self._bin_dir / "kube-scheduler"),
                f"--config={self.scheduler_config_path}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"-v={self.scheduler_verbosity}",
            ],
        )
        self._wait("scheduler", self._http_ok(self.scheduler_health_url), _deadline_in(timeout))

    def stop_scheduler(self) -> None:
        self._terminate("scheduler")

    def restart_scheduler(self, extender_url: str | None = None, timeout: float = 30.0) -> None:
        """Stop kube-scheduler and start it again (with `extender_url` when given)."""
        if extender_url is not None:
            self.extender_url = extender_url
        self.stop_scheduler()
        self.start_scheduler(timeout=timeout)

    def stop(self) -> None:
        """Stop the scheduler, the API server and etcd (SIGTERM, then SIGKILL after a few
        seconds), and remove etcd's data (its WAL preallocates ~120 MB). The logs stay in
        a `base_dir` that was given; a temporary directory of its own goes. Idempotent."""
        self._halt()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _halt(self) -> None:
        for name in ("scheduler", "apiserver", "etcd"):
            self._terminate(name)
        shutil.rmtree(self.base_dir / "etcd-data", ignore_errors=True)

    # -- the parts -------------------------------------------------------------------------

    def _write_credentials(self) -> None:
        if not self.ca_file.exists():
            _write_serving_cert(self.ca_file, self.base_dir / "apiserver.key")
        if not (self.base_dir / "sa.key").exists():
            _write_key_pair(self.base_dir / "sa.key", self.base_dir / "sa.pub")
        tokens = self.base_dir / "tokens.csv"
        if not tokens.exists():
            tokens.write_text(f'{secrets.token_hex(16)},admin,admin,"system:masters"\n')
            tokens.chmod(0o600)
        self.token = tokens.read_text().split(",", 1)[0]
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "local",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.api_url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        }
        self.kubeconfig_path.write_text(json.dumps(kubeconfig, indent=1) + "\n")
        self.kubeconfig_path.chmod(0o600)

    def _start_etcd(self, deadline: float) -> None:
        assert self._bin_dir is not None
        data = self.base_dir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self._spawn(
            "etcd",
            [
                str(self._bin_dir / "etcd"),
                "--name=k8s",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=k8s={peer}",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as response:
                return bool(json.load(response).get("health") == "true")

        self._wait("etcd", healthy, deadline)

    def _start_apiserver(self, deadline: float) -> None:
        assert self._bin_dir is not None
        d = self.base_dir
        self._spawn(
            "apiserver",
            [
                str(self._bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                "--insecure-port=0",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=AlwaysAllow",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--endpoint-reconciler-type=none",
            ],
        )
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        self._wait("apiserver", self._http_ok(f"{self.api_url}/readyz", ctx), deadline)
        # pods go in `default`, which the API server makes itself soon after it is ready
        self._wait(
            "apiserver",
            self._http_ok(f"{self.api_url}/api/v1/namespaces/default", ctx),
            deadline,
            what="the default namespace",
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.log_path(name), "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(args)}\n".encode())
            log.flush()
            self._procs[name] = subprocess.Popen(
                args,
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    def _http_ok(self, url: str, ctx: ssl.SSLContext | None = None) -> Callable[[], bool]:
        def check() -> bool:
            request = urllib.request.Request(url)
            if ctx is not None:
                request.add_header("Authorization", f"Bearer {self.token}")
            with urllib.request.urlopen(request, timeout=2, context=ctx) as response:
                return bool(response.status == 200)

        return check

    def _wait(self, name: str, check: Callable[[], bool], deadline: float, what: str = "") -> None:
        proc = self._procs[name]
        last = ""
        while True:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode} while starting; "
                    f"the end of {self.log_path(name)}:\n{self.log_tail(name)}"
                )
            try:
                if check():
                    return
            except (OSError, ValueError) as exc:  # refused, TLS not up yet, 500 from /readyz
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                self._terminate(name)
                raise ControlPlaneError(
                    f"{name} did not become healthy{' (' + what + ')' if what else ''} "
                    f"in time (last: {last or 'not ready'}); the end of "
                    f"{self.log_path(name)}:\n{self.log_tail(name)}"
                )
            time.sleep(0.2)

    def _terminate(self, name: str, grace_s: float = 5.0) -> None:
        terminate(self._procs.pop(name, None), grace_s)


def _deadline_in(seconds: float) -> float:
    return time.monotonic() + seconds


# -- credentials -------------------------------------------------------------------------


def _write_serving_cert(cert_file: Path, key_file: Path) -> None:
    """A self-signed certificate for 127.0.0.1 and localhost, its own CA (as the notes'
    `openssl req -x509` makes): the API server serves it, its clients trust it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = dt.datetime.now(dt.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=True,
                key_cert_sign=True,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    _write_private(key_file, _private_pem(key))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key_pair(private_file: Path, public_file: Path) -> None:
    """The service accounts' signing key pair (the API server requires one in 1.20)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(private_file, _private_pem(key))
    public_file.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _private_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# -- objects -----------------------------------------------------------------------------


async def make_node(
    client: KubeClient,
    name: str,
    gpus: int,
    labels: Mapping[str, str] | None = None,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    pods: str = "110",
    ready: bool = True,
    taints: Sequence[Obj] = (),
) -> Obj:
    """POST a Node (there is no kubelet: the Node keeps the status sent with it) with
    `gpus` of `GPU_RESOURCE` in its capacity and allocatable, and a Ready condition
    (True unless `ready` is False). Returns the Node."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods, GPU_RESOURCE: str(gpus)}
    stamp = "2026-01-01T00:00:00Z"
    spec: Obj = {"taints": list(taints)} if taints else {}
    return await client.create(
        node_path(),
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": spec,
            "status": {
                "capacity": resources,
                "allocatable": dict(resources),
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "reason": "Fake" if ready else "FakeNotReady",
                        "message": "made by gpuloom.testing.kubecluster",
                        "lastHeartbeatTime": stamp,
                        "lastTransitionTime": stamp,
                    }
                ],
            },
        },
    )


def priority_class_name(priority: int) -> str:
    """The PriorityClass `make_pod` makes for an integer priority."""
    return f"gpuloom-priority-{priority}" if priority >= 0 else f"gpuloom-priority-m{-priority}"


async def ensure_priority_class(client: KubeClient, priority: int) -> str:
    """The PriorityClass of value `priority` (made when missing); returns its name."""
    name = priority_class_name(priority)
    with contextlib.suppress(Conflict):  # AlreadyExists
        await client.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": priority,
                "globalDefault": False,
            },
        )
    return name


async def make_pod(
    client: KubeClient,
    namespace: str,
    name: str,
    gpus: int,
    annotations: Mapping[str, str] | None = None,
    priority: int | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    scheduler_name: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    grace_period_s: int | None = 0,
) -> Obj:
    """POST a Pod of one container (image `none:0`, never run) whose `resources.limits`
    ask for `gpus` of `GPU_RESOURCE` (none when 0: kube-scheduler then never asks the
    extender). `priority`: through a PriorityClass `gpuloom-priority-N`, made when
    missing (the Priority admission plugin refuses a bare `spec.priority`).
    `scheduler_name`: another scheduler's name keeps kube-scheduler off the pod.
    `grace_period_s`: its terminationGracePeriodSeconds; 0 (no kubelet will ever end it)
    makes a delete or an eviction remove it at once, None leaves the API's 30 s, through
    which a bound pod stays, terminating, until deleted with a grace of 0. Returns the Pod."""
    container: Obj = {"name": "main", "image": "none:0"}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    spec: Obj = {"containers": [container]}
    if grace_period_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_period_s
    if priority is not None:
        spec["priorityClassName"] = await ensure_priority_class(client, priority)
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    metadata: Obj = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    return await client.create(
        pod_path(namespace), {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    )


def gpuloom_for(
    plane: KubeControlPlane,
    nats_url: str,
    base: Path,
    extender_port: int,
    env: Mapping[str, str] | None = None,
    service_env: Mapping[str, Mapping[str, str]] | None = None,
) -> Cluster:
    """A gpuloom stack (not started yet) that schedules `plane`'s GPUs: no agents (the
    cluster's Nodes are the nodes), the extender on `extender_port` (the one `plane`'s
    kube-scheduler calls) and the watcher, both given `plane`'s kubeconfig."""
    from gpuloom.devstack import KUBE_SERVICES

    return Cluster(
        nats_url,
        f"sqlite+aiosqlite:///{base}/gpuloom.db",
        base / "data",
        agents={},
        extra_services=KUBE_SERVICES,
        env={
            "GPULOOM_KUBECONFIG": str(plane.kubeconfig_path),
            "GPULOOM_EXTENDER_PORT": str(extender_port),
            **(env or {}),
        },
        service_env=dict(service_env or {}),
    )
