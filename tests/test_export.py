"""Export to transformers: the fast tokenizer gives our SentencePiece ids, the exported masked LM gives our logits,
the exported classifier our predictions (and the accuracy `minimodel evaluate` wrote), and an embeddings-only
export plugs into the primary model to the same result."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from minimodel.cli import main
from minimodel.data.prepare import load_prepared_tokenizer
from minimodel.data.tokenizer import Tokenizer
from minimodel.experiment import load_experiment
from minimodel.export import PROVENANCE, adapted_embeddings, load_artifact
from minimodel.models.hf import fast_tokenizer
from minimodel.models.surgery import plug_embeddings
from minimodel.stages.bridge import load_primary
from minimodel.systems import stage_plan
from tests.conftest import ROOT, real_text, tiny_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

LOHELP = ROOT / "data" / "demo" / "task" / "lohelp"


def texts(lang: str) -> list[str]:
    """Bundled German / Turkish text: the task's test pages and a slice of the corpus, line by line."""
    task = [json.loads(line)["text"] for line in (LOHELP / f"test.{lang}.jsonl").read_text().splitlines()]
    return task + [line for line in real_text(lang, 60_000).splitlines() if line.strip()]


def score(tok: Tokenizer, ids: list[int]) -> float:
    return sum(tok.sp.get_score(i) for i in ids)


@pytest.mark.parametrize("lang", ["de", "tr"])
def test_the_fast_tokenizer_gives_our_ids(prepared, corpus_dir, lang):
    """Every text gets our ids, but for ties between equally scored segmentations (SentencePiece and
    ``tokenizers`` break a tie of the Viterbi search differently: "…." as "...", "." or ".", "..."): then both
    spell the same pieces' text with the same score."""
    ours = load_prepared_tokenizer(tiny_config(prepared, corpus_dir, prepared=prepared), lang)
    hf = fast_tokenizer(ours.path, 510)
    lines = texts(lang)
    ties = 0
    for text in lines:
        mine, theirs = ours.encode_one(text), hf(text, add_special_tokens=False)["input_ids"]
        if mine != theirs:
            ties += 1
            assert ours.decode(mine) == ours.decode(theirs) and score(ours, mine) == pytest.approx(score(ours, theirs))
    assert len(lines) > 500 and ties <= len(lines) // 200, f"{ties} of {len(lines)} differ"
    pair = hf("Eins zwei", "drei")["input_ids"]
    assert pair == [0, *ours.encode_one("Eins zwei"), 2, 2, *ours.encode_one("drei"), 2]  # RoBERTa's template
    assert [hf.bos_token_id, hf.pad_token_id, hf.eos_token_id, hf.unk_token_id, hf.mask_token_id] == [0, 1, 2, 3, 4]


def test_the_exported_masked_lm_gives_our_logits(tiny_finetuned, tmp_path):
    tmp, cfg, args = tiny_finetuned
    out = tmp_path / "de-mlm"
    assert main(["export", *args, "lang=de", "--out", str(out)]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(model).__name__ == "RobertaForMaskedLM"
    lang_cfg = load_experiment(args[0], [*args[1:], "lang=de"])
    emb = adapted_embeddings(lang_cfg)
    assert emb.adapted.step == 8
    ours, _ = load_primary(stage_plan(lang_cfg, "adapt").runs.primary)
    plug_embeddings(ours, emb.adapted, emb.tokenizer.sha256, emb.tokenizer.vocab_size)
    ours.eval()
    sentences = texts("de")[:8]
    batch = tok(sentences, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        theirs = model(**batch).logits
        mine = ours.mlm_logits(batch["input_ids"])
    real = batch["attention_mask"].bool()
    assert (theirs[real] - mine[real]).abs().max().item() < 1e-5
    provenance = json.loads((out / PROVENANCE).read_text())
    assert (provenance["system"], provenance["lang"], provenance["step"], provenance["kind"]) == (
        "bl_base", "de", 8, "fill-mask")
    assert emb.adapted.flops > 0 and provenance["flops"] == pytest.approx(emb.adapted.flops)
    filled = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out))("Wählen Sie<mask>.")
    assert len(filled) == 5 and all("token_str" in f for f in filled)

    # an earlier step, a step that is not there, an --out that holds other files
    assert main(["export", *args, "lang=de", "step=4", "--out", str(tmp_path / "step4")]) == 0
    assert json.loads((tmp_path / "step4" / PROVENANCE).read_text())["step"] == 4
    assert main(["export", *args, "lang=de", "step=5", "--out", str(tmp_path / "x")]) == 2
    assert main(["export", *args, "lang=de", "--out", str(out)]) == 2  # not empty: nothing replaced
    assert main(["export", *args, "lang=de", "--out", str(out), "--force"]) == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["export", *args, "lang=de", "--out", str(tmp_path / "mine"), "--force"]) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_the_exported_classifier_predicts_what_evaluate_scored(tiny_finetuned, tmp_path):
    from minimodel.data.tasks import TaskData

    tmp, cfg, args = tiny_finetuned
    out = tmp_path / "de-cls"
    assert main(["export", *args, "lang=de", "task=lohelp", "seed=1", "--out", str(out)]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    data = TaskData("lohelp", cfg.tasks["lohelp"])
    assert list(model.config.id2label.values()) == list(data.labels)
    records = data.records("test", "de")
    from minimodel.store.checkpoints import load_finetuned
    from minimodel.store.layout import finetuned_model

    body, head, _ = load_finetuned(finetuned_model(stage_plan(cfg, "adapt").runs.finetune("lohelp", 1)))
    emb = adapted_embeddings(load_experiment(args[0], [*args[1:], "lang=de"]))
    plug_embeddings(body, emb.adapted, emb.tokenizer.sha256, emb.tokenizer.vocab_size)
    body.eval(), head.eval()
    predicted, gap = [], 0.0
    for i in range(0, len(records), 64):
        chunk = [r["text"] for r in records[i:i + 64]]
        batch = tok(chunk, padding=True, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            theirs = model(**batch).logits
            gap = max(gap, (theirs - head(body.encode(batch["input_ids"]))).abs().max().item())
        predicted += theirs.argmax(-1).tolist()
    assert gap < 1e-5
    gold = [f["label"] for f in data.features(records, load_prepared_tokenizer(cfg, "de"))]
    accuracy = 100.0 * sum(p == g for p, g in zip(predicted, gold)) / len(gold)
    from minimodel.store.results import ResultsTable

    rows = ResultsTable(Path(cfg.runs_dir) / cfg.name / "bl_base" / "results.jsonl").rows()
    final, = [r["value"] for r in rows if (r["lang"], r["seed"], r["step"], r["metric"]) == ("de", 1, 8, "accuracy")]
    assert accuracy == pytest.approx(final, abs=1e-4)  # evaluate's is a float32
    label = transformers.pipeline("text-classification", model=str(out), tokenizer=str(out))(records[0]["text"], truncation=True)
    assert label[0]["label"] in data.labels


def test_embeddings_alone_plug_into_the_primary_model(tiny_finetuned, tmp_path):
    tmp, cfg, args = tiny_finetuned
    art = tmp_path / "de-embeddings"
    assert main(["export", *args, "lang=de", "--embeddings-only", "--out", str(art)]) == 0
    assert sorted(p.name for p in art.iterdir()) == ["embeddings.pt", "minimodel.json", "sentencepiece.model"]
    assert sum(p.stat().st_size for p in art.iterdir()) < 600_000
    emb = load_artifact(art)
    assert (emb.adapted.lang, emb.adapted.step, emb.tokenizer.vocab_size) == ("de", 8, 1000)
    direct, plugged = tmp_path / "direct", tmp_path / "plugged"
    assert main(["export", *args, "lang=de", "--out", str(direct)]) == 0
    assert main(["export", *args, "--embeddings", str(art), "--out", str(plugged)]) == 0
    a = transformers.AutoModelForMaskedLM.from_pretrained(direct).state_dict()
    b = transformers.AutoModelForMaskedLM.from_pretrained(plugged).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (direct / "tokenizer.json").read_text() == (plugged / "tokenizer.json").read_text()
    assert main(["export", *args, "--embeddings", str(tmp_path / "nothing"), "--out", str(tmp_path / "y")]) == 2


def named_offline_runs(directory: Path, names: list[str], timeout: float = 60.0) -> dict[str, list[Path]]:
    """``wandb_results.offline_runs`` once every run in ``directory`` is named, whole (its exit record written) and
    ``names`` are all there: on a busy machine wandb's service may still be writing a run's transaction log when
    ``finish`` has returned (CI runs read an unnamed ``offline-run-*``, and a half-written record, there)."""
    from minimodel.store.wandb_results import finished, offline_runs

    end = time.monotonic() + timeout
    while True:
        found = offline_runs(directory)
        if (set(names) <= set(found) and not any(k.startswith("offline-run-") for k in found)
                and all(finished(d) for dirs in found.values() for d in dirs)):
            return found
        if time.monotonic() > end:
            return found  # the caller's assertion shows what was there
        time.sleep(0.5)


def test_an_export_whose_tokenizer_autotokenizer_would_replace_is_refused(prepared, corpus_dir, tmp_path):
    """Beside a qwen2 config, transformers' AutoTokenizer builds Qwen2's own BPE whatever tokenizer the directory
    holds: an export checks its tokenizer as users load it, and refuses one that would encode differently."""
    import transformers

    from minimodel.export import PlugError, _check_auto_tokenizer

    ours = load_prepared_tokenizer(tiny_config(prepared, corpus_dir, prepared=prepared), "de")
    fast = fast_tokenizer(ours.path, 64, causal=True)
    for kind in ("llama", "qwen2"):
        fast.save_pretrained(tmp_path / kind)
        getattr(transformers, {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}[kind])().save_pretrained(tmp_path / kind)
    _check_auto_tokenizer(tmp_path / "llama", fast)
    with pytest.raises(PlugError, match="Qwen2Tokenizer.*encodes"):
        _check_auto_tokenizer(tmp_path / "qwen2", fast)


def test_results_on_wandb_offline_read_back(tiny_finetuned, tmp_path, monkeypatch):
    """A tiny evaluation and report with wandb offline: the runs' logged values, read back from wandb's own
    transaction logs, are the results rows; the report run holds the report's tables."""
    from minimodel.store.results import ResultsTable
    from minimodel.store.wandb_results import finished, read_history

    monkeypatch.setenv("WANDB_MODE", "offline")
    for k in ("WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    tmp, cfg, args = tiny_finetuned
    runs_dir = tmp_path / "runs"
    shutil.copytree(Path(cfg.runs_dir), runs_dir, ignore=shutil.ignore_patterns("results.jsonl", "wandb"))
    wb = [*args, f"runs_dir={runs_dir}", "logging.wandb=offline"]
    assert main(["evaluate", *wb]) == 0
    results = runs_dir / cfg.name / "bl_base"
    rows = ResultsTable(results / "results.jsonl").rows()
    expected = [f"bl_base:lohelp:{lang}:s{seed}" for lang in ("de", "en", "tr") for seed in (1, 2)]
    found = named_offline_runs(results, expected)
    assert sorted(found) == sorted(f"bl_base:lohelp:{lang}:s{seed}" for lang in ("de", "en", "tr") for seed in (1, 2))
    history, _ = read_history(found["bl_base:lohelp:de:s1"][0])
    logged = [h for h in history if "lohelp/de/accuracy" in h]
    zero_shot = [r for r in rows if r["step"] >= 0 and r["lang"] == "de" and r["seed"] == 1]
    assert len(logged) == len(zero_shot) == 3  # steps 0, 4, 8
    for h, r in zip(logged, zero_shot):
        assert (h["lohelp/de/accuracy"], h["lohelp/de/adapt_step"]) == (pytest.approx(r["value"]), r["step"])
        assert h["lohelp/de/v100_days"] == pytest.approx(r["v100_days"]) and h["lohelp/de/flops"] == pytest.approx(r["flops"])
    _, summary = read_history(found["bl_base:lohelp:en:s1"][0])
    english = {f"lohelp/en/primary/{r['split']}/{r['metric']}": r["value"] for r in rows
               if r["step"] < 0 and r["seed"] == 1}
    assert english and all(summary[k] == pytest.approx(v) for k, v in english.items())
    table = next(h for h in history if "results/path" in h)
    data = json.loads((found["bl_base:lohelp:de:s1"][0] / "files" / table["results/path"]).read_text())
    columns = data["columns"]
    assert sorted(tuple(dict(zip(columns, row)).items()) for row in data["data"]) == sorted(
        tuple(sorted(r.items())) for r in zero_shot)

    assert main(["report", *wb]) == 0
    report = named_offline_runs(runs_dir / cfg.name, ["report"])
    assert list(report) == ["report"]
    history, _ = read_history(report["report"][0])
    keys = {k.split("/")[1] for h in history for k in h if k.startswith("tables/")}
    assert any("Table 2" in k or "Table_2" in k for k in keys), keys
    assert any(k.startswith("plots/") for h in history for k in h)

    # a log read while wandb's service is still writing its last record: what is whole is read, the run is not finished
    torn = tmp_path / "torn"
    shutil.copytree(report["report"][0], torn)
    log = next(torn.glob("run-*.wandb"))
    whole = log.read_bytes()
    assert finished(torn)
    for cut in (len(whole) - 3, len(whole) - 40):
        log.write_bytes(whole[:cut])
        assert not finished(torn)
        assert read_history(torn)[0] == history  # the cut falls in the summary/exit tail, after the history
    log.write_bytes(whole[:-3] + bytes([whole[-3] ^ 0xFF]) + whole[-2:])  # same length, a byte changed
    assert not finished(torn)


def test_a_question_answering_model_exports_with_its_span_head(tmp_path):
    """``task_to_hf`` with a QA head: RobertaForQuestionAnswering gives our start and end logits."""
    from minimodel.config.schema import ModelConfig
    from minimodel.models.hf import task_to_hf
    from minimodel.models.model import RobertaMLM, SpanHead

    torch.manual_seed(0)
    body = RobertaMLM(ModelConfig(vocab_size=60, hidden=32, layers=2, heads=2, ffn=64, max_positions=40)).eval()
    head = SpanHead(32).eval()
    with torch.no_grad():
        head.out.weight.normal_(0, 0.5)
    task_to_hf(body, head, [], True, tmp_path / "qa")
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa").eval()
    assert type(model).__name__ == "RobertaForQuestionAnswering"
    ids = torch.tensor([[0, 7, 8, 9, 2, 2, 11, 12, 13, 14, 2], [0, 5, 6, 2, 2, 15, 16, 2, 1, 1, 1]])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=(ids != 1).long())
        start, end = head(body.encode(ids))
    real = ids != 1
    assert (out.start_logits - start)[real].abs().max() < 1e-5 and (out.end_logits - end)[real].abs().max() < 1e-5
