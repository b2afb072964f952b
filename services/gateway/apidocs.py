"""/docs (Swagger UI) and /redoc, served with their assets from the gateway itself.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a cluster without
internet they are blank. The assets come from the `fastapi-offline` wheel, which
ships Swagger UI 5 (FastAPI's OpenAPI 3.1 needs it) and ReDoc 2 as plain files and is
kept current; the pages are built with FastAPI's documented helpers, pointing at
`STATIC` (https://fastapi.tiangolo.com/how-to/custom-docs-ui-assets/).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

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
