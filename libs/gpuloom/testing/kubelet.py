"""A real kubelet v1.20.2 with Debian's containerd, for a test that runs a real pod
(tests/integration/test_kubelet_pod.py; `tools/kubernetes/kubelet.sh` builds the kubelet
and installs containerd, runc and busybox-static).

- `write_busybox_image`: an OCI image archive made by hand from Debian's static busybox
  (no registry, no image builder): `/bin/busybox` and a few applet links. It is both the
  pod's image and the sandbox ("pause") image: its default command sleeps forever.
- `Containerd`: containerd in a directory of its own (root, state, socket, an empty CNI
  directory but one network config so that the runtime says its network is ready; pods
  use `hostNetwork: true`), the CRI plugin with cgroupfs and the sandbox image above.
- `Kubelet`: the kubelet against a control plane's kubeconfig, its root dir its own.

Both run as child processes in new sessions and are stopped by pid. `Kubelet.stop`
then removes what a kubelet leaves outside its directory (the cgroups it made, the
device-plugin checkpoint, /var/log/pods entries) and puts back the sysctls it sets;
`Containerd.stop` removes the containers left (through `ctr`), kills their shims and
unmounts whatever is mounted under its directory.

Needs root. `unavailable()` says why this machine cannot run them (None when it can).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from gpuloom.natsserver import free_ports
from gpuloom.testing.hostproc import (
    CGROUP_ROOT,
    ChildProcess,
    NodeError,
    cgroup_dirs,
    host_processes,
    remove_cgroup_tree,
    remove_empty_dirs,
    remove_path,
    unmount_under,
)
from gpuloom.testing.kubecluster import K8S_VERSION
from gpuloom.testing.ociimage import BUSYBOX, IMAGE, is_static

#: The image both the sandbox and the pod's container run (imported, never pulled).
#: The kubelet's device-plugin directory: fixed in v1.20 (pluginapi.DevicePluginPath),
#: whatever --root-dir says.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
#: Where the kubelet has containerd write containers' logs: fixed too.
POD_LOG_DIR = Path("/var/log/pods")
CONTAINER_LOG_LINKS = Path("/var/log/containers")
#: The sysctls a v1.20 kubelet sets at start (setupKernelTunables): put back at stop.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
#: containerd 1.6 puts its shims' sockets under /run/containerd/s, whatever its state dir.
SHIM_RUN_DIR = Path("/run/containerd")


def kubelet_binary(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("GPULOOM_K8S_BIN"):
        base = Path(env["GPULOOM_K8S_BIN"])
    elif env.get("GPULOOM_K8S_CACHE"):
        base = Path(env["GPULOOM_K8S_CACHE"]) / "bin"
    else:
        base = Path.home() / ".cache" / "gpuloom" / f"k8s-{K8S_VERSION}" / "bin"
    return base.expanduser() / "kubelet"


def unavailable() -> str | None:
    """Why a real kubelet and containerd cannot run a pod here; None when they can."""
    if os.geteuid() != 0:
        return "a real kubelet and containerd need root"
    if not os.access(kubelet_binary(), os.X_OK):
        return f"no kubelet {K8S_VERSION} at {kubelet_binary()}: run `bash tools/kubernetes/kubelet.sh`"
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"no {tool}: run `bash tools/kubernetes/kubelet.sh` (Debian's containerd, runc)"
    if not is_static(BUSYBOX):
        return f"no static busybox at {BUSYBOX}: `apt-get install busybox-static`"
    if not (CGROUP_ROOT / "memory").is_dir() or not (CGROUP_ROOT / "cpu").is_dir():
        return (
            "no cgroup v1 cpu and memory hierarchies (only cgroup v1 was tried with kubelet 1.20)"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "no overlay file system (containerd's overlayfs snapshotter)"
    sock = DEVICE_PLUGIN_DIR / "kubelet.sock"
    if _answers(sock):
        # a kubelet empties that directory when it starts: another one's plugins would go
        return f"another kubelet is running on this machine ({sock} answers)"
    return None


def _answers(path: Path) -> bool:
    """Whether something listens on the unix socket `path` (a stale file does not)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


class Containerd(ChildProcess):
    """containerd with its root, state, socket and configuration under `base_dir`."""

    name = "containerd"

    def __init__(self, base_dir: Path, sandbox_image: str = IMAGE) -> None:
        super().__init__(base_dir)
        self.sandbox_image = sandbox_image
        self.root = self.base_dir / "root"
        self.state = self.base_dir / "state"
        self.socket = self.base_dir / "containerd.sock"
        self.config_path = self.base_dir / "config.toml"
        self.cni_conf_dir = self.base_dir / "cni" / "net.d"
        self._made_run_dir = False

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def config(self, stream_port: int) -> str:
        d = self.base_dir
        return f"""version = 2
root = "{self.root}"
state = "{self.state}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"
[debug]
  address = "{d / "debug.sock"}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.sandbox_image}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "{stream_port}"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d / "cni" / "bin"}"
    conf_dir = "{self.cni_conf_dir}"
"""

    def start(self, timeout: float = 30.0) -> Containerd:
        if self.running():
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "cni" / "bin").mkdir(parents=True, exist_ok=True)
        self.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        # Never used (pods are hostNetwork: no CNI call), but without one network
        # containerd says NetworkReady=false and the kubelet keeps its Node NotReady.
        (self.cni_conf_dir / "10-gpuloom-unused.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "gpuloom-unused",
                    "plugins": [{"type": "loopback"}],
                }
            )
        )
        # the shims' sockets go to /run/containerd/s whatever the config says (1.6)
        self._made_run_dir = not SHIM_RUN_DIR.exists()
        (stream_port,) = free_ports(1)
        self.config_path.write_text(self.config(stream_port))
        self._spawn(["containerd", f"--config={self.config_path}", "--log-level=info"])
        self._wait(lambda: self.ctr("version", timeout=5).returncode == 0, timeout, "answering ctr")
        return self

    def ctr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def import_image(self, archive: Path) -> None:
        done = self.ctr("images", "import", "--no-unpack=false", str(archive), timeout=120)
        if done.returncode != 0:
            raise NodeError(f"ctr images import {archive}: {done.stderr or done.stdout}")

    def stop(self, grace_s: float = 10.0) -> None:
        """Remove the containers and tasks left, stop containerd, kill the shims it left
        (by pid, from their command lines naming this socket), unmount what is mounted
        under `base_dir`. Idempotent."""
        if self.running():
            self._remove_containers()
        self._terminate(grace_s)
        for pid in self.shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.shim_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        unmount_under(self.base_dir)
        if self._made_run_dir:
            remove_empty_dirs(SHIM_RUN_DIR)
            self._made_run_dir = False

    def _remove_containers(self) -> None:
        tasks = self.ctr("tasks", "list", "--quiet", timeout=15)
        for task in tasks.stdout.split():
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=15)
        for _ in range(50):
            if not self.ctr("tasks", "list", "--quiet", timeout=15).stdout.strip():
                break
            time.sleep(0.1)
        for task in tasks.stdout.split():
            self.ctr("tasks", "delete", "--force", task, timeout=15)
        containers = self.ctr("containers", "list", "--quiet", timeout=15)
        for container in containers.stdout.split():
            self.ctr("containers", "delete", container, timeout=15)

    def shim_pids(self) -> list[int]:
        """The containerd-shim processes started by this containerd (`-address SOCKET`)."""
        return [
            pid
            for pid, argv in host_processes()
            if argv and "containerd-shim" in argv[0] and str(self.socket) in argv
        ]


class Kubelet(ChildProcess):
    """A kubelet v1.20 registering Node `node_name`, with `--root-dir` under `base_dir`."""

    name = "kubelet"

    def __init__(
        self,
        base_dir: Path,
        *,
        kubeconfig: Path,
        node_name: str,
        runtime_endpoint: str,
        binary: Path | None = None,
        verbosity: int = 2,
    ) -> None:
        super().__init__(base_dir)
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.runtime_endpoint = runtime_endpoint
        self.binary = binary or kubelet_binary()
        self.verbosity = verbosity
        self.root_dir = self.base_dir / "root"
        self.port = self.healthz_port = 0
        self._sysctls: dict[str, str] = {}
        self._made: list[Path] = []
        self._before: dict[Path, set[str]] = {}
        self._cgroups: list[Path] = []

    @property
    def healthz_url(self) -> str:
        return f"http://127.0.0.1:{self.healthz_port}/healthz"

    def args(self) -> list[str]:
        d = self.base_dir
        return [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={d / 'pki'}",
            f"--volume-plugin-dir={d / 'volume-plugins'}",
            f"--hostname-override={self.node_name}",
            "--register-node=true",
            "--fail-swap-on=false",
            "--cgroup-driver=cgroupfs",
            "--container-runtime=remote",
            f"--container-runtime-endpoint={self.runtime_endpoint}",
            "--runtime-request-timeout=2m",
            "--address=127.0.0.1",
            f"--port={self.port}",
            "--read-only-port=0",
            "--healthz-bind-address=127.0.0.1",
            f"--healthz-port={self.healthz_port}",
            "--make-iptables-util-chains=false",
            "--anonymous-auth=false",
            "--authorization-mode=AlwaysAllow",
            # a loaded CI machine's disk or memory must not evict the test's pod
            "--eviction-hard=",
            "--image-gc-high-threshold=100",
            "--image-gc-low-threshold=99",
            "--node-status-update-frequency=2s",
            f"--v={self.verbosity}",
        ]

    def start(self, timeout: float = 60.0) -> Kubelet:
        """Start it; returns once its /healthz answers (the Node's readiness is the
        caller's to wait for, through the API)."""
        if self.running():
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for path in (DEVICE_PLUGIN_DIR.parent, DEVICE_PLUGIN_DIR, POD_LOG_DIR, CONTAINER_LOG_LINKS):
            if not path.exists():
                self._made.append(path)
            elif path.is_dir():  # what is there stays; what the kubelet adds goes
                self._before[path] = {entry.name for entry in path.iterdir()}
        self._cgroups = [p for p in cgroup_dirs("kubepods") if not p.exists()]
        self._sysctls = {
            name: (Path("/proc/sys") / name).read_text().strip() for name in KUBELET_SYSCTLS
        }
        self.port, self.healthz_port = free_ports(2)
        self._spawn(self.args())
        import urllib.request

        def healthy() -> bool:
            with urllib.request.urlopen(self.healthz_url, timeout=2) as response:
                return bool(response.status == 200)

        self._wait(healthy, timeout, "healthy")
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the kubelet, put back its sysctls, remove what it made outside `base_dir`
        (device-plugin sockets and checkpoint, /var/log/pods entries) and the cgroups it
        made, those that are empty by now: call `remove_cgroups` again once containerd
        removed the containers. Idempotent."""
        self._terminate(grace_s)
        for name, value in self._sysctls.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / name).write_text(value)
        self._sysctls = {}
        unmount_under(self.base_dir)
        for directory, before in self._before.items():
            if directory.is_dir():
                for entry in directory.iterdir():
                    if entry.name not in before:
                        remove_path(entry)
        self._before = {}
        for path in reversed(self._made):
            remove_path(path)
        self._made = []
        self.remove_cgroups()

    def remove_cgroups(self) -> None:
        """rmdir the `kubepods` cgroups the kubelet made (those still holding a process
        stay, for a later call)."""
        for path in self._cgroups:
            remove_cgroup_tree(path)
        self._cgroups = [p for p in self._cgroups if p.exists()]


# -- clean-up helpers ----------------------------------------------------------------------
