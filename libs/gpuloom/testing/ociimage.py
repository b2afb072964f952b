"""An OCI image archive made by hand from Debian's static busybox, with no registry and
no image builder: `/bin/busybox` and a few applet links. The kubelet test's pod image
and its sandbox ("pause") image (`gpuloom.testing.kubelet`)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

IMAGE = "gpuloom.local/busybox:1"
BUSYBOX = Path("/bin/busybox")
#: The applets the image links to busybox.
APPLETS = ("sh", "env", "printenv", "sleep", "cat", "echo", "ls", "true")


def is_static(path: Path) -> bool:
    """An ELF executable naming no dynamic loader in its first page (where PT_INTERP's
    path lies in a dynamically linked one)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in data[:4096]


# -- the image ---------------------------------------------------------------------------


def _blob(layout: dict[str, bytes], data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    layout[f"blobs/sha256/{digest[7:]}"] = data
    return digest


def write_busybox_image(dest: Path, ref: str = IMAGE, busybox: Path = BUSYBOX) -> Path:
    """An OCI image layout archive (`ctr images import`) of one uncompressed layer:
    /bin/busybox, /bin/<applet> links, and the empty directories runc mounts over. Its
    default command sleeps forever (so it serves as the sandbox image too)."""
    layer_io = io.BytesIO()
    with tarfile.open(fileobj=layer_io, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "root"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755, 0
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tar.addfile(info)
    layer = layer_io.getvalue()
    blobs: dict[str, bytes] = {}
    layer_digest = _blob(blobs, layer)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin"],
                "Cmd": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"],
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "gpuloom.testing.kubelet: Debian's busybox-static"}],
        },
        sort_keys=True,
    ).encode()
    config_digest = _blob(blobs, config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer),
                }
            ],
        },
        sort_keys=True,
    ).encode()
    manifest_digest = _blob(blobs, manifest)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        **blobs,
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(body), 0o644, 0
            tar.addfile(info, io.BytesIO(body))
    return dest


# -- processes ---------------------------------------------------------------------------
