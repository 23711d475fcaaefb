"""Test-wide setup: CPU only, 8 forced devices so sharding is exercised for real."""
import os
import tempfile

# Must happen before jax or tensorflow initialise a backend.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# Tests compile the same small programs many times, in this process, the other pytest-xdist
# worker and the subprocesses they start: one persistent compilation cache for all of them,
# every program in it (eager ops too: XLA:CPU takes ~80 ms to compile even one `sin`).
COMPILATION_CACHE = os.path.join(tempfile.gettempdir(), "bertjax-test-compilation-cache")
os.environ["JAX_COMPILATION_CACHE_DIR"] = COMPILATION_CACHE  # inherited by subprocesses
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_compilation_cache_dir", COMPILATION_CACHE)  # jax may be imported already
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
