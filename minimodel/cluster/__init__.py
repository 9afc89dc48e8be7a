"""Where and on what a run executes: SLURM jobs, the memory a stage needs on its card, the CPU threads it uses.

* ``launch``: ``minimodel submit``, one SLURM job per pipeline step chained with ``afterok``
* ``sbatch``: the batch scripts of those jobs
* ``launcher``: launcher files (a cluster's resources per stage) and the memory plan against their GPUs
* ``memory``: the analytic estimate of a stage's peak memory (``minimodel plan``)
* ``memory_probe``: the same stages measured on a device, to check the estimate
* ``threads``: the intra-op threads and OpenMP wait policy a stage chooses for the machine
"""
