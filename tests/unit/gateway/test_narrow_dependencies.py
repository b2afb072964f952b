"""Each route of the gateway takes what it uses (`services.gateway.deps`: the read
facade, the publisher, the event log, the settings, the streams' parts), never the
whole `parts.Gateway` the app holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts

from gpuloom.config import Settings
from services.gateway.app import create_app
from services.gateway.parts import Gateway


def calls(dependant: Dependant) -> Iterator[Any]:
    """The route's own function and every dependency under it."""
    if dependant.call is not None:
        yield dependant.call
    for sub in dependant.dependencies:
        yield from calls(sub)


def takes_the_gateway(call: Any) -> bool:
    try:
        hints = get_type_hints(call)
    except (NameError, TypeError):
        return False
    return any(hint is Gateway for name, hint in hints.items() if name != "return")


def test_no_route_nor_its_dependencies_takes_the_whole_gateway(tmp_path: Path) -> None:
    app = create_app(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path}/gw.db", data_dir=tmp_path)
    )
    routes = [
        (context.path, context.route)
        for context in iter_route_contexts(app.routes)
        if isinstance(context.route, APIRoute)
    ]
    assert len(routes) > 30
    taking = sorted(
        f"{path} {getattr(call, '__qualname__', call)}"
        for path, route in routes
        for call in calls(route.dependant)
        if takes_the_gateway(call)
    )
    assert not taking, taking


def test_the_check_sees_a_parameter_of_the_gateway() -> None:
    async def wide(gateway: Gateway) -> None:
        return None

    async def narrow(settings: Settings) -> None:
        return None

    assert takes_the_gateway(wide) and not takes_the_gateway(narrow)
