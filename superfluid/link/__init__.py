"""Wire protocols, sans-I/O: bytes in, events out. No sockets here."""
