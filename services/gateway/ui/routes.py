"""/ui: the live dashboard (docs/dashboard.md), static files served from this package.

The pages hold no data and need no token: they ask the user for one, keep it in the
tab's sessionStorage and send it as `Authorization: Bearer` on every call to the /v1
API, which checks it as it checks any client's. So /ui stays outside `authenticate`,
like /healthz.

Only the files of `STATIC` are served (Starlette's StaticFiles refuses paths that
leave its directory). Every answer under /ui carries a strict Content-Security-Policy
(scripts, styles and connections to this origin only, no inline code, no framing),
`nosniff`, no referrer, and `X-Frame-Options: DENY`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response
from starlette.types import Scope

#: index.html, the JS modules, style.css and vendor/ (uPlot), shipped as package data.
STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # small files that change with each release: revalidate (ETag) rather than guess
    "Cache-Control": "no-cache",
}


class DashboardFiles(StaticFiles):
    """StaticFiles whose every answer, a 404 included, carries `SECURITY_HEADERS`."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        try:
            response = await super().get_response(path, scope)
        except HTTPException as exc:
            response = PlainTextResponse(str(exc.detail), status_code=exc.status_code)
        response.headers.update(SECURITY_HEADERS)
        return response


def add_dashboard(app: FastAPI) -> None:
    """Serve the dashboard at /ui/ (and send /ui there), outside `authenticate`."""

    @app.get(PREFIX, include_in_schema=False)
    async def dashboard() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/", status_code=307, headers=SECURITY_HEADERS)

    app.mount(PREFIX, DashboardFiles(directory=STATIC, html=True), name="ui")
