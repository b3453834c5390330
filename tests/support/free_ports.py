"""Ports for a Python test's servers that neither an outgoing connection nor another test can
take first (the Python side of free_port_range.hpp, with the same claim files).

A port found by binding port 0 comes from the ephemeral range, where outgoing connections get
their local ports; ports below it (20000-32000 here) are handed out only on request. Two tests
probing at once can still both find the same port free before either's program binds it:
each port handed out is claimed with an exclusive lock on /tmp/ddp-test-ports/<port>.lock,
held until this process exits, so no other test process (C++ or Python) gets it.
"""
import fcntl
import os
import socket

_CLAIMS = []  # the open lock files: a claim lasts as long as this process


def _claim(port):
    try:
        os.makedirs("/tmp/ddp-test-ports", mode=0o1777, exist_ok=True)
        f = open(f"/tmp/ddp-test-ports/{port}.lock", "a")
    except OSError:
        return True  # no lock to be had: the bind probe alone decides
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return False
    _CLAIMS.append(f)
    return True


def free_ports_below_ephemeral(n=1):
    """The first of n consecutive free loopback ports in 20000-32000, claimed for this
    process, starting at an offset from the pid so concurrent tests rarely probe the same."""
    for base in range(20000 + os.getpid() % 10000 // n * n, 32000 - n + 1, n):
        if not all(_claim(base + k) for k in range(n)):
            continue
        socks = []
        try:
            for k in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in 20000-32000")
