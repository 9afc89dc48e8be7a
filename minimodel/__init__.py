"""minimodel: mini-model adaptation (Marchisio et al., 2023) in PyTorch Lightning."""

__version__ = "0.1.0"
