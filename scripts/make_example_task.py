"""Write a small task of your own kind for trying `minimodel` with a task that is not the bundled one.

    python scripts/make_example_task.py data/mytask [--train 1500 --test 300]

From the bundled LibreOffice-help task it makes a binary, imbalanced task in CSV files with column names of
their own: "is this paragraph about Calc?" (``passage``, ``about_calc`` = yes / no, 80% no), with train.csv,
dev.csv and test.{en,de,tr}.csv (the test pages' translations). docs/own-task.md runs it."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

LOHELP = Path(__file__).resolve().parent.parent / "data" / "demo" / "task" / "lohelp"
SPLITS = {"train.csv": "train.jsonl", "dev.csv": "dev.jsonl", "test.en.csv": "test.en.jsonl",
          "test.de.csv": "test.de.jsonl", "test.tr.csv": "test.tr.jsonl"}


def write_task(out: Path, train: int, test: int, yes_share: float = 0.2) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for dst, src in SPLITS.items():
        limit = train if dst == "train.csv" else test
        records = [json.loads(line) for line in (LOHELP / src).read_text(encoding="utf-8").splitlines() if line.strip()]
        yes = [r for r in records if r["label"] == "scalc"][: round(limit * yes_share)]
        no = [r for r in records if r["label"] != "scalc"][: limit - len(yes)]
        with open(out / dst, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["passage", "about_calc"])
            w.writerows([[r["text"], "yes" if r["label"] == "scalc" else "no"] for r in no + yes])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--train", type=int, default=1500, help="training examples (default 1500)")
    p.add_argument("--test", type=int, default=300, help="examples per dev / test file (default 300)")
    a = p.parse_args()
    write_task(a.out, a.train, a.test)
    print(f"wrote {', '.join(SPLITS)} to {a.out}")


if __name__ == "__main__":
    main()
