"""A training subset (``tasks.T.max_train_examples``) is a seeded draw stratified by label, logged per label, and the
majority-class baseline is that of the examples step 3 uses (issue 44: a file grouped by label once gave 3 of 6
classes with the first-N rule)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from minimodel.config.schema import TaskConfig
from minimodel.data.tasks import TaskData, majority_baseline, subset_indices
from minimodel.errors import TaskDataError
from minimodel.stages.finetune import log_training_subset


def sorted_task(root: Path, counts: dict[str, int]) -> Path:
    """A local task whose training file is grouped by label (a natural way to write one): ``counts`` in that order."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"{label}{i}", "text": f"{label} text number {i}", "label": label}
            for label, n in counts.items() for i in range(n)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    test = [{"id": f"t{label}{i}", "text": f"{label} test {i}", "label": label} for label in counts for i in range(10)]
    for name in ("dev.jsonl", "test.en.jsonl", "test.de.jsonl"):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in test))
    return root


def task(root: Path, n: int, how: str = "stratified") -> TaskData:
    return TaskData("mytask", TaskConfig(kind="local", source=str(root), max_train_examples=n, train_subset=how,
                                         metrics=["accuracy", "macro_f1"]))


def test_the_draw_is_proportional_to_each_label_seeded_and_in_file_order():
    labels = [0] * 600 + [1] * 300 + [2] * 97 + [3] * 3
    chosen = subset_indices(labels, len(labels), 100)
    assert chosen == sorted(chosen) == subset_indices(labels, len(labels), 100)  # file order, the same every time
    # shares 60, 30, 9.7, 0.3: every label gets one at least, which leaves no room for 9.7's remainder
    assert Counter(labels[i] for i in chosen) == {0: 60, 1: 30, 2: 9, 3: 1}
    assert chosen != subset_indices(labels, len(labels), 100, seed=1)
    assert len(set(chosen)) == 100 and chosen[:5] != list(range(5))  # a draw within each label, not its first rows


@pytest.mark.parametrize("n", [4, 5, 7, 50, 999])
def test_every_label_is_drawn_and_the_size_is_exact(n):
    labels = [0] * 900 + [1] * 97 + [2] * 2 + [3]
    chosen = subset_indices(labels, len(labels), n)
    assert len(chosen) == n and set(labels[i] for i in chosen) == {0, 1, 2, 3}


def test_qa_without_labels_is_a_seeded_uniform_draw():
    assert subset_indices(None, 50, 10) == subset_indices(None, 50, 10) != list(range(10))


def test_a_file_grouped_by_label_gives_every_label_and_its_majority(tmp_path, caplog):
    root = sorted_task(tmp_path / "mytask", {"a": 300, "b": 600, "c": 100})
    data = task(root, 100)
    used = data.train_records()
    assert Counter(data.labels[r["label"]] for r in used) == {"a": 30, "b": 60, "c": 10}
    with caplog.at_level(logging.INFO, logger="minimodel"):
        log_training_subset(data, used)
    assert "100 training examples (a subset of max_train_examples=100, stratified by label (seed 0)): a 30, b 60, c 10" \
        in caplog.text
    # the first-N rule on this file: only label a, said loudly; the majority baseline is a's, the class it saw
    first = task(root, 300, "first")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minimodel"):
        log_training_subset(first, first.train_records())
    assert [r.levelname for r in caplog.records if "no training example of label(s) b, c" in r.getMessage()] == \
        ["WARNING"]
    assert majority_baseline(first, ["de"])["de"]["accuracy"] == pytest.approx(100 / 3)
    assert majority_baseline(data, ["de"])["de"]["accuracy"] == pytest.approx(100 / 3)  # b: its majority, on the draw
    assert len(task(root, 0).train_records()) == len(task(root, 5000).train_records()) == 1000  # 0, or more: all


def test_fewer_examples_than_labels_is_refused_by_name(tmp_path):
    root = sorted_task(tmp_path / "mytask", {"a": 10, "b": 10, "c": 10})
    with pytest.raises(TaskDataError, match=r"tasks\.mytask\.max_train_examples=2 is fewer than the 3 labels"):
        task(root, 2).train_records()


def test_an_unknown_subset_rule_is_refused_at_load(tmp_path, corpus_dir):
    from minimodel.errors import ConfigError
    from tests.conftest import tiny_config

    with pytest.raises(ConfigError, match=r"tasks\.lohelp\.train_subset must be 'stratified' or 'first'"):
        tiny_config(tmp_path, corpus_dir, "tasks.lohelp.train_subset=random")


def test_a_step_that_never_ran_is_not_called_unfinished(tmp_path, tiny_finetuned, capsys):
    """Exporting or evaluating a language never adapted (issue 44): the message says the step never ran, not that
    rerunning it resumes it."""
    from minimodel.cli import main
    from minimodel.store.provenance import require_finished

    with pytest.raises(Exception, match=r"does not exist: that step never ran; run `minimodel adapt \.\.\. lang=fr` "):
        require_finished(tmp_path / "adapt" / "fr", "the adaptation of fr", "minimodel adapt ... lang=fr")
    (tmp_path / "adapt" / "fr").mkdir(parents=True)
    with pytest.raises(Exception, match=r"is not finished .*rerun `minimodel adapt \.\.\. lang=fr` to resume it"):
        require_finished(tmp_path / "adapt" / "fr", "the adaptation of fr", "minimodel adapt ... lang=fr")
    _, _, args = tiny_finetuned
    assert main(["export", *args, "lang=fr", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "adapt/fr does not exist: that step never ran" in err, err


def test_the_overlap_check_counts_test_text_found_verbatim_in_the_corpus(tmp_path):
    """scripts/check_overlap.py, which docs/own-task.md points to for a task built from text the bundled corpora
    may hold (Debian's, Wikipedia's)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from check_overlap import overlap

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seen = "Die Datei wird beim Start des Dienstes gelesen und danach nicht mehr geändert."
    wrapped = seen.replace(" des ", "  des\n")  # the corpus breaks the line and doubles a space
    (corpus / "de.txt").write_text("Ein anderer Satz.\n" + wrapped + "\nNoch einer.\n")
    task = tmp_path / "task"
    task.mkdir()
    rows = [{"text": seen, "label": "a"}, {"text": "Ein ganz neuer Satz, den das Korpus nicht enthält, lang genug.",
                                           "label": "b"}, {"text": "kurz", "label": "a"}]
    (task / "test.de.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (task / "test.tr.jsonl").write_text(json.dumps(rows[0]) + "\n")  # no Turkish corpus: not checked
    assert overlap(task, corpus, ["text"], 40) == [("test.de.jsonl", 1, 2)]  # spacing and line breaks aside
