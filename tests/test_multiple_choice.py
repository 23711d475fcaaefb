"""Multiple choice (the family added as one task file plus one config): SWAG's CSV layout read
with named errors, rows encoded as transformers encodes candidate pairs, and candidate scores
equal to transformers' BertForMultipleChoice on real MiniLM weights. Its end-to-end run is
tests/test_finetune_commands.py's (configs/finetune/choice.py's docstring command)."""
import numpy as np
import pytest

from benchmarks.task_data import MINILM_DIR, wordpiece
from bertjax.tasks import base as tasks

SWAG_HEADER = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"


def _task(**settings):
    cls = tasks.get("multiple_choice")
    config = cls.settings()
    config.question_column = "sent2"
    config.max_seq_length = 24
    for key, value in settings.items():
        config[key] = value
    return cls(config)


def _swag(path, rows):
    path.write_text(SWAG_HEADER + "".join(
        f"v{i},{i},x,{context},{question},gold,{','.join(endings)},{label}\n"
        for i, (context, question, endings, label) in enumerate(rows)), encoding="utf-8")
    return str(path)


def test_reads_swag_csv_and_names_a_bad_label(tmp_path):
    task = _task()
    path = _swag(tmp_path / "train.csv", [
        ("She opened the door.", "She", ["walked in.", "ate it.", "flew.", "sang."], 0),
        ("He sat down.", "He", ["read.", "jumped.", "left.", "slept."], 3)])
    (first, second) = task.read(path, labelled=True)
    assert first.context == "She opened the door."
    assert first.choices == ["She walked in.", "She ate it.", "She flew.", "She sang."]
    assert (first.label, second.label, second.guid) == (0, 3, "train.csv:3")
    bad = _swag(tmp_path / "bad.csv", [("A.", "B", ["c.", "d.", "e.", "f."], 4)])
    with pytest.raises(ValueError, match=r"bad.csv:2: label '4' is not a candidate's index "
                                         r"0...3"):
        task.read(bad, labelled=True)
    with pytest.raises(ValueError, match=r"no column 'ending9'"):
        _task(choice_columns=("ending0", "ending9")).read(path, labelled=True)


def test_rows_are_transformers_candidate_pairs():
    from transformers import BertTokenizerFast
    hf = BertTokenizerFast.from_pretrained(MINILM_DIR)
    task = _task(max_seq_length=16)
    long_context = "Emma walked with Harriet along the lane towards the vicarage in the rain"
    example = task.examples_from_texts([f"{long_context}\tand they talked.\tit was Sunday "
                                        f"and the church bells rang loudly over the fields"])[0]
    features = task.featurize([example], wordpiece(), None)
    assert features.arrays["input_ids"].shape == (1, 2, 16)
    for c, choice in enumerate(example.choices):
        expected = hf(long_context, choice, truncation="longest_first", max_length=16,
                      padding="max_length")
        np.testing.assert_array_equal(features.arrays["input_ids"][0, c], expected["input_ids"])
        np.testing.assert_array_equal(features.arrays["segment_ids"][0, c],
                                      expected["token_type_ids"])
        np.testing.assert_array_equal(features.arrays["input_mask"][0, c],
                                      expected["attention_mask"])


def test_scores_equal_transformers_bert_for_multiple_choice():
    import flax.linen as nn
    import jax
    import torch
    import transformers
    from bertjax.convert import hf as hf_convert
    from bertjax.models.heads import init_params

    converted = hf_convert.read_hf(MINILM_DIR, log=lambda *_: None)
    task = _task(max_seq_length=32)
    module = task.model(converted.config, None)
    fresh = nn.unbox(init_params(module, jax.random.PRNGKey(1)))
    params = {"bert": converted.params["bert"], "classifier": fresh["classifier"]}
    examples = task.examples_from_texts([
        "She opened the door.\tShe walked in.\tThe door ate lunch.\tRain fell.",
        "Emma smiled at Harriet.\tHarriet smiled back.\tThe vicar was tall.\tIt rained."])
    arrays = task.featurize(examples, wordpiece(), None).arrays
    ours = np.asarray(module.apply({"params": params}, arrays["input_ids"],
                                   arrays["input_mask"], arrays["segment_ids"]))

    reference = transformers.BertForMultipleChoice.from_pretrained(MINILM_DIR).eval()
    kernel, bias = params["classifier"]["kernel"], params["classifier"]["bias"]
    pooler = params["bert"]["pooler"]  # MiniLM ships none: both sides use ours
    with torch.no_grad():
        reference.classifier.weight.copy_(torch.tensor(np.asarray(kernel).T))
        reference.classifier.bias.copy_(torch.tensor(np.asarray(bias)))
        reference.bert.pooler.dense.weight.copy_(torch.tensor(np.asarray(pooler["kernel"]).T))
        reference.bert.pooler.dense.bias.copy_(torch.tensor(np.asarray(pooler["bias"])))
        theirs = reference(input_ids=torch.tensor(arrays["input_ids"], dtype=torch.long),
                           attention_mask=torch.tensor(arrays["input_mask"], dtype=torch.long),
                           token_type_ids=torch.tensor(arrays["segment_ids"],
                                                       dtype=torch.long)).logits.numpy()
    assert ours.shape == (2, 3)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
