"""The experiment's report: compute accounting (cost tables from the paper's formulas) and result analysis (the
paper's Tables 2-5 and Figures 1 and 3 from the experiment's ``results.jsonl`` files, written as ``report.md``).

One concern per module; each imports only those above it in this list (no cycles). Nothing here imports torch.

* ``costs``: the cost of each training step of an experiment (``minimodel flops``)
* ``statistics``: mean ± std over seeds, percentile intervals, the two-level bootstrap draw of seeds
* ``curves``: adaptation curves (``Point``) and the paper's measures on them: time to target, speedups
* ``reading``: ``Results`` read from ``results.jsonl`` rows (seeds pooled, main metric of each task)
* ``intervals``: bootstrap intervals over seeds of any estimate of ``Results``, and of the time to target
* ``formatting``: how numbers, intervals and Markdown tables are written
* ``marks``: what the report marks (▼ ▽ ↓ ⊘) and holds back (the claims on a task near chance)
* ``tables``: Tables 2-5 and the speedups over BL_BASE (Figure 1 in numbers)
* ``figures``: Figure 3 (score against V100-days, one PNG per task)
* ``claims``: the paper's claims checked one by one (estimate, interval, rule, verdict)
* ``bridges``: step 1b's one-time cost and each bridge's distance to its source, from the finished bridge runs
* ``document``: ``report.md`` and the plain-text summary
"""
