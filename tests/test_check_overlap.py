"""scripts/check_overlap.py names the examples of a task's dev/test files whose text is in the adaptation corpus (their
place in the file, their id and the corpus lines holding the text), and writes the task without them on request,
never over an existing directory (issue 55, part 5)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from check_overlap import find_overlaps, main, overlap  # noqa: E402

from minimodel.data.task_files import read_records  # noqa: E402

SEEN = "Die Datei wird beim Start des Dienstes gelesen und danach nicht mehr geändert."
ALSO = "Der Befehl gibt die Version aus und beendet sich danach ohne weitere Ausgabe."
NEW = "Ein ganz neuer Satz, den das Korpus nicht enthält, lang genug für die Prüfung."


@pytest.fixture()
def task(tmp_path: Path) -> tuple[Path, Path]:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # SEEN spans corpus lines 3-4 (a line break and a doubled space inside it); ALSO is line 6, after a blank line
    (corpus / "de.txt").write_text("Ein anderer Satz.\n\n" + SEEN.replace(" des ", "  des\n") + "\n\n" + ALSO + "\n")
    task = tmp_path / "task"
    task.mkdir()
    rows = [{"id": "q1", "text": SEEN, "label": "a"}, {"id": "q2", "text": NEW, "label": "b"},
            {"id": "q3", "text": "kurz", "label": "a"}, {"id": "q4", "text": ALSO, "label": "b"}]
    (task / "test.de.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    with open(task / "dev.de.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["id", "text", "label"])
        w.writeheader()
        w.writerows([rows[1], rows[3]])
    (task / "train.jsonl").write_text(json.dumps(rows[0]) + "\n")  # not checked: copied as it is
    return task, corpus


def test_each_overlapping_example_is_named_with_its_id_and_corpus_lines(task, capsys):
    task_dir, corpus = task
    assert overlap(task_dir, corpus, ["text"], 40) == [("dev.de.csv", 1, 2), ("test.de.jsonl", 2, 3)]
    found = {f.id: f for _, fs, _ in find_overlaps(task_dir, corpus, ["text"], 40) for f in fs}
    assert set(found) == {"q1", "q4"}
    assert (found["q1"].where, found["q1"].lines, found["q1"].corpus) == ("line 1", (3, 4), "de.txt")
    assert found["q4"].lines == (6, 6)
    assert main([str(task_dir), str(corpus)]) == 0
    out = capsys.readouterr().out
    assert "test.de.jsonl: 2 of 3 examples (66.7%) have a text field found verbatim in the corpus" in out
    assert f'  test.de.jsonl line 1 (id q1): de.txt lines 3-4: "{SEEN}"' in out
    assert f'  test.de.jsonl line 4 (id q4): de.txt line 6: "{ALSO}"' in out
    assert f'  dev.de.csv line 3 (id q4): de.txt line 6: "{ALSO}"' in out


def test_write_clean_writes_the_task_without_them_and_never_over_a_directory(task, tmp_path, capsys):
    task_dir, corpus = task
    clean = tmp_path / "clean"
    assert main([str(task_dir), str(corpus), "--write-clean", str(clean)]) == 0
    assert "wrote " + str(clean) in capsys.readouterr().out
    ids = {name: [r["id"] for _, r in read_records(clean / name)] for name in ("test.de.jsonl", "dev.de.csv")}
    assert ids == {"test.de.jsonl": ["q2", "q3"], "dev.de.csv": ["q2"]}
    assert (clean / "train.jsonl").read_bytes() == (task_dir / "train.jsonl").read_bytes()
    assert overlap(clean, corpus, ["text"], 40) == [("dev.de.csv", 0, 1), ("test.de.jsonl", 0, 1)]
    before = (clean / "test.de.jsonl").read_bytes()
    assert main([str(task_dir), str(corpus), "--write-clean", str(clean)]) == 2  # exists: refused, untouched
    assert "exists" in capsys.readouterr().err
    assert (clean / "test.de.jsonl").read_bytes() == before
