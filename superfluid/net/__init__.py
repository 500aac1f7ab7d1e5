"""The socket code: transport.py reads and writes both links (Link F over TCP with the
secure channel, Link W over a socketpair); loopback.py says whether a host is this machine;
logline.py writes what a client sent into a log line as one line."""
