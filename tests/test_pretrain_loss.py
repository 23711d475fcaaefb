"""The pretraining loss is the original's: sum(w * CE) / (sum(w) + 1e-5) over the masked
positions, plus the mean NSP cross-entropy; checked against NumPy through the public
functions the train and eval steps use."""
import numpy as np
import pytest

from bertjax.training import pretrain


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("nsp", [True, False])
def test_loss_is_the_original_formula(nsp):
    rng = np.random.default_rng(0)
    B, P, V = 5, 7, 11
    logits = rng.normal(0, 2, (B, P, V)).astype(np.float32)
    ids = rng.integers(0, V, (B, P))
    weights = (rng.random((B, P)) < 0.6).astype(np.float32)  # padding slots weigh 0
    nsp_logits = rng.normal(0, 2, (B, 2)).astype(np.float32)
    labels = rng.integers(0, 2, B)
    batch = {"masked_lm_ids": ids, "masked_lm_weights": weights,
             "next_sentence_labels": labels}
    sums = pretrain.pretraining_sums({"mlm_logits": logits, "nsp_logits": nsp_logits}, batch)
    got = {k: float(v) for k, v in pretrain.summarize(sums, nsp).items()}

    ce = -np.take_along_axis(log_softmax(logits.astype(np.float64)), ids[..., None], -1)[..., 0]
    mlm = (weights * ce).sum() / (weights.sum() + 1e-5)
    hits = (logits.argmax(-1) == ids)
    assert got["mlm_loss"] == pytest.approx(mlm, rel=1e-5)
    assert got["mlm_accuracy"] == pytest.approx((weights * hits).sum() / (weights.sum() + 1e-5),
                                                rel=1e-5)
    if nsp:
        nsp_ce = -log_softmax(nsp_logits.astype(np.float64))[np.arange(B), labels]
        assert got["nsp_loss"] == pytest.approx(nsp_ce.mean(), rel=1e-5)
        assert got["nsp_accuracy"] == pytest.approx(
            np.mean(nsp_logits.argmax(-1) == labels), rel=1e-6)
        assert got["loss"] == pytest.approx(mlm + nsp_ce.mean(), rel=1e-5)
    else:
        assert "nsp_loss" not in got and got["loss"] == pytest.approx(mlm, rel=1e-5)
