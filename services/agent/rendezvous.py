"""A gang's rendezvous: where its replicas find each other, and the variables every
distributed-training launcher reads.

Replica 0 of a gang is its master. Its agent reserves a port on its node (from
`GPULOOM_AGENT_RENDEZVOUS_PORTS`, one that no other gang's master here holds and that
can be bound now), writes it in the run folder (`master`: an agent restarted later
still knows it), and reports it with the node's address in replica 0's JobStarted.
The other replicas start once that is in the log, so each starts knowing where the
master listens (reconcile waits for it).

The port is free when the agent checks it and the job binds it a moment later;
another program of the node could take it in between (as with any launcher that
picks a free port), and the job would then fail to bind it and end the gang.

Each replica is one "node" as the launchers count them, seeing only its own GPUs
(`CUDA_VISIBLE_DEVICES`, numbered from 0 inside the job):

| variable | value | read by |
| --- | --- | --- |
| `MASTER_ADDR`, `MASTER_PORT` | replica 0's address and reserved port | torch.distributed (`env://`), DeepSpeed, Lightning, Accelerate |
| `WORLD_SIZE`, `RANK` | replicas, this replica's number | the same, one process per replica |
| `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | 0, 1 (the replica's GPUs are its own) | the same |
| `NODE_RANK`, `GROUP_RANK` | this replica's number | Lightning, torchrun's workers |
| `PET_NNODES`, `PET_NODE_RANK`, `PET_MASTER_ADDR`, `PET_MASTER_PORT`, `PET_NPROC_PER_NODE` | replicas, number, master, GPUs per replica (1 without GPUs) | `torchrun` (its options' environment form), which then sets `RANK` etc. of its own workers |
| `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` | `addr:port`, replicas, number | the job, for `jax.distributed.initialize(...)` (JAX finds its arguments by itself only on TPU, Slurm and Open MPI) |

Horovod's own rendezvous (`horovodrun`'s Gloo server, or MPI) is not provided: a
Horovod job runs its replicas with `horovodrun` from replica 0 or uses its PyTorch
backend through the variables above.
"""

from __future__ import annotations

import logging
import socket
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from gpuloom.events import REPLICA_NUMBERS_PER_REPLICA, JobSpec

log = logging.getLogger(__name__)

#: torchrun's default master port starts the range launchers expect.
DEFAULT_PORTS = range(29500, 30000)

Master = tuple[str, int]


def parse_ports(text: str) -> range:
    """`29500-29999` -> that range (both ends included). Raises ValueError."""
    low, _, high = text.partition("-")
    first, last = int(low), int(high or low)
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"rendezvous ports {text!r}: want FIRST-LAST within 1-65535")
    return range(first, last + 1)


def node_address() -> str:
    """This machine's address as other nodes reach it: the first IPv4 address its host
    name resolves to that is not loopback, else 127.0.0.1 (a one-machine cluster)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    for info in infos:
        address = str(info[4][0])
        if not address.startswith("127."):
            return address
    return "127.0.0.1"


def can_bind(port: int) -> bool:
    """Whether a TCP listener could bind `port` on every interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class Rendezvous:
    """The agent's address and the ports its gangs' masters may take."""

    address: str
    ports: range = DEFAULT_PORTS

    def reserve(self, job_id: str, held: Collection[int]) -> Master:
        """A port for `job_id`'s master: not in `held` (other masters here) and bindable
        now. The search starts at a place of the range given by the job's id, so that
        agents sharing one host seldom try the same port. Raises OSError when none is."""
        start = zlib.crc32(job_id.encode()) % len(self.ports)
        for step in range(len(self.ports)):
            port = self.ports[(start + step) % len(self.ports)]
            if port not in held and can_bind(port):
                return self.address, port
        raise OSError(f"no free rendezvous port in {self.ports.start}-{self.ports.stop - 1}")


def launcher_environment(replica: int, replicas: int, gpus: int, master: Master) -> dict[str, str]:
    """The variables of replica `replica` of a gang of `replicas` (see the module doc)."""
    address, port = master
    rank, size = str(replica), str(replicas)
    return {
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": size,
        "RANK": rank,
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": rank,
        "GROUP_RANK": rank,
        "PET_NNODES": size,
        "PET_NODE_RANK": rank,
        "PET_MASTER_ADDR": address,
        "PET_MASTER_PORT": str(port),
        "PET_NPROC_PER_NODE": str(max(1, gpus)),
        "JAX_COORDINATOR_ADDRESS": f"{address}:{port}",
        "JAX_NUM_PROCESSES": size,
        "JAX_PROCESS_ID": rank,
    }


def elastic_environment(job_id: str, attempt: int, spec: JobSpec, master: Master) -> dict[str, str]:
    """The variables of a replica of an elastic gang (`JobSpec.min_replicas`): torchrun's
    elastic rendezvous (`--nnodes=MIN:MAX`, the c10d backend, whose store replica 0's
    torchrun serves at the reserved port), and the endpoint for any other rendezvous.

    No `WORLD_SIZE` or `RANK`: the gang's size changes while it runs, and each
    rendezvous round gives every worker its own (torchrun sets them for its workers).
    `PET_MAX_RESTARTS` allows a restart of the workers for every change the attempt
    may see (each replica that leaves costs the others one; one that joins costs none).
    """
    address, port = master
    endpoint = f"{address}:{port}"
    assert spec.min_replicas is not None
    return {
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
        "GPULOOM_RENDEZVOUS": endpoint,
        "GPULOOM_MIN_REPLICAS": str(spec.min_replicas),
        "GPULOOM_MAX_REPLICAS": str(spec.replicas),
        "PET_NNODES": f"{spec.min_replicas}:{spec.replicas}",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": endpoint,
        "PET_RDZV_ID": f"{job_id}-{attempt}",
        "PET_NPROC_PER_NODE": str(max(1, spec.gpus)),
        "PET_MAX_RESTARTS": str(REPLICA_NUMBERS_PER_REPLICA * spec.replicas),
    }


def format_master(master: Master) -> str:
    return f"{master[0]} {master[1]}\n"


def read_master(path: Path) -> Master | None:
    """The rendezvous recorded in a run folder's `master` file, or None (no such file:
    the run is not a gang's replica 0)."""
    try:
        return parse_master(path.read_text())
    except OSError:
        return None


def parse_master(text: str) -> Master | None:
    """What `format_master` wrote, or None."""
    address, _, port = text.strip().partition(" ")
    if not address or not port.isdigit():
        return None
    return address, int(port)
