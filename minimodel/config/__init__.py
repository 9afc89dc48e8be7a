"""Structured experiment configuration, in three modules (this package re-exports nothing):

- ``schema``: the dataclasses (``ExperimentConfig`` and its sections) and small helpers on their values; it imports
  nothing of minimodel, so any module may read the schema.
- ``load``: YAML composition (``defaults:``, ``extends:``), ``key=value`` overrides, ``load_config``,
  ``load_structured``, ``model_preset``, ``save_config``.
- ``checks``: the checks that hold for every system (``load_config`` runs them).

A config checked for its system as well is ``experiment.load_experiment``; what decides a stage run (and whether a
finished one is this configuration's) is in ``identity``."""
