"""The bag-of-words reference (minimodel/data/bag_of_words.py): what it learns, what it ignores, its ties and errors."""

import pytest

from minimodel.data.bag_of_words import BagOfWords, words


def test_words_are_lower_cased_in_every_script() -> None:
    assert words("Athens, ΑΘΗΝΑ and Москва 2024!") == ["athens", "αθηνα", "and", "москва", "2024"]


def test_it_learns_which_words_go_with_which_label() -> None:
    texts = ["the match and the goal", "a goal in the match", "the election and the vote", "a vote in parliament"]
    bow = BagOfWords.fit(texts, [0, 0, 1, 1], 2)
    assert bow.predict("what a goal") == 0
    assert bow.predict("parliament vote") == 1


def test_unknown_words_fall_back_to_the_prior() -> None:
    bow = BagOfWords.fit(["a b", "a c", "d e"], [1, 1, 0], 2)
    assert bow.scores("ζζζ ωω") == list(bow.log_prior)
    assert bow.predict("ζζζ ωω") == 1  # the majority class


def test_a_tie_goes_to_the_lowest_label() -> None:
    bow = BagOfWords.fit(["x", "y"], [0, 1], 2)
    assert bow.predict("nothing known") == 0


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="2 texts and 1 labels"):
        BagOfWords.fit(["a", "b"], [0], 2)
    with pytest.raises(ValueError, match="alpha"):
        BagOfWords.fit(["a"], [0], 1, alpha=0)


def test_scored_text_leaves_out_ignored_positions_and_special_tokens() -> None:
    from minimodel.models.model import IGNORE_INDEX
    from minimodel.stages.perplexity import HeldOut, scored_text

    class Tok:
        class specials:  # noqa: N801 - the tokenizer protocol's attribute
            ids = (0, 1, 2)

        @staticmethod
        def decode(ids):
            return "".join(chr(ord("a") + i) for i in ids)

    assert scored_text(Tok, [IGNORE_INDEX, 5, 0, 6, 2, IGNORE_INDEX]) == "fg"
    assert HeldOut(loss=2.0, tokens=3, chars=12).per_char == 0.5
