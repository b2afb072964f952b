"""Where the Kubernetes API is and how to prove who we are: `KubeConfig`, read from a
kubeconfig file (YAML or JSON) or from the pod's service account."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuloom.kubeapi.errors import KubeConfigError

#: Where Kubernetes mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubeConfig:
    """One API server and one identity: the current context of a kubeconfig.

    The server's certificate is checked against `ca_file` or `ca_data` (PEM), else the
    system's trust store; `insecure_skip_tls_verify` turns the check off. The client is a
    bearer `token` (or `token_file`, read again as it rotates) and/or a client certificate
    (`client_cert_*` with `client_key_*`, a file or PEM data)."""

    server: str
    ca_file: Path | None = None
    ca_data: bytes | None = None
    insecure_skip_tls_verify: bool = False
    token: str | None = None
    token_file: Path | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    namespace: str = "default"

    @classmethod
    def load(cls, path: str | os.PathLike[str], context: str | None = None) -> KubeConfig:
        """The kubeconfig at `path`, for `context` (default: its `current-context`).
        Relative file paths in it are taken from the kubeconfig's own directory."""
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise KubeConfigError(f"{path}: cannot read the kubeconfig: {exc}") from exc
        if not isinstance(doc, dict):
            raise KubeConfigError(f"{path}: not a kubeconfig (no mapping at the top)")
        return cls.from_dict(doc, context=context, base_dir=path.resolve().parent)

    @classmethod
    def from_dict(
        cls, doc: Mapping[str, Any], context: str | None = None, base_dir: Path | None = None
    ) -> KubeConfig:
        """A kubeconfig already parsed (see `load`)."""
        name = context or doc.get("current-context")
        if not name:
            raise KubeConfigError("the kubeconfig names no current-context")
        ctx = _named(doc, "contexts", "context", str(name))
        cluster = _named(doc, "clusters", "cluster", str(ctx.get("cluster", "")))
        user_name = ctx.get("user")
        user = _named(doc, "users", "user", str(user_name)) if user_name else {}
        server = cluster.get("server")
        if not isinstance(server, str) or not server:
            raise KubeConfigError(f"cluster {ctx.get('cluster')!r} has no server")

        def file(value: Any) -> Path | None:
            if not value:
                return None
            p = Path(str(value)).expanduser()
            return p if p.is_absolute() or base_dir is None else base_dir / p

        config = cls(
            server=server.rstrip("/"),
            ca_file=file(cluster.get("certificate-authority")),
            ca_data=_b64(cluster.get("certificate-authority-data"), "certificate-authority-data"),
            insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
            token=str(user["token"]) if user.get("token") else None,
            token_file=file(user.get("tokenFile")),
            client_cert_file=file(user.get("client-certificate")),
            client_key_file=file(user.get("client-key")),
            client_cert_data=_b64(user.get("client-certificate-data"), "client-certificate-data"),
            client_key_data=_b64(user.get("client-key-data"), "client-key-data"),
            namespace=str(ctx.get("namespace") or "default"),
        )
        has_cert = config.client_cert_file or config.client_cert_data
        has_key = config.client_key_file or config.client_key_data
        if bool(has_cert) != bool(has_key):
            raise KubeConfigError(f"user {user_name!r}: a client certificate needs its key")
        if not (config.token or config.token_file or has_cert) and (
            user.get("exec") or user.get("auth-provider")
        ):
            raise KubeConfigError(
                f"user {user_name!r}: exec and auth-provider credentials are not supported"
            )
        return config

    @classmethod
    def in_cluster(
        cls,
        root: Path = SERVICE_ACCOUNT_DIR,
        environ: Mapping[str, str] | None = None,
    ) -> KubeConfig:
        """The pod's own service account: its token and CA under `root`, the API server
        at KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeConfigError(
                "not in a cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT unset"
            )
        token_file = root / "token"
        if not token_file.is_file():
            raise KubeConfigError(f"not in a cluster: no service-account token at {token_file}")
        if ":" in host:  # IPv6
            host = f"[{host}]"
        ns_file = root / "namespace"
        namespace = ns_file.read_text().strip() if ns_file.is_file() else "default"
        ca = root / "ca.crt"
        return cls(
            server=f"https://{host}:{port}",
            ca_file=ca if ca.is_file() else None,
            token_file=token_file,
            namespace=namespace or "default",
        )

    def bearer_token(self) -> str | None:
        """The token to send: `token`, else the content of `token_file` now."""
        if self.token:
            return self.token
        if self.token_file:
            try:
                return self.token_file.read_text().strip() or None
            except OSError as exc:
                raise KubeConfigError(f"cannot read the token file {self.token_file}") from exc
        return None

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings: the CA to trust and the client certificate to show."""
        if self.insecure_skip_tls_verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_file or self.ca_data:
            ctx = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file else None,
                cadata=self.ca_data.decode("ascii") if self.ca_data else None,
            )
        else:
            ctx = ssl.create_default_context()
        if self.client_cert_file or self.client_cert_data:
            with (
                _pem_file(self.client_cert_file, self.client_cert_data) as cert,
                _pem_file(self.client_key_file, self.client_key_data) as key,
            ):
                ctx.load_cert_chain(str(cert), str(key))
        return ctx


def _named(doc: Mapping[str, Any], section: str, key: str, name: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, dict):
                raise KubeConfigError(f"{section} entry {name!r} is not a mapping")
            return value
    raise KubeConfigError(f"the kubeconfig has no {key} named {name!r}")


def _b64(value: Any, field: str) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KubeConfigError(f"{field} is not base64") from exc


@contextlib.contextmanager
def _pem_file(path: Path | None, data: bytes | None) -> Iterator[Path]:
    """`path`, or `data` in a private temporary file for as long as it is needed (the ssl
    module loads certificates and keys from files only)."""
    if path is not None:
        yield path
        return
    assert data is not None
    fd, name = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield Path(name)
    finally:
        os.unlink(name)
