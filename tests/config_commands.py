"""The commands in the configs' docstrings, parsed as `python -m bertjax.main` parses them, for
the tests that run each config as its docstring says."""
import importlib.util
import os
import shlex

from absl import flags
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def docstring_commands(config_path: str) -> list[list[str]]:
    """Each `python -m bertjax.*` command in the docstring of ROOT/config_path, as argv."""
    spec = importlib.util.spec_from_file_location("config", os.path.join(ROOT, config_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.__doc__.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip().startswith("python -m bertjax.")]


def parse(args: list[str]):
    """(config, workdir) from `python -m bertjax.main` arguments, by the real flag parser."""
    argv = ["bertjax.main", *args]
    values = flags.FlagValues()
    # The override flags (--config.a.b) are declared from the arguments being parsed.
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                    sys_argv=argv)
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    # The TPU plan's flags (a plan needs no workdir).
    flags.DEFINE_string("compile_only", None, "", flag_values=values)
    flags.DEFINE_bool("largest_batch", False, "", flag_values=values)
    values(argv)
    return values.config, values.workdir
