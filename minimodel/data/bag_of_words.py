"""An input-level reference for a classification task: a multinomial naive Bayes bag-of-words classifier trained on
the English training set and applied unchanged to every language. What it scores in a target language is what word
overlap alone with English (names, numbers, cognates, loanwords) can give: an adapted model that does not beat it
has learned nothing from the target language that string matching does not. Deterministic (no seed); pure Python."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """Lower-cased word tokens (Unicode letters, digits and underscore): the same rule for every script."""
    return WORD.findall(text.lower())


@dataclass(frozen=True)
class BagOfWords:
    """Multinomial naive Bayes over word counts, with add-``alpha`` smoothing. Words it never saw in training are
    ignored; a text with none of its words scores by the class priors alone (the majority class)."""

    log_prior: tuple[float, ...]
    log_likelihood: dict[str, tuple[float, ...]]  # word -> log P(word | class), per class

    @classmethod
    def fit(cls, texts: Sequence[str], labels: Sequence[int], n_labels: int, alpha: float = 1.0) -> BagOfWords:
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"bag of words: {len(texts)} texts and {len(labels)} labels (need as many, at least one)")
        if alpha <= 0:
            raise ValueError(f"bag of words: alpha must be > 0, got {alpha}")
        counts = [Counter() for _ in range(n_labels)]
        docs = Counter(labels)
        for text, label in zip(texts, labels):
            counts[label].update(words(text))
        vocabulary = sorted(set().union(*counts))
        totals = [sum(c.values()) + alpha * len(vocabulary) for c in counts]
        prior = tuple(math.log((docs[k] + alpha) / (len(labels) + alpha * n_labels)) for k in range(n_labels))
        likelihood = {w: tuple(math.log((counts[k][w] + alpha) / totals[k]) for k in range(n_labels))
                      for w in vocabulary}
        return cls(prior, likelihood)

    def scores(self, text: str) -> list[float]:
        """The unnormalised log posterior of each class."""
        out = list(self.log_prior)
        for w in words(text):
            row = self.log_likelihood.get(w)
            if row is not None:
                out = [a + b for a, b in zip(out, row)]
        return out

    def predict(self, text: str) -> int:
        s = self.scores(text)
        return max(range(len(s)), key=lambda k: (s[k], -k))  # ties: the lowest label id
