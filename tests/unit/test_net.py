from superfluid.net.loopback import is_loopback_host


def test_loopback_hosts():
    for h in ("127.0.0.1", "127.0.0.1:8453", "localhost:1", "LOCALHOST", "[::1]:80", "::1", "app.localhost",
              "127.1.2.3"):
        assert is_loopback_host(h), h
    for h in ("evil.example", "10.0.0.1:8453", "0.0.0.0", "[2001:db8::1]:80", "localhost.evil.example", ""):
        assert not is_loopback_host(h), h


def test_a_listener_is_told_ours_only_when_this_process_holds_it():
    """Issue 33 item 10: the RPC node checks that the port its server listens on is its own
    (another local user may take a port picked beforehand)."""
    import socket
    import subprocess
    import sys

    from superfluid.net.loopback import listener_is_ours
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert listener_is_ours(s.getsockname()[1]) is True
    other = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                              "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
                              "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(other.stdout.readline())
        assert listener_is_ours(port) is False  # someone else's
    finally:
        other.kill()
        other.wait()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening
        assert listener_is_ours(s.getsockname()[1]) is False
