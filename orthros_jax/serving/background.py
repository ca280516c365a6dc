"""An app served by uvicorn on a thread of this process (tests, the load benchmark): binds
127.0.0.1 on a free port, returns once it accepts connections, stops (draining the app) on
exit."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class BackgroundServer:
    """with BackgroundServer(app) as server: ... server.url (http://127.0.0.1:PORT)."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 120
    ) -> None:
        import uvicorn

        self.host, self.start_timeout_s = host, start_timeout_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=60)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(120)
        self.sock.close()
