"""Running an app in uvicorn: in the foreground as `minivtc serve` and `minivtc route` do
(`Foreground`: the connection limits, a shutdown time limit, startup's objects set aside from the
garbage collector), or on a thread for tests, the demo and notebooks (`BackgroundServer`).

Owns no routes and imports no engine (and so no torch): `server.py` makes the server's app,
`gateway/app.py` the gateway's; both are run from here.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import socket
import sys
import threading
import time

from fastapi import FastAPI

from minivtc.serving.connections import allow_open_files

__all__ = ["BackgroundServer", "Foreground", "name_os_thread"]

PR_SET_NAME = 15  # prctl's option: the calling thread's name, as `top -H` and /proc show it


class Foreground:
    """An app (`serve`'s or `route`'s) in uvicorn in the foreground, with the connection limits
    of `app.state.minivtc.limits`. On the first SIGINT/SIGTERM it stops accepting and starts
    the clock: `give_up()` runs (on a timer thread) once `shutdown_timeout` seconds have
    passed, to end what is still in flight with an error; uvicorn waits 5 s more for those
    answers to go out before it cancels anything. What startup made is set aside from the
    collector before serving (`set_aside_startup`)."""

    def __init__(
        self, app: FastAPI, host: str, port: int, shutdown_timeout: float, give_up
    ) -> None:
        import uvicorn

        self.shutdown_timeout, self.give_up = shutdown_timeout, give_up
        limits = app.state.minivtc.limits
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            # (annotated int, used as asyncio.wait_for's float: seconds, fractions kept)
            timeout_graceful_shutdown=shutdown_timeout + 5,  # type: ignore[arg-type]
            **limits.uvicorn_options(),
        )
        allow_open_files(limits)
        self.server = uvicorn.Server(config)
        self.server.handle_exit = self.handle_exit  # type: ignore[method-assign]

    def run(self) -> None:
        set_aside_startup()
        self.server.run()

    def handle_exit(self, sig: int, frame) -> None:
        if not self.server.should_exit:  # the first signal: start the clock
            print(
                f"shutting down: in-flight requests have {self.shutdown_timeout:g} s",
                file=sys.stderr,
            )
            timer = threading.Timer(self.shutdown_timeout, self.give_up)
            timer.daemon = True  # the process may end before it fires
            timer.start()
        uvicorn_handle_exit = type(self.server).handle_exit
        uvicorn_handle_exit(self.server, sig, frame)


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` where the operating system shows it (Linux: `top -H`,
    /proc/PID/task/TID/comm; at most 15 bytes), not only to Python, so that what a server's
    HTTP thread costs can be read from outside (`minivtc bench serve`). Elsewhere: nothing."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def set_aside_startup() -> None:
    """Freeze what the process has made so far (the modules, torch's among them, and the app),
    so that the collector's full passes walk only what serving makes: a full pass over all a
    started gateway holds runs on the event loop, and `/health` answers that late (what it
    cost: minivtc/bench/README.md). They live as long as the process, so setting them aside
    frees nothing less (`gc.freeze`)."""
    gc.collect()  # (garbage made so far is freed, not kept for ever)
    gc.freeze()


class BackgroundServer:
    """uvicorn on a thread, on a free port: `with BackgroundServer(app) as url: ...`.

    For tests, the demo and notebooks; `minivtc serve` runs uvicorn in the foreground.
    `log_path`: uvicorn's warnings and errors go to this file instead of the terminal.
    """

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_path: str | None = None
    ) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        host, port = self.socket.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=log_to_file(log_path) if log_path else uvicorn.config.LOGGING_CONFIG,
            timeout_graceful_shutdown=1,
            **app.state.minivtc.limits.uvicorn_options(),
        )
        allow_open_files(app.state.minivtc.limits)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.socket.close()


def log_to_file(path: str) -> dict:
    """A `logging.config` dictionary: uvicorn's loggers append to `path`, not the terminal."""
    handler = {"class": "logging.FileHandler", "filename": path, "formatter": "plain"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"file": handler},
        "loggers": {
            name: {"handlers": ["file"], "level": "INFO", "propagate": False}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }
