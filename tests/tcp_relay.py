"""A TCP relay on a loopback port to a server that is already up: connections are refused until
``open()``, then every byte is relayed both ways. A service coming back at the exact moment a test
chooses, however long the real server behind it took to start."""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    def __init__(self, port: int, target_port: int) -> None:
        self.port, self.target_port = port, target_port
        self._listener: socket.socket | None = None

    def open(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=_relay, args=(client, server), daemon=True).start()


def _relay(client: socket.socket, server: socket.socket) -> None:
    """Both directions until each side has closed its end, then both sockets are closed."""
    back = threading.Thread(target=_pump, args=(server, client), daemon=True)
    back.start()
    _pump(client, server)
    back.join()
    client.close()
    server.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Bytes from ``src`` to ``dst`` until ``src`` closes; then half-close ``dst`` for writing."""
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
