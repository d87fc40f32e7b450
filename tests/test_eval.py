import math

import pytest

from dipdeploy.data import find_wikitext, load_text, windows
from dipdeploy.eval import EvalConfig, evaluate


def test_missing_dataset_is_clear(monkeypatch, tmp_path):
    monkeypatch.delenv("DIPDEPLOY_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="DIPDEPLOY_DATA"):
        find_wikitext("test", tmp_path)


def test_wikitext_protocol(data_dir, tiny_llama):
    text = load_text("wikitext2", "test", data_dir=data_dir)
    assert text.startswith("\n\n = Robert Boulter = ")  # row 1 is blank → "" joined by "\n\n"
    w = windows(tiny_llama.tokenizer, text, 256, 3)
    assert tuple(w.shape) == (3, 256)


@pytest.mark.parametrize("bad,match", [({"density": "0"}, "density"), ({"density": "1.5"}, "density"),
                                       ({"method": "relu"}, "method"), ({"quant_scope": "attn"}, "quant_scope")])
def test_eval_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(**bad)


def test_evaluate_rows(data_dir):
    rows = evaluate(EvalConfig(model="tiny-llama", method="dense,dip,glu", density="1.0,0.5", seqlen=64,
                               max_windows=2, data_dir=str(data_dir), calib_windows=2, calib_seqlen=64,
                               progress=False))
    assert [(r["method"], r["target_density"]) for r in rows] == [("dense", 1.0), ("dip", 1.0), ("dip", 0.5), ("glu", 1.0)]
    for r in rows:
        assert {"model", "method", "density", "ppl", "tokens", "seqlen"} <= set(r)
        assert math.isfinite(r["ppl"]) and r["tokens"] == 2 * 63
    assert rows[0]["ppl"] == pytest.approx(rows[1]["ppl"], rel=1e-6)


def test_smollm2_dense_vs_dip(data_dir):
    """SmolLM2 on one short window: a trained model (PPL far below vocab size) that DIP degrades."""
    rows = evaluate(EvalConfig(model="smollm2-135m", method="dense,dip", density="1.0,0.5", seqlen=128,
                               max_windows=1, data_dir=str(data_dir), calib_windows=1, calib_seqlen=128,
                               progress=False, sparsity=__import__("dipdeploy.sparsity.plan", fromlist=["x"]).SparsityConfig(rho_in=0.55)))
    dense, dip = rows[0]["ppl"], rows[-1]["ppl"]
    assert dense < 100 and dip > dense


def test_prefix_tokenisation_equals_whole_text(data_dir, smollm2):
    text = load_text("wikitext2", "validation", data_dir=data_dir)[:200_000]
    whole = smollm2.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    w = windows(smollm2.tokenizer, text, 512, 3)
    assert (w.reshape(-1) == whole[: 3 * 512]).all()


def test_a_greedy_row_records_the_strength_it_chose(data_dir):
    """The greedy allocation keeps the uniform plan (strength 0) when no skew lowers the held-out KL; the
    row says which it chose, so a table can tell a greedy plan from the uniform one."""
    from dipdeploy.sparsity.plan import SparsityConfig, allocation_label

    def row(allocation):
        (r,) = evaluate(EvalConfig(model="tiny-llama", method="dip", density="0.5", seqlen=64, max_windows=1,
                                   data_dir=str(data_dir), calib_windows=2, calib_seqlen=64, progress=False,
                                   sparsity=SparsityConfig(rho_in=0.55, allocation=allocation)))
        return r

    greedy, uniform = row("greedy"), row("uniform")
    assert greedy["allocation"] == "greedy" and greedy["greedy_strength"] in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4)
    assert uniform["allocation"] == "uniform" and uniform["greedy_strength"] is None
    assert allocation_label("greedy", 0.0) == "greedy (strength 0: uniform)"
    assert allocation_label("greedy", 0.15) == "greedy (strength 0.15)"
    assert allocation_label("greedy-split", 0.0) == "greedy-split (strength 0)"  # its splits may still differ
    assert (allocation_label("uniform", None), allocation_label("joint", 0.2)) == ("uniform", "joint")


def test_logit_chunks_shrink_with_the_batch_not_the_nll(tiny_llama, monkeypatch):
    """The lm_head runs in chunks of positions sized so B × positions × vocab fp32 logits stay bounded
    (eval's DIP-CA batch of 16 windows of Gemma 3's 262k vocabulary would otherwise need ~17 GB); the
    chunking changes the memory, not the NLL."""
    import torch

    from dipdeploy.sparsity import nll as P  # the NLL the evaluation (eval.perplexity) and the split search share

    assert P.logit_chunk(1, 49152) == 512 and P.logit_chunk(16, 262144) == 32 and P.logit_chunk(1, 10**12) == 1
    torch.manual_seed(0)
    vocab = tiny_llama.model.config.vocab_size
    batch = torch.randint(0, vocab, (3, 40))
    whole = P.window_nll(tiny_llama.model, batch)
    monkeypatch.setattr(P, "_LOGIT_ELEMENTS", 3 * 7 * vocab)  # 7 positions per chunk, the last one shorter
    assert P.logit_chunk(3, vocab) == 7
    chunked = P.window_nll(tiny_llama.model, batch)
    assert chunked[1] == whole[1] == 3 * 39 and chunked[0] == pytest.approx(whole[0], rel=1e-5)
