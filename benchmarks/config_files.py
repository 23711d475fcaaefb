"""A config file of configs/ with overrides, the config `python -m bertjax.main
--config=FILE --config.KEY=VALUE ...` runs, built in this process."""
from __future__ import annotations

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(path: str, overrides: dict | None = None):
    """The config of REPO/`path` (e.g. configs/tiny.py) with `overrides`, {dotted key: value};
    a string given for a tuple key is a comma-separated list, as on the command line."""
    spec = importlib.util.spec_from_file_location("config", os.path.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    flat = config.to_dict()

    def current(key):
        node = flat
        for part in key.split("."):
            node = node[part]
        return node
    config.update_from_flattened_dict({
        k: tuple(v.split(",")) if isinstance(current(k), tuple) and isinstance(v, str) else v
        for k, v in (overrides or {}).items()})
    return config.lock()  # as bertjax.main locks it: no key may be added
