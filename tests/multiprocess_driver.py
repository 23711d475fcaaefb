"""One process of a multi-process pretraining run on synthetic data (tests/test_main.py).

  multiprocess_driver.py WORKDIR [SIGTERM_AT]

Joins the others through bertjax.main's BERTJAX_* environment contract, then trains; each
process feeds only its own rows of every global batch. With SIGTERM_AT, the process sends
itself SIGTERM when it reads that batch, as a preempted host would receive it.
"""

import os
import signal
import sys

from bertjax import main

main.initialize_distributed()

import jax  # noqa: E402

import pretrain_helpers as ph  # noqa: E402
from bertjax.training import pretrain  # noqa: E402


class SignalAt:
    def __init__(self, iterator, at):
        self.iterator, self.at = iterator, at

    def __next__(self):
        batch = next(self.iterator)
        if self.iterator.step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return batch

    def position(self):
        return self.iterator.position()


def run(workdir: str, sigterm_at: int | None) -> None:
    config = ph.multiprocess_config()
    data = ph.synthetic_data(config, jax.process_index(), jax.process_count())
    if sigterm_at is not None:
        train = data.train
        data.train = lambda position: SignalAt(train(position), sigterm_at)
    out = pretrain.train(config, workdir, data)
    print(f"stopped at step {out['step']}, preempted: {out['preempted']}")


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
