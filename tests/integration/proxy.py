"""A TCP proxy on loopback for link-cut tests: forwards to a target and can cut every
connection it carries (both ends see the TCP connection drop) while still accepting new
ones."""

from __future__ import annotations

import socket
import threading

from .daemon import free_port


class Proxy:
    def __init__(self, target_port: int, *, keep: int = 0):
        self.target = ("127.0.0.1", target_port)
        self.keep = keep  # bytes of what passes (both ways) to keep in `seen`, to look into
        self.seen = bytearray()
        self.port = free_port()
        self._srv = socket.create_server(("127.0.0.1", self.port))
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self._srv.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(self.target)
            except OSError:
                a.close()
                continue
            with self._lock:
                self._conns += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if len(self.seen) < self.keep:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every connection now (new ones still go through)."""
        with self._lock:
            conns, self._conns = self._conns, []
        self.cuts += 1
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._srv.close()
        self.cut()
