"""verispec asks OpenMP for passive waiting unless the environment says otherwise (spinning
threads collapse decode when another process holds a core)."""

import os
import subprocess
import sys


def _policy(env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", "import os, verispec; print(os.environ['OMP_WAIT_POLICY'])"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_passive_by_default_and_the_environment_wins():
    assert _policy({}) == "PASSIVE"
    assert _policy({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
