from superfluid.net.loopback import is_loopback_host


def test_loopback_hosts():
    for h in ("127.0.0.1", "127.0.0.1:8453", "localhost:1", "LOCALHOST", "[::1]:80", "::1", "app.localhost",
              "127.1.2.3"):
        assert is_loopback_host(h), h
    for h in ("evil.example", "10.0.0.1:8453", "0.0.0.0", "[2001:db8::1]:80", "localhost.evil.example", ""):
        assert not is_loopback_host(h), h
