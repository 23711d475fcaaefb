"""Every key of a pretraining config, with its default: the files in configs/ start from here.

Defaults are the original BERT recipe (phase 1 of BERT-base). The model's sizes are concrete
numbers (a preset's, written in by `defaults(size)`), so run_config.json shows what ran. The
loader (`config_flags`, `lock_config=True`) rejects keys that are not listed here, so code
reads `config.x.y` and never guesses; `validate` checks the values before anything runs.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from bertjax.models import presets

# Logical parameter axis -> mesh axes. 'batch' is the first axis of every input array.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
)


def defaults(size: str = "base") -> ml_collections.ConfigDict:
    """Every key, with the original recipe's values and the sizes of preset `size`."""
    config = ml_collections.ConfigDict()
    config.mode = "pretrain"
    config.seed = 0
    # A model directory (converted or exported) or another pretraining workdir: the run starts
    # from its parameters with a fresh optimizer (continued pretraining, phase 2). Ignored when
    # the workdir already has a checkpoint: the run then resumes from that.
    config.init_checkpoint = ""
    config.quiet = False  # no progress lines on the console

    config.model = ml_collections.ConfigDict()
    # None: the tokenizer's vocabulary size (larger rounds the embedding up, e.g. to x128).
    config.model.vocab_size = placeholder(int)
    for key, value in presets.sizes(size).items():  # num_hidden_layers, hidden_size, ...
        config.model[key] = value
    config.model.hidden_act = "gelu"
    config.model.max_position_embeddings = 512
    config.model.hidden_dropout_prob = 0.1
    config.model.attention_probs_dropout_prob = 0.1
    config.model.pre_layer_norm = False
    config.model.remat = False
    # What remat keeps for the backward pass: a jax.checkpoint_policies name
    # (nothing_saveable: recompute everything; dots_with_no_batch_dims_saveable: keep the
    # matmul outputs).
    config.model.remat_policy = "nothing_saveable"
    # One layer traced once and scanned over the depth (the program no longer grows with the
    # number of layers); parameters and checkpoints keep their per-layer layout.
    config.model.scan_layers = False
    # Dropout's random bits: threefry (JAX's default) | rbg | unsafe_rbg (XLA's
    # RngBitGenerator, native on TPUs and GPUs; on CPUs no reliable gain was measured) |
    # counter_hash (an integer hash of each element's index; on a CPU a mini pretraining
    # step 1.05x faster with the default 16-bit masks; models/dropout.py). Any of them
    # resumes exactly; they draw different masks.
    config.model.dropout_rng = "threefry"
    # Random bits per mask element: 16 (two draws per random word: half the generator's
    # work, 11% of a pretraining step on a CPU; rate 0.1 becomes 0.100006) | 32 (Flax's
    # nn.Dropout, the masks of runs before this option).
    config.model.dropout_mask_bits = 16
    # The last layer computes only the positions the heads read ([CLS] and the masked positions); keys and values
    # still come from every position, so the outputs are the same, for 13% fewer FLOPs and a
    # 1.17x faster step in mini pretraining on a CPU. That layer's dropout masks differ.
    config.model.sparse_last_layer = True
    # Self-attention: xla (jax.nn.dot_product_attention; explicit scores while the
    # probabilities drop out) | splash (TPU's Pallas kernel, models/attention.py: keeps no
    # [B, H, L, L] probabilities for the backward pass; needs attention_probs_dropout_prob=0,
    # which the original recipe does not use; interpreted, slowly, off TPUs).
    config.model.attention = "xla"
    # Compute dtype; parameters stay float32. auto: bfloat16 on GPUs and TPUs, float32 on CPUs.
    config.model.dtype = "auto"

    config.data = ml_collections.ConfigDict()
    config.data.shard_dir = ""  # output of `python -m bertjax.prepare`
    # '' holds out `heldout_fraction` of shard_dir's documents for evaluation instead.
    config.data.eval_shard_dir = ""
    config.data.heldout_fraction = 0.01
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.data.mask_rate = 0.15
    config.data.mask_prob = 0.8  # of the chosen positions: [MASK]
    config.data.random_prob = 0.1  # random token; the rest stay unchanged
    config.data.short_seq_prob = 0.1
    config.data.nsp = True
    config.data.whole_word_masking = False
    # Examples are made and shuffled in blocks of documents of about this many tokens.
    config.data.shuffle_tokens = 1 << 19
    # Up to this many examples per row (first-fit, longest first), each attending only to
    # itself with its own positions, predictions and next-sentence label, so rows of short
    # examples (short documents, phase 2 at seq 512) hold text instead of padding. Rows then
    # carry max_predictions_per_seq + examples_per_row prediction slots. 1: as the original.
    config.data.examples_per_row = 1

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "bert_adamw"  # bert_adamw | adamw | lamb
    config.optimizer.schedule = "bert"  # bert | warmup_linear
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 10_000
    config.optimizer.weight_decay = 0.01
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.clip_norm = 1.0  # 0: no clipping
    # Micro-batches per step (global_batch_size / this at a time), one update per step.
    config.optimizer.grad_accum_steps = 1

    config.mesh = ml_collections.ConfigDict()
    config.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); one -1 fills from the devices
    config.mesh.rules = DEFAULT_RULES

    config.train = ml_collections.ConfigDict()
    config.train.global_batch_size = 256
    config.train.num_steps = 1_000_000
    config.train.log_every = 100
    config.train.eval_every = 10_000  # 0: no evaluation during training
    config.train.eval_batches = 20
    config.train.checkpoint_every = 10_000
    config.train.keep_checkpoints = 3
    # A checkpoint that fails verification on resume is reported, removed and the next
    # older one used; False makes it an error instead.
    config.train.restore_fallback = True
    config.train.peak_flops_per_device = 0.0  # for MFU; 0: known chips' table, else measured
    # Steps (first, last + 1) to trace with the JAX profiler into WORKDIR/profile (TensorBoard's
    # profile plugin or Perfetto read it); (0, 0): none.
    config.train.profile_steps = (0, 0)
    # A persistent compilation cache, so a restarted run (after a preemption) does not compile
    # again; '' keeps JAX's default (none). A gs:// path works, shared by all hosts. Not on by
    # default: on CPUs, jax 0.9-0.10's cache rejects its own entries on some hosts
    # (jax-ml/jax#38445), and a cache shared between machines must not serve CPU code built
    # for another instruction set.
    config.train.compilation_cache_dir = ""
    return config


DTYPES = ("auto", "float32", "bfloat16")


# The checks below import JAX and the modules built on it when they run, not at import: the
# config files import this module, and the launchers load those files (in a child process,
# one per launch) only to parse them: 0.2 s instead of 3.5 for a dry run of launch/tpu_vm.py.
def check_dropout(model: ml_collections.ConfigDict) -> None:
    from bertjax.models.dropout import MASK_BITS
    from bertjax.training.trainer import DROPOUT_RNGS
    if model.dropout_rng not in DROPOUT_RNGS:
        raise ValueError(f"model.dropout_rng {model.dropout_rng!r}: expected one of "
                         f"{', '.join(DROPOUT_RNGS)}")
    if model.dropout_mask_bits not in MASK_BITS:
        raise ValueError(f"model.dropout_mask_bits {model.dropout_mask_bits}: expected one of "
                         f"{', '.join(map(str, MASK_BITS))}")


def check_attention(model: ml_collections.ConfigDict) -> None:
    from bertjax.models.attention import ATTENTIONS
    if model.attention not in ATTENTIONS:
        raise ValueError(f"model.attention {model.attention!r}: expected one of "
                         f"{', '.join(ATTENTIONS)}")
    if model.attention == "splash" and model.attention_probs_dropout_prob:
        raise ValueError(f"model.attention 'splash' has no dropout on the attention "
                         f"probabilities: set model.attention_probs_dropout_prob=0 (it is "
                         f"{model.attention_probs_dropout_prob})")


def check_remat_policy(name: str) -> None:
    import jax
    if not hasattr(jax.checkpoint_policies, name):
        raise ValueError(f"model.remat_policy {name!r}: expected a name of "
                         f"jax.checkpoint_policies (nothing_saveable, "
                         f"dots_with_no_batch_dims_saveable, ...)")


def check_profile_steps(steps) -> None:
    if len(steps) != 2 or not 0 <= steps[0] <= steps[1]:
        raise ValueError(f"train.profile_steps {tuple(steps)}: expected (first, last + 1) with "
                         f"0 <= first <= last + 1; (0, 0) for none")


def validate(config: ml_collections.ConfigDict) -> None:
    """One clear error for the first value that cannot run, before anything starts."""
    train, model, data = config.train, config.model, config.data
    for key in ("global_batch_size", "num_steps", "log_every", "checkpoint_every",
                "keep_checkpoints"):
        if train[key] <= 0:
            raise ValueError(f"train.{key} is {train[key]}: expected a positive number")
    for key in ("eval_every", "eval_batches"):
        if train[key] < 0:
            raise ValueError(f"train.{key} is {train[key]}: expected 0 (none) or more")
    if model.dtype not in DTYPES:
        raise ValueError(f"model.dtype {model.dtype!r}: expected one of {', '.join(DTYPES)}")
    check_dropout(model)
    check_attention(model)
    check_remat_policy(model.remat_policy)
    check_profile_steps(train.profile_steps)
    if data.max_seq_length > model.max_position_embeddings:
        raise ValueError(f"data.max_seq_length {data.max_seq_length} exceeds "
                         f"model.max_position_embeddings {model.max_position_embeddings}")


# The original two phases: (max_seq_length, max_predictions_per_seq, num_steps).
PHASES = {
    "phase1": (128, 20, 900_000),
    "phase2": (512, 80, 100_000),
}


def original_recipe(size: str, phase: str) -> ml_collections.ConfigDict:
    """The paper's recipe for a model size: 90% of the steps at length 128, then 10% at 512
    (phase 2 starts from phase 1's parameters via init_checkpoint, with a fresh optimizer)."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: expected one of {', '.join(PHASES)}")
    config = defaults(size)
    seq_len, predictions, steps = PHASES[phase]
    config.data.max_seq_length = seq_len
    config.data.max_predictions_per_seq = predictions
    config.train.num_steps = steps
    config.train.global_batch_size = 256
    return config
