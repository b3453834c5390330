"""Runs a command with a claimed free port in an environment variable: with_free_port.py VAR
COMMAND [ARGS...]. The port and the next one (ddprun's static rendezvous serves its store on
--master-port + 1) come from free_ports.py: below the ephemeral range, claimed with their lock
files for as long as the command runs, so a test whose program would otherwise pick a
port by binding port 0 (horovodrun's store port) cannot meet another test's server or an
outgoing connection on it. Exits with the command's status."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from free_ports import free_ports_below_ephemeral  # noqa: E402

if len(sys.argv) < 3:
    sys.exit("usage: with_free_port.py VAR COMMAND [ARGS...]")
env = dict(os.environ, **{sys.argv[1]: str(free_ports_below_ephemeral(2))})
sys.exit(subprocess.call(sys.argv[2:], env=env))
