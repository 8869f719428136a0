"""`python -m tandemctl` as a pipeline runs it: a subprocess with only the environment a pipeline would give it."""
import os
import subprocess
import sys

from tests.support.processes import ROOT


def tandemctl(*args, token: str | None, server: str, home, check_rc: int | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    """Run tandemctl ARGS against `server` with `token` (None: none anywhere); with `check_rc`, assert its exit
    code."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT), "TANDEM_URL": server,
           **({"TANDEM_TOKEN": token} if token else {})}
    run = subprocess.run([sys.executable, "-m", "tandemctl", *map(str, args)], env=env, capture_output=True,
                         text=True, timeout=timeout)
    if check_rc is not None:
        assert run.returncode == check_rc, (args, run.returncode, run.stdout, run.stderr)
    return run
