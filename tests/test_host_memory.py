"""`bertjax.main --host_memory=keep` (the default): a step's scratch memory is not faulted in
again on the next step. Measured in fresh processes, since the setting must precede JAX's
CPU runtime."""
import json
import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A gradient step whose scratch buffer (a 96 MB activation) is larger than anything glibc
# keeps by default; page faults counted over 50 calls after ten warm-up calls. With the
# setting the heap still grows, a whole buffer at a time, until it holds as many as
# fragmentation ever needs at once (up to about eight here, within the first 80 calls, at
# calls that differ from run to run), then never again: a window of 50 calls sees at most
# those few growths, against a buffer per call without the setting. A window of ten calls
# was too short: four growths in it (9,953 faults per call) failed the bound.
PROGRAM = """
import json, resource, sys
from bertjax import host_memory
applied = host_memory.keep_freed_memory() if sys.argv[1] == "keep" else None
import jax, jax.numpy as jnp
step = jax.jit(jax.grad(lambda w, x: jnp.tanh(x @ w).sum()))
x, w = jnp.ones((4096, 64)), jnp.ones((64, 6144)) / 64
for _ in range(10):
    step(w, x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step(w, x).block_until_ready()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "faults_per_call": faults / 50}))
"""


def _faults(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # nothing written to the shared cache
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="the setting is glibc's")
def test_kept_memory_is_not_faulted_in_again_each_step():
    released, kept = _faults("release"), _faults("keep")
    assert kept["applied"] is True
    # 96 MB is 24,576 pages: without the setting each call faults them in again.
    assert released["faults_per_call"] > 20_000, released
    assert kept["faults_per_call"] < 0.25 * released["faults_per_call"], (kept, released)

