"""What the browser tests hold of one tab on the dashboard (tests/browser/conftest.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Page, expect


@dataclass
class Dashboard:
    """One browser tab on the gateway's /ui, and what its console said."""

    page: Page
    base_url: str
    artifacts: Path
    errors: list[str] = field(default_factory=list)

    def open(self, route: str = "") -> None:
        self.page.goto(f"{self.base_url}/ui/{route}")

    def login(self, token: str) -> None:
        self.open()
        self.page.fill("#token", token)
        self.page.click("#login-submit")
        expect(self.page.locator("#topbar")).to_be_visible()

    def shot(self, name: str) -> None:
        self.page.mouse.move(
            0, self.page.viewport_size["height"] - 1 if self.page.viewport_size else 0
        )
        self.page.screenshot(path=self.artifacts / f"{name}.png", full_page=True)


class CuttableProxy:
    """A TCP proxy in front of the gateway that a test can cut: `cut` drops every
    connection through it and refuses new ones until `resume`. `sent` holds what the
    browser sent (to see the headers of its requests)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.sent: list[bytes] = []
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            if not self._open.is_set():
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        try:
            while data := source.recv(65536):
                if record:
                    self.sent.append(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            cut, self._sockets = self._sockets, []
        for end in cut:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def resume(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.cut()
        with contextlib.suppress(OSError):  # wakes the accepting thread, which then ends
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
