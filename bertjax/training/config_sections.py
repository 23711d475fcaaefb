"""The config sections pretraining and fine-tuning share, each defined once with its checks:
the model's run options, the optimizer, the mesh and the training loop's common keys.

pretrain_config.py and finetune_config.py build their configs from these and add what is
theirs (pretraining: the architecture, the data, steps; fine-tuning: the task section, which
its task file defines, and epochs). A key whose None means "decide for me" is a
`placeholder`; there are no sentinel values.

Nothing here imports JAX when the module loads: the config files import it, and the launchers
load those files only to parse them (the checks import what they need when they run).
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import FieldReference, placeholder

# Logical parameter axis -> mesh axes. 'batch' is the first axis of every input array.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
)


def model_options(model: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Adds the keys of `model` that say how the encoder runs, not what it is (those are the
    checkpoint's when fine-tuning, the preset's when pretraining)."""
    model.hidden_dropout_prob = 0.1
    model.attention_probs_dropout_prob = 0.1
    model.remat = False
    # What remat keeps for the backward pass: a jax.checkpoint_policies name
    # (nothing_saveable: recompute everything; dots_with_no_batch_dims_saveable: keep the
    # matmul outputs).
    model.remat_policy = "nothing_saveable"
    # One layer traced once and scanned over the depth (the program no longer grows with the
    # number of layers); parameters and checkpoints keep their per-layer layout.
    model.scan_layers = False
    # Dropout's random bits: threefry (JAX's default) | rbg | unsafe_rbg (XLA's
    # RngBitGenerator, native on TPUs and GPUs; on CPUs no reliable gain was measured) |
    # counter_hash (an integer hash of each element's index; on a CPU a mini pretraining
    # step 1.05x faster with the default 16-bit masks; models/dropout.py). Any of them
    # resumes exactly; they draw different masks.
    model.dropout_rng = "threefry"
    # Random bits per mask element: 16 (two draws per random word: half the generator's
    # work, 11% of a pretraining step on a CPU; rate 0.1 becomes 0.100006) | 32 (Flax's
    # nn.Dropout, the masks of runs before this option).
    model.dropout_mask_bits = 16
    # The last layer computes only the positions the heads read (the [CLS]s, and the masked
    # positions in pretraining; tagging and QA read every position); keys and values still
    # come from every position, so the outputs are the same, for 13% fewer FLOPs and a 1.17x
    # faster step in mini pretraining on a CPU. That layer's dropout masks differ.
    model.sparse_last_layer = True
    # Self-attention: xla (jax.nn.dot_product_attention; explicit scores while the
    # probabilities drop out) | splash (TPU's Pallas kernel, models/attention.py: keeps no
    # [B, H, L, L] probabilities for the backward pass; needs attention_probs_dropout_prob=0,
    # which the original recipe does not use; interpreted, slowly, off TPUs).
    model.attention = "xla"
    # Compute dtype; parameters stay float32. auto: bfloat16 on GPUs and TPUs, float32 on CPUs.
    model.dtype = "auto"
    return model


def optimizer_section(learning_rate: float) -> ml_collections.ConfigDict:
    optimizer = ml_collections.ConfigDict()
    optimizer.name = "bert_adamw"  # bert_adamw | adamw | lamb
    optimizer.schedule = "bert"  # bert | warmup_linear
    optimizer.learning_rate = learning_rate
    optimizer.weight_decay = 0.01
    optimizer.b1 = 0.9
    optimizer.b2 = 0.999
    optimizer.eps = 1e-6
    # The global norm gradients are clipped to; None (in a config file) does not clip.
    optimizer.clip_norm = FieldReference(1.0, field_type=float)
    # Micro-batches per step (global_batch_size / this at a time), one update per step.
    optimizer.grad_accum_steps = 1
    return optimizer


def mesh_section() -> ml_collections.ConfigDict:
    mesh = ml_collections.ConfigDict()
    mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); one -1 fills from the devices
    mesh.rules = DEFAULT_RULES
    return mesh


def train_section(global_batch_size: int, log_every: int,
                  keep_checkpoints: int) -> ml_collections.ConfigDict:
    train = ml_collections.ConfigDict()
    train.global_batch_size = global_batch_size
    train.log_every = log_every
    train.keep_checkpoints = keep_checkpoints
    # A checkpoint that fails verification on resume is reported, removed and the next
    # older one used; False makes it an error instead.
    train.restore_fallback = True
    # For MFU; None: the known chips' table, else measured.
    train.peak_flops_per_device = placeholder(float)
    # Steps (first, last + 1) to trace with the JAX profiler into WORKDIR/profile (TensorBoard's
    # profile plugin or Perfetto read it); None: none.
    train.profile_steps = placeholder(tuple)
    # A persistent compilation cache, so a restarted run (after a preemption) does not compile
    # again; None keeps JAX's default (none). A gs:// path works, shared by all hosts. Not on
    # by default: on CPUs, jax 0.9-0.10's cache rejects its own entries on some hosts
    # (jax-ml/jax#38445), and a cache shared between machines must not serve CPU code built
    # for another instruction set.
    train.compilation_cache_dir = placeholder(str)
    return train


DTYPES = ("auto", "float32", "bfloat16")


def check_model(model: ml_collections.ConfigDict) -> None:
    """The run options' values, checked where the model checks them (BertConfig) and the
    rest (dtype, dropout_rng) here; the messages name the `model.` key."""
    from bertjax.models.bert import BertConfig
    from bertjax.training.trainer import DROPOUT_RNGS
    if model.dtype not in DTYPES:
        raise ValueError(f"model.dtype {model.dtype!r}: expected one of {', '.join(DTYPES)}")
    if model.dropout_rng not in DROPOUT_RNGS:
        raise ValueError(f"model.dropout_rng {model.dropout_rng!r}: expected one of "
                         f"{', '.join(DROPOUT_RNGS)}")
    pretraining = "vocab_size" in model  # the section names the architecture itself
    try:
        # Any platform: only the values are checked (no backend is started).
        BertConfig.from_config(model, None if pretraining else BertConfig(), vocab_size=1,
                               platform="cpu")
    except ValueError as e:  # BertConfig's own checks name the field, not the config key
        raise ValueError(str(e) if str(e).startswith("model.") else f"model.{e}") from None


def check_optimizer(optimizer: ml_collections.ConfigDict) -> None:
    if optimizer.clip_norm is not None and optimizer.clip_norm <= 0:
        raise ValueError(f"optimizer.clip_norm {optimizer.clip_norm}: expected > 0 (None in a "
                         f"config file does not clip)")
    if optimizer.grad_accum_steps < 1:
        raise ValueError(f"optimizer.grad_accum_steps {optimizer.grad_accum_steps}: expected "
                         f"1 or more")


def check_train(train: ml_collections.ConfigDict, positive: tuple[str, ...]) -> None:
    for key in ("global_batch_size", "log_every", "keep_checkpoints", *positive):
        if train[key] <= 0:
            raise ValueError(f"train.{key} is {train[key]}: expected a positive number")
    steps = train.profile_steps
    if steps is not None and (len(steps) != 2 or not 0 <= steps[0] < steps[1]):
        raise ValueError(f"train.profile_steps {tuple(steps)}: expected (first, last + 1) with "
                         f"0 <= first <= last")
    if train.peak_flops_per_device is not None and train.peak_flops_per_device <= 0:
        raise ValueError(f"train.peak_flops_per_device {train.peak_flops_per_device}: expected "
                         f"> 0 (unset: the known chips' table, else measured)")
