"""ggml's RPC server where no other process can reach it: a child process in a network
namespace of its own (Linux user + network namespaces, which an unprivileged user may
create), whose loopback nobody else shares.

ggml's RPC protocol has no authentication, and its server only listens on TCP: on the host's
127.0.0.1 any local user could connect to it and run tensors on it, or read what a head
sent. In the jail the server listens on the namespace's own 127.0.0.1, and the node process
gets each connection to it as a file descriptor: it asks the child over a socketpair they
alone hold, the child connects inside the namespace and passes the connected socket back
(SCM_RIGHTS). The bytes then flow between the node and ggml as before, with no extra hop.

Where the system refuses the namespaces (user namespaces turned off), JailUnavailable says
why, and the node falls back to a server on the host's loopback (fleet/rpc_node.py)."""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
import threading
import time

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
START_TIMEOUT = 60.0  # the child loads ggml and starts its server


class JailUnavailable(RuntimeError):
    """The system refuses the namespaces, or the jailed server did not start; the message says why."""


def _unshare() -> None:
    """Enter new user and network namespaces (this process must be single-threaded), map this
    user to itself, and bring the new namespace's loopback up."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise JailUnavailable(f"this system refuses an unprivileged network namespace ({os.strerror(err)})")
    for path, text in (("/proc/self/uid_map", f"{uid} {uid} 1"), ("/proc/self/setgroups", "deny"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass  # an unmapped id works for what the server does (it keeps its real one for files)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(ctrl_fd: int, cache_dir: str, threads: int) -> int:
    """The jail: its server, and a connection to it for each byte b"C" the node sends."""
    ctrl = socket.socket(fileno=ctrl_fd)
    try:
        _unshare()
    except (JailUnavailable, OSError) as e:
        ctrl.sendall(b"E" + str(e).encode()[:1000])
        return 3
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: the node's end is this server's end
    from . import rpc
    port = _free_port()
    threading.Thread(target=rpc.serve, args=(port, cache_dir, threads), name="ggml-rpc", daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                ctrl.sendall(b"Eggml's RPC server did not listen in its namespace")
                return 4
            time.sleep(0.05)
    ctrl.sendall(b"R")
    while True:
        ask = ctrl.recv(1)
        if not ask:
            return 0  # the node went away
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        except OSError as e:
            ctrl.sendall(b"E" + str(e).encode()[:200])
            continue
        conn.settimeout(None)
        try:
            socket.send_fds(ctrl, [b"F"], [conn.fileno()])
        finally:
            conn.close()


class RpcJail:
    """The node's side: start the jailed server (JailUnavailable where it cannot run) and
    hand out connections to it."""

    def __init__(self, cache_dir: str, threads: int):
        os.makedirs(cache_dir, exist_ok=True)
        mine, theirs = socket.socketpair()
        self._ctrl = mine
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-m", "superfluid.runtime.rpc_jail", str(theirs.fileno()),
                                      cache_dir, str(max(1, threads))], pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.DEVNULL)
        theirs.close()
        mine.settimeout(START_TIMEOUT)
        try:
            first = mine.recv(1100)
        except OSError as e:
            self.close()
            raise JailUnavailable(f"the jailed RPC server did not start ({e})") from None
        if first != b"R":
            self.close()
            why = first[1:].decode(errors="replace") if first[:1] == b"E" else "it exited"
            raise JailUnavailable(why)
        mine.settimeout(10.0)

    def connect(self) -> socket.socket:
        """A new connection to the server (blocking, briefly: run it off an event loop)."""
        with self._lock:
            self._ctrl.sendall(b"C")
            msg, fds, _, _ = socket.recv_fds(self._ctrl, 1000, 1)
        if msg[:1] != b"F" or not fds:
            for fd in fds:
                os.close(fd)
            raise OSError(msg[1:].decode(errors="replace") or "the jailed RPC server is gone")
        return socket.socket(fileno=fds[0])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self._ctrl.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
