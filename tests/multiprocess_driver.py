"""One process of a multi-process pretraining run on synthetic data (tests/test_main.py).

Joins the others through bertjax.main's BERTJAX_* environment contract, then trains; each
process feeds only its own rows of every global batch.
"""

import sys

from bertjax import main

main.initialize_distributed()

import jax  # noqa: E402

import pretrain_helpers as ph  # noqa: E402
from bertjax.training import pretrain  # noqa: E402


def run(workdir: str) -> None:
    config = ph.multiprocess_config()
    data = ph.synthetic_data(config, jax.process_index(), jax.process_count())
    pretrain.train(config, workdir, data)


if __name__ == "__main__":
    run(sys.argv[1])
