"""A job's image is an OCI reference that can never read as an option or a second word."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuloom.testing.builders import make_job_spec


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "ubuntu:24.04",
        "localhost/gpuloom-busybox:test",
        "registry.example.com:5000/team/pytorch:2.3-cuda12",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "docker.io/library/python:3.11-slim",
        "train@sha256:" + "a" * 64,
    ],
)
def test_references_podman_takes_are_taken(image: str) -> None:
    assert make_job_spec(1, image=image).image == image


@pytest.mark.parametrize(
    "image",
    ["", "--privileged", "-v/:/host", "a b", "a;rm -rf /", "ubuntu:", "Team/Train", "x" * 513],
)
def test_anything_else_is_refused_with_a_reason(image: str) -> None:
    with pytest.raises(ValidationError) as caught:
        make_job_spec(1, image=image)
    assert caught.value.errors()[0]["loc"] == ("image",)
