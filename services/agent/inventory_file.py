"""The inventory file: simulated nodes an agent serves, declared in YAML.

```yaml
nodes:
  - name: node-a
    gpus: {model: A100-80GB, count: 4, memory_mib: 81920}   # n identical GPUs
    cpu_milli: 64000          # optional
    memory_mib: 524288        # optional
    labels: {zone: a}         # optional
    topology: {nvlink: nvl-1, rack: r1, block: b1}   # optional: tightest level first
    lends_remote_vgpu: false  # optional: serve vGPU slices to replicas on other nodes
  - name: node-b
    gpus:                     # or an explicit list
      - {index: 0, model: H100-80GB, memory_mib: 81920, uuid: GPU-..., pool: vgpu}
        # uuid optional; pool: physical (default, whole GPUs) or vgpu (sliced)
```

`load_inventory` returns one `ServedNode` per entry, in file order, each with a
`NodeSpec` marked `simulated`. A GPU without a uuid gets `GPU-sim-<node>-<index>`,
so the same file always yields the same specs. Anything invalid raises
`InventoryError` with a message that names the file and the bad field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)

from gpuloom.events import GpuSpec, NodeSpec, TopologyPlace
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.text import TopologyName

NAME_RULE = "a node name is 1 to 63 letters, digits, '_' or '-', starting with a letter or digit"


class InventoryError(ValueError):
    """The inventory file cannot be read or is not a valid inventory."""


@dataclass(frozen=True, slots=True)
class ServedNode:
    """A node this agent heartbeats for and runs jobs on."""

    name: str
    spec: NodeSpec


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuGroup(_Model):
    """`count` identical GPUs, indexed 0..count-1."""

    model: str = Field(min_length=1)
    count: int = Field(ge=1, le=1024)
    memory_mib: int = Field(ge=0)
    pool: Literal["physical", "vgpu"] = "physical"


class GpuEntry(_Model):
    """One GPU, declared explicitly."""

    index: int = Field(ge=0)
    model: str = Field(min_length=1)
    memory_mib: int = Field(ge=0)
    uuid: str | None = Field(default=None, min_length=1)
    pool: Literal["physical", "vgpu"] = "physical"


def _gpus_form(value: Any) -> str | None:
    if isinstance(value, dict):
        return "group"
    if isinstance(value, list):
        return "list"
    return None


GpusField = Annotated[
    Annotated[GpuGroup, Tag("group")] | Annotated[list[GpuEntry], Tag("list")],
    Discriminator(
        _gpus_form,
        custom_error_type="gpus_form",
        custom_error_message="must be a mapping {model, count, memory_mib} or a list of GPUs",
    ),
]
#: Union tags that pydantic puts into error locations; not field names, so not shown.
_TAGS = frozenset({"group", "list"})


class NodeEntry(_Model):
    name: str
    gpus: GpusField = Field(default_factory=list)
    cpu_milli: int = Field(default=0, ge=0)
    memory_mib: int = Field(default=0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    #: Level -> domain, tightest level first (the file's order).
    topology: dict[TopologyName, TopologyName] = Field(default_factory=dict, max_length=8)
    lends_remote_vgpu: bool = False

    @field_validator("name")
    @classmethod
    def _name_is_a_subject_token(cls, value: str) -> str:
        if not SUBJECT_TOKEN.match(value):
            raise ValueError(NAME_RULE)
        return value

    def gpu_specs(self) -> list[GpuSpec]:
        if isinstance(self.gpus, GpuGroup):
            group = self.gpus
            return [
                GpuSpec(
                    index=i,
                    uuid=simulated_uuid(self.name, i),
                    model=group.model,
                    memory_mib=group.memory_mib,
                    pool=group.pool,
                )
                for i in range(group.count)
            ]
        return [
            GpuSpec(
                index=gpu.index,
                uuid=gpu.uuid or simulated_uuid(self.name, gpu.index),
                model=gpu.model,
                memory_mib=gpu.memory_mib,
                pool=gpu.pool,
            )
            for gpu in sorted(self.gpus, key=lambda g: g.index)
        ]


class InventoryDoc(_Model):
    nodes: list[NodeEntry] = Field(min_length=1)


def simulated_uuid(node: str, index: int) -> str:
    """The uuid of a declared GPU that has none: stable across restarts."""
    return f"GPU-sim-{node}-{index}"


def _where(loc: tuple[int | str, ...]) -> str:
    """`("nodes", 0, "gpus", "group", "count")` -> `nodes[0].gpus.count`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _TAGS:
            out += f".{part}" if out else part
    return out or "(top level)"


def _describe(exc: ValidationError) -> str:
    return "; ".join(f"{_where(err['loc'])}: {err['msg']}" for err in exc.errors())


def _check_unique(doc: InventoryDoc) -> None:
    names: set[str] = set()
    uuids: dict[str, str] = {}
    for n, node in enumerate(doc.nodes):
        if node.name in names:
            raise InventoryError(f"nodes[{n}].name: node {node.name!r} is declared twice")
        names.add(node.name)
        if isinstance(node.gpus, list):
            seen: set[int] = set()
            for g, gpu in enumerate(node.gpus):
                if gpu.index in seen:
                    raise InventoryError(
                        f"nodes[{n}].gpus[{g}].index: GPU index {gpu.index} is declared twice"
                    )
                seen.add(gpu.index)
        for gpu_spec in node.gpu_specs():
            other = uuids.get(gpu_spec.uuid)
            if other is not None:
                raise InventoryError(
                    f"nodes[{n}].gpus: uuid {gpu_spec.uuid} is also a GPU of node {other}"
                )
            uuids[gpu_spec.uuid] = node.name


def parse_inventory(text: str) -> list[ServedNode]:
    """Parse inventory YAML text; raise InventoryError naming the bad field."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise InventoryError("the file must be a mapping with a 'nodes' list")
    try:
        doc = InventoryDoc.model_validate(raw)
    except ValidationError as exc:
        raise InventoryError(_describe(exc)) from exc
    _check_unique(doc)
    return [
        ServedNode(
            node.name,
            NodeSpec(
                gpus=node.gpu_specs(),
                cpu_milli=node.cpu_milli,
                memory_mib=node.memory_mib,
                labels=dict(node.labels),
                topology=[TopologyPlace(level=k, domain=v) for k, v in node.topology.items()],
                simulated=True,
                lends_remote_vgpu=node.lends_remote_vgpu,
            ),
        )
        for node in doc.nodes
    ]


def load_inventory(path: Path) -> list[ServedNode]:
    """Read and parse the inventory file at `path`; errors name the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"inventory {path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return parse_inventory(text)
    except InventoryError as exc:
        raise InventoryError(f"inventory {path}: {exc}") from exc
