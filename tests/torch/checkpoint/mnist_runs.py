"""What the mnist checkpoint tests share: running one command to its end."""
import subprocess


def run(cmd, cwd):
    """Runs `cmd` in `cwd` (at most 300 s) and returns its output; AssertionError with the
    output when it exits non-zero."""
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}")
    return p.stdout
