"""The pretraining input pipeline. TensorFlow is used here for data only."""

import functools
import os

from bertjax.batching import PACKED_ARRAYS

# Every module of this package imports TensorFlow: quiet before the first import. Both are
# needed: TensorFlow announces its oneDNN kernels on stderr whatever the log level.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# A pretraining batch: the original release's names.
FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")
# Packed rows (data.examples_per_row > 1, packing.py) also carry the batching contract's.
PACKED_FEATURES = PACKED_ARRAYS


@functools.cache
def tensorflow():
    """TensorFlow, kept off the accelerators so it never takes memory JAX needs.

    Every bertjax use of TensorFlow (the pipeline, shard writing, TF checkpoint
    conversion) gets it from here; hiding devices only works before TF first touches them.
    """
    import tensorflow as tf
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except (RuntimeError, ValueError):
            pass  # already initialised, or no such device type in this build
    return tf
