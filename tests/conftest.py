"""Test-wide setup: CPU only, 8 forced devices so sharding is exercised for real."""
import os

# Must happen before jax or tensorflow initialise a backend.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
