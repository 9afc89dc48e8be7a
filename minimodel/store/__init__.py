"""Everything that reads or writes the files of a run, and decides whose run a file is.

* ``layout``: the one owner of every path under ``runs_dir`` and ``data.prepared_dir``
* ``atomic``: whole-or-nothing writes, and the one error a refused write raises
* ``locks``: one writer per run directory
* ``checkpoints``: training checkpoints and saved models, read with their checks
* ``identity``: what decides a stage run, and whether a finished run is this configuration's
* ``provenance``: where a run came from (code, data, configuration), recorded beside it
* ``results``: the tidy ``results.jsonl`` table of an experiment
* ``truncation``: how many examples of a task file were cut to ``max_len``, recorded for the report
* ``wandb_results``: results rows, report tables and plots on wandb
"""
