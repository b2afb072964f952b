"""A copy of a node's view (`copy_view`: what the reservation search and preemption try
things on) is the view: every field but the memos, so no rule sees a different node."""

from __future__ import annotations

import dataclasses

from gpuloom.placement.holdings import copy_view
from gpuloom.placement.resources import GpuView, NodeView

MEMOS = {"cached_state", "cached_gpus", "cached_signature"}


def test_a_copied_view_keeps_every_field() -> None:
    view = NodeView(
        name="n1",
        rank=3,
        gpus=[GpuView(0, "u0", "A100", "vgpu", 81920, 500, 40960)],
        cpu_free_milli=1000,
        memory_free_mib=2048,
        labels={"zone": "a"},
        lends_remote_vgpu=True,
        runtimes=("podman",),
        topology={"nvlink": "nvl-1", "rack": "r1"},
    )
    defaults = NodeView(name="x", rank=0)
    for field in dataclasses.fields(NodeView):
        if field.name not in MEMOS:
            assert getattr(view, field.name) != getattr(defaults, field.name), (
                f"set {field.name} in this test"
            )
    copied = copy_view(view)
    for field in dataclasses.fields(NodeView):
        if field.name not in MEMOS:
            assert getattr(copied, field.name) == getattr(view, field.name), field.name
    assert copied.gpus[0] is not view.gpus[0]
