"""The OpenAPI document, and /docs (Swagger UI) and /redoc served with their assets
from the gateway itself.

`add_openapi` completes FastAPI's document: every error response of every
operation (`problems.add_problems`), and dictionary keys described as pydantic
checks them (see `keys_as_property_names`).

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a cluster without
internet they are blank. The assets come from the `fastapi-offline` wheel, which
ships Swagger UI 5 (FastAPI's OpenAPI 3.1 needs it) and ReDoc 2 as plain files and is
kept current; the pages are built with FastAPI's documented helpers, pointing at
`STATIC` (https://fastapi.tiangolo.com/how-to/custom-docs-ui-assets/).
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.routing import iter_route_contexts
from fastapi.staticfiles import StaticFiles

from services.gateway.problems import add_problems

#: Where the assets are served.
STATIC = "/static/docs"
#: swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png.
ASSETS = files("fastapi_offline") / "static"


def add_api_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc on `app`, made with `docs_url=None, redoc_url=None`."""
    app.mount(STATIC, StaticFiles(directory=str(ASSETS)), name="docs-assets")
    oauth2_redirect = app.swagger_ui_oauth2_redirect_url

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth2_redirect}" if oauth2_redirect else None,
            swagger_js_url=f"{root}{STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    if oauth2_redirect:

        @app.get(oauth2_redirect, include_in_schema=False)
        async def swagger_ui_redirect() -> HTMLResponse:
            return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{STATIC}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{STATIC}/favicon.png",
            with_google_fonts=False,
        )


def add_openapi(app: FastAPI) -> None:
    """`app.openapi()`: FastAPI's document, completed once, when first asked for."""
    made: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        if not made:
            doc = add_problems(FastAPI.openapi(app), list(iter_route_contexts(app.routes)))
            max_time_limit_s = app.state.gateway.settings.max_time_limit_s
            made.append(with_max_time_limit(keys_as_property_names(doc), max_time_limit_s))
        return made[0]

    app.openapi = openapi  # type: ignore[method-assign]


def keys_as_property_names(node: Any) -> Any:
    """`node` with each `patternProperties` of one pattern, and no other properties,
    made `propertyNames.pattern` and `additionalProperties`.

    Pydantic writes `dict[Key, V]` with a `pattern` on `Key` as `patternProperties`,
    which lets any key not matching the pattern through with any value; pydantic
    itself refuses such a key. `propertyNames` says what it checks.
    """
    if isinstance(node, list):
        return [keys_as_property_names(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: keys_as_property_names(value) for key, value in node.items()}
    patterns = node.get("patternProperties")
    if (
        isinstance(patterns, dict)
        and len(patterns) == 1
        and "additionalProperties" not in node
        and "properties" not in node
    ):
        ((pattern, values),) = patterns.items()
        del node["patternProperties"]
        node["propertyNames"] = {**node.get("propertyNames", {}), "pattern": pattern}
        node["additionalProperties"] = values
    return node


def with_max_time_limit(doc: dict[str, Any], max_time_limit_s: int) -> dict[str, Any]:
    """`doc` with the cluster's MaxTime (`GPULOOM_MAX_TIME_LIMIT_S`, 0: none) as the
    maximum of a submitted job's `time_limit_s`: a setting, so not in the type, but
    the gateway answers 422 over it."""
    request = doc.get("components", {}).get("schemas", {}).get("JobRequest", {})
    limit = request.get("properties", {}).get("time_limit_s", {})
    for choice in limit.get("anyOf", [limit]):
        if choice.get("type") == "integer" and max_time_limit_s:
            choice["maximum"] = min(choice.get("maximum", max_time_limit_s), max_time_limit_s)
    return doc
