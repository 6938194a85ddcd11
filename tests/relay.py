"""A TCP relay on loopback in front of a server, whose connections can be cut and whose
port can refuse connections for a while: a flaky network, or a server that is down, while
the server behind it (and what it holds) lives on."""

from __future__ import annotations

import contextlib
import socket
import threading

PIECE = 65536  # bytes read at once from either side


class Cutter:
    """Relays ``127.0.0.1:<port>`` to ``127.0.0.1:<target>``; ``port`` stays the same
    across ``stop`` and ``start``."""

    def __init__(self, target: int, port: int = 0) -> None:
        self.target = target
        self.accepted = 0
        self.live: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.port = port
        self.start()

    @property
    def listening(self) -> bool:
        return self.listener is not None

    def start(self) -> None:
        """Listen (again) on the same port; a no-op while listening."""
        with self.lock:
            if self.listener is not None:
                return
            # create_server sets SO_REUSEADDR: the port is free again at once after stop
            self.listener = socket.create_server(("127.0.0.1", self.port))
            self.port = self.listener.getsockname()[1]
            threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def stop(self) -> None:
        """Cut every connection and refuse new ones, as a server that is down would."""
        with self.lock:
            listener, self.listener = self.listener, None
            if listener is not None:
                # shutdown, not close alone: on Linux a close leaves a thread blocked in
                # accept() listening (and accepting) until it returns
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)
                listener.close()
        self.cut()

    def cut(self) -> None:
        """Cut every live connection (new ones are accepted while listening)."""
        with self.lock:
            for s in self.live:
                with contextlib.suppress(OSError):  # already gone
                    s.shutdown(socket.SHUT_RDWR)
            self.live = []

    def refuse_for(self, seconds: float) -> None:
        """Cut every connection and refuse new ones for ``seconds`` (a server restarting),
        then listen again on the same port."""
        self.stop()
        threading.Timer(seconds, self.start).start()

    def close(self) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                inside, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                outside = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                inside.close()  # the server behind is down: so is this connection
                continue
            with self.lock:
                if self.listener is not listener:  # stopped meanwhile: refuse it too
                    inside.close()
                    outside.close()
                    return
                self.accepted += 1
                self.live += [inside, outside]
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(PIECE):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                s.close()
