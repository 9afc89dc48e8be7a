"""A finetuned decoder exports (``minimodel.models.decoder_task``): its causal LM as ``hf_decoder.to_hf`` writes it plus the
classification head, and ``load_task_model`` (transformers and torch only) gives our logits on the last real token;
a tiny decoder chain (Llama-style untied, GPT-2 style) exported with ``task=`` predicts what step 4 saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import minimodel.models.hf_decoder  # noqa: E402
from minimodel.cli import main  # noqa: E402
from minimodel.errors import ConfigError  # noqa: E402
from minimodel.models.decoder_task import HEAD_CONFIG, HEAD_WEIGHTS, load_task_model, task_to_hf  # noqa: E402
from minimodel.models.model import ClassificationHead, SpanHead  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.test_decoder import STYLES, decoder, ids  # noqa: E402
from tests.test_decoder_pipeline import LLAMA, run_args  # noqa: E402

GPT2 = ["model.family=decoder", "model.activation=gelu_tanh"]  # the rest of GPT-2 is the schema's defaults


def right_padded(x: torch.Tensor, lengths: list[int], pad: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    mask = (torch.arange(x.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    return x.masked_fill(mask == 0, pad), mask


@pytest.mark.parametrize("style", list(STYLES))
def test_the_loader_gives_our_logits_on_the_last_real_token(tmp_path, style):
    body = decoder(style)
    torch.manual_seed(1)
    head = ClassificationHead(body.cfg.hidden, 3, 0.0, "last").eval()
    task_to_hf(body, head, ["a", "b", "c"], False, tmp_path)
    assert (tmp_path / HEAD_WEIGHTS).is_file()
    meta = json.loads((tmp_path / HEAD_CONFIG).read_text())
    assert (meta["labels"], meta["pooling"], meta["hidden"], meta["num_labels"]) == (["a", "b", "c"], "last", 32, 3)
    causal_lm = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)  # the directory is the language model
    assert type(causal_lm).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[style]
    model = load_task_model(tmp_path)
    assert type(model.base).__name__ == {"gpt2": "GPT2Model", "llama": "LlamaModel"}[style] and not model.training
    x, mask = right_padded(ids(3, 12), [12, 7, 3])
    with torch.no_grad():
        mine = head(body.encode(x), mask)
        theirs = model(x, mask)
        # the base model's last_hidden_state is DecoderLM.encode's (after the final norm) at every real position
        hidden = model.base(input_ids=x, attention_mask=mask).last_hidden_state
    assert (hidden - body.encode(x))[mask.bool()].abs().max().item() < 1e-5
    assert theirs.shape == (3, 3) and (theirs - mine).abs().max().item() < 1e-5
    assert (model(x[:1]) - head(body.encode(x[:1]))).abs().max().item() < 1e-5  # no mask: the last position


def test_question_answering_and_first_token_heads_are_refused(tmp_path):
    body = decoder("llama")
    with pytest.raises(ConfigError, match="question-answering decoder"):
        task_to_hf(body, SpanHead(body.cfg.hidden), [], True, tmp_path / "qa")
    with pytest.raises(ConfigError, match="last token"):
        task_to_hf(body, ClassificationHead(body.cfg.hidden, 2, 0.0, "first"), ["x", "y"], False, tmp_path / "cls")
    assert not (tmp_path / "qa").exists()
    with pytest.raises(FileNotFoundError, match=HEAD_CONFIG):
        load_task_model(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_a_finetuned_decoder_exports_and_predicts_what_evaluate_saved(tmp_path, prepared, corpus_dir, style,
                                                                      monkeypatch):
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.data.task_features import pad_collate
    from minimodel.data.tasks import TaskData
    from minimodel.experiment import load_experiment
    from minimodel.export import PROVENANCE, adapted_embeddings
    from minimodel.models.surgery import plug_embeddings
    from minimodel.store.checkpoints import load_finetuned
    from minimodel.store.layout import finetuned_model
    from minimodel.systems import stage_plan

    # hf_decoder's `from minimodel.models.decoder_task import task_to_hf` (raising=False: the test holds with it or not)
    monkeypatch.setattr(minimodel.models.hf_decoder, "task_to_hf", task_to_hf, raising=False)
    args = [a for a in run_args(tmp_path, corpus_dir, prepared) if a not in LLAMA]
    args = [*args, *(LLAMA if style == "llama" else GPT2), "sweep=[]", "system=bl_base"]
    experiment = str(ROOT / "experiments" / "demo.yaml")
    assert main(["run", experiment, *args, "--no-progress"]) == 0
    out = tmp_path / "de-lohelp"
    assert main(["export", experiment, *args, "lang=de", "task=lohelp", "seed=1", "--out", str(out)]) == 0
    provenance = json.loads((out / PROVENANCE).read_text())
    assert (provenance["kind"], provenance["task"], provenance["lang"]) == ("text-classification", "lohelp", "de")

    model = load_task_model(out)  # transformers and torch only
    tok = transformers.AutoTokenizer.from_pretrained(out)
    cfg = load_experiment(experiment, [*args, "lang=de"])
    data = TaskData("lohelp", cfg.tasks["lohelp"])
    records = data.records("test", "de")
    features = data.features(records, load_prepared_tokenizer(cfg, "de"))
    assert model.labels == list(data.labels)
    texts = [r["text"] for r in records]
    batch = tok(texts, padding=True, truncation=True, max_length=cfg.tasks["lohelp"].max_len, return_tensors="pt")
    assert [row[row != tok.pad_token_id].tolist() for row in batch["input_ids"]] == [f["input_ids"] for f in features]

    body, head, _ = load_finetuned(finetuned_model(stage_plan(cfg, "adapt").runs.finetune("lohelp", 1)))
    emb = adapted_embeddings(cfg)
    assert emb.adapted.step == provenance["step"] == 4
    plug_embeddings(body, emb.adapted, emb.tokenizer.sha256, emb.tokenizer.vocab_size)
    body.eval(), head.eval()
    ours = pad_collate(features, body.cfg.pad_id)
    assert torch.equal(ours["input_ids"], batch["input_ids"]) and torch.equal(ours["attention_mask"],
                                                                            batch["attention_mask"])
    with torch.no_grad():
        theirs = model(batch["input_ids"], batch["attention_mask"])
        mine = head(body.encode(ours["input_ids"]), ours["attention_mask"])
    assert len(records) > 20 and (theirs - mine).abs().max().item() < 1e-5

    r = stage_plan(cfg, "evaluate").runs
    saved = r.layout.predictions(r.label, "lohelp", "de", 1, 4)
    rows = [json.loads(line) for line in Path(saved).read_text().splitlines()]
    assert [model.labels[i] for i in theirs.argmax(-1).tolist()] == [row["predicted"] for row in rows]
    probabilities = torch.tensor([[row["probabilities"][label] for label in model.labels] for row in rows])
    assert (theirs.softmax(-1) - probabilities).abs().max().item() < 1e-5  # saved rounded to 6 digits
