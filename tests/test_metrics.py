"""SQuAD v1.1 / MLQA exact match and F1 on hand-computed cases, and accuracy."""

from __future__ import annotations

import pytest
import torch

from minimodel.metrics import accuracy, mixed_segmentation, mlqa_normalize, mlqa_scores, squad_normalize, squad_scores


def test_squad_normalisation() -> None:
    assert squad_normalize("The  Eiffel Tower!") == ["eiffel", "tower"]
    assert squad_normalize("an apple, a pear & the plum") == ["apple", "pear", "plum"]
    assert squad_normalize("theatre (anthem)") == ["theatre", "anthem"]  # articles only as whole words
    assert squad_normalize("巴黎。") == ["巴黎。"]  # ASCII punctuation only


def test_squad_scores() -> None:
    assert squad_scores({"q": "the Eiffel Tower!"}, {"q": ["Eiffel tower"]}) == {"exact_match": 100.0, "f1": 100.0}
    # pred {big, red, barn} vs gold {red, barn, near, river}: P = 2/3, R = 2/4, F1 = 4/7
    partial = squad_scores({"q": "the big red barn"}, {"q": ["red barn near the river"]})
    assert partial["exact_match"] == 0.0 and partial["f1"] == pytest.approx(100 * 4 / 7)
    # best gold answer per question; a question without a prediction scores 0; extra predictions are ignored
    scores = squad_scores({"a": "Black Sea", "b": "Volga river", "x": "ignored"},
                          {"a": ["into the Black Sea", "the Black Sea"], "b": ["Danube"], "c": ["Rhine"]})
    assert scores["exact_match"] == pytest.approx(100 / 3) and scores["f1"] == pytest.approx(100 / 3)
    # shared tokens count with multiplicity: pred [x, x, y] and gold [x, y, y] share 2 of 3
    assert squad_scores({"q": "x x y"}, {"q": ["x y y"]})["f1"] == pytest.approx(100 * 2 / 3)
    with pytest.raises(ValueError, match="no reference answers"):
        squad_scores({}, {})


def test_mlqa_german_articles() -> None:
    assert mlqa_normalize("Der Rhein", "de") == ["rhein"]
    assert mlqa_normalize("in die Nordsee", "de") == ["in", "nordsee"]
    assert mlqa_normalize("dessen Ende", "de") == ["dessen", "ende"]  # whole words only
    assert mlqa_scores({"q": "die Nordsee"}, {"q": ["Nordsee"]}, "de")["exact_match"] == 100.0
    english = mlqa_scores({"q": "die Nordsee"}, {"q": ["Nordsee"]}, "en")
    assert english == {"exact_match": 0.0, "f1": pytest.approx(100 * 2 / 3)}


def test_mlqa_chinese_characters() -> None:
    assert mixed_segmentation("建于1889年 hello world") == ["建", "于", "1889", "年", "hello", "world"]
    assert mlqa_normalize("明朝，（1368年）", "zh") == ["明", "朝", "1368", "年"]  # unicode punctuation removed
    # pred 明朝时期 vs gold 明朝: P = 2/4, R = 2/2, F1 = 2/3; as single SQuAD tokens they share nothing
    assert mlqa_scores({"q": "明朝时期"}, {"q": ["明朝"]}, "zh") == {"exact_match": 0.0, "f1": pytest.approx(200 / 3)}
    assert squad_scores({"q": "明朝时期"}, {"q": ["明朝"]})["f1"] == 0.0
    assert mlqa_scores({"q": "嘉峪关。"}, {"q": ["嘉峪关"]}, "zh")["exact_match"] == 100.0


def test_mlqa_spanish_arabic_and_others() -> None:
    assert mlqa_normalize("¿La casa de los abuelos?", "es") == ["casa", "de", "abuelos"]  # ¿ is unicode punctuation
    assert mlqa_scores({"q": "el río Ebro"}, {"q": ["río Ebro"]}, "es")["exact_match"] == 100.0
    # Arabic: the article ال is removed wherever it occurs, as in the official script
    assert mlqa_normalize("الكتاب", "ar") == ["كتاب"]
    assert mlqa_normalize("في المدينة القديمة", "ar") == ["في", "مدينة", "قديمة"]
    assert mlqa_scores({"q": "المكتبة"}, {"q": ["مكتبة"]}, "ar")["exact_match"] == 100.0
    assert mlqa_normalize("những cuốn sách", "vi") == ["cuốn", "sách"]
    assert mlqa_normalize("the नई दिल्ली।", "hi") == ["the", "नई", "दिल्ली"]  # no articles; danda is punctuation
    with pytest.raises(ValueError, match="no rules for language 'fr'"):
        mlqa_scores({"q": "la"}, {"q": ["la"]}, "fr")


def test_accuracy() -> None:
    target = torch.tensor([0, 1, 2, 1])
    assert accuracy(torch.tensor([0, 1, 1, 1]), target, num_classes=3) == 75.0
    logits = torch.tensor([[2.0, 0, 0], [0, 1, 0], [0, 0, 3], [1, 0, 0]])
    assert accuracy(logits, target, num_classes=3) == 75.0
