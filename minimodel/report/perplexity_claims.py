"""Claims 1 and 2 read on a causal LM's target-language perplexity (issue 32; not in the paper): per language,
point estimates, from ``reading.inverse_perplexity``'s 1/perplexity results. Nothing here imports torch."""

from __future__ import annotations

import math

from minimodel.report.claims import MINIJOINT, MINIPOST, NOT_IN_PAPER, pct
from minimodel.report.formatting import fmt_speedup
from minimodel.report.reading import REFERENCE, Results

PERPLEXITY_TEXTS: dict[int, tuple[str, str]] = {  # claim, the rule for *held* in one language
    1: ("MiniJoint reaches 95% of BL_BASE's final 1/perplexity (a perplexity at most BL_BASE's final / 0.95) with "
        "less step-2 compute", "BL_BASE days / MiniJoint days to that target above 1×"),
    2: ("MiniPost keeps ~99% of BL_BASE's final 1/perplexity at about half its step-2 cost",
        "final 1/perplexity ratio MiniPost / BL_BASE at least 97% and cost ratio at most 60%"),
}


def _ppl_claim1(res: Results, task: str, lang: str) -> tuple[str, str]:
    """MiniJoint's speedup to BL_BASE's 1/perplexity target in one language: (estimate, verdict)."""
    ref, sys_ = res.days_to_target(REFERENCE, task, lang), res.days_to_target(MINIJOINT, task, lang)
    if ref is None or sys_ is None:
        return "—", "not measured"
    if math.isinf(sys_):
        return "never reaches it", "not held"
    if sys_ <= 0 or ref <= 0:
        return "reached at step 0", "undefined"
    ratio = ref / sys_
    return fmt_speedup(ratio), "held" if ratio > 1 else "not held"


def _ppl_claim2(res: Results, task: str, lang: str) -> tuple[str, str]:
    """MiniPost's final 1/perplexity as a share of BL_BASE's and its step-2 cost as a share: (estimate, verdict)."""
    mp, ref = res.final(MINIPOST, task, lang), res.final(REFERENCE, task, lang)
    if mp is None or ref is None:
        return "—", "not measured"
    score, cost = mp.score / ref.score, mp.flops / ref.flops
    return f"{pct(score)} at {pct(cost)} of the cost", "held" if score >= 0.97 and cost <= 0.6 else "not held"


def perplexity_claims(res: Results, task: str) -> str:
    """Claims 1 and 2 read on the target-language perplexity (``reading.inverse_perplexity``: ``res`` holds
    1/perplexity) as a Markdown table: per language, and the count of languages where each holds. Point estimates
    only: a checkpoint's perplexity comes from one adaptation run per language, with nothing to resample, so no
    interval and no *held* for the whole claim unless it holds in every language."""
    langs = res.langs(task)
    lines = ["| claim | paper | ours (per language) | rule for *held* (each language) | verdict | languages |",
             "|---|---|---|---|---|---|"]
    for i, one in ((1, _ppl_claim1), (2, _ppl_claim2)):
        claim, rule = PERPLEXITY_TEXTS[i]
        per = {lang: one(res, task, lang) for lang in langs}
        measured = [lang for lang in langs if per[lang][1] in ("held", "not held")]
        held = [lang for lang in measured if per[lang][1] == "held"]
        if not measured:
            v = "not measured"
        elif len(held) == len(langs):
            v = f"held in all {len(langs)} (point estimates)"
        elif not held:
            v = f"not held in any of {len(langs)}"
        else:
            v = f"held in {len(held)} of {len(langs)} ({', '.join(held)}): mixed"
        ours = "; ".join(f"{lang} {est} ({vv})" for lang, (est, vv) in per.items())
        lines.append(f"| {claim} | {NOT_IN_PAPER} | {ours} | {rule} | **{v}** | {', '.join(langs)} ({len(langs)}) |")
    return "\n".join(lines)
