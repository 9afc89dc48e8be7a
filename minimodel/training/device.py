"""Every decision that depends on the device, in one place, each with a CPU test that takes its GPU side
(``tests/test_gpu_path.py``): CI never has a GPU, so a branch that only runs on CUDA is proven here by forcing it.

- which AdamW implementation a stage uses (``adamw_fused``: fused on CUDA, ``trainer.adamw`` overrides);
- what ``precision: auto`` means on the device at hand (``resolve_precision``, the one resolver of training and
  evaluation: bf16 on a CUDA card that has it natively, fp16 on older cards, and on a CPU bf16 only where it is faster
  there, ``cpu_bf16.py``);
- whether a precision can run on the device (``check_precision``: bf16 only where the card has it natively);
- the autocast dtype of evaluation (``autocast_dtype``: ``evaluate.precision``, auto resolved as above);
- pinned host memory for the data loaders (``pin_memory``);
- which modules ``trainer.compile`` compiles (``compile_layers``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from minimodel.config.schema import ADAMW, PRECISIONS
from minimodel.errors import UserError
from minimodel.log import get_logger
from minimodel.training.cpu_bf16 import cpu_bf16

log = get_logger(__name__)

GPU_ACCELERATORS = ("auto", "gpu", "cuda")


class PrecisionError(UserError, RuntimeError):
    """A precision the device cannot run well (bf16 on a card without native bf16)."""


def adamw_fused(params: Iterable[torch.nn.Parameter], choice: str = "auto") -> bool:
    """Whether AdamW runs as one fused kernel: ``fused`` / ``foreach`` as asked; ``auto``: fused when every
    parameter is on CUDA (Lightning moves the model before ``configure_optimizers``), foreach otherwise.
    Fused is safe with gradient clipping in every precision: ``optim.UpdateGuard`` unscales fp16 gradients
    itself before clipping (Lightning's own clipping refuses an optimizer that unscales internally)."""
    if choice not in ADAMW:
        raise ValueError(f"trainer.adamw must be one of {', '.join(ADAMW)}, got {choice!r}")
    if choice != "auto":
        return choice == "fused"
    params = list(params)
    return bool(params) and all(p.is_cuda for p in params)


def cuda_in_use(accelerator: str) -> bool:
    """Whether a stage with this ``trainer.accelerator`` trains on CUDA."""
    return accelerator in GPU_ACCELERATORS and torch.cuda.is_available()


def native_bf16(device: torch.device) -> bool:
    """bf16 arithmetic in hardware: CUDA compute capability 8.0 or later (A100, H100, RTX 30xx+); a V100 (7.0)
    only emulates it (``torch.cuda.is_bf16_supported()`` counts that emulation as support). CPUs: yes
    (autocast runs bf16 kernels on any CPU)."""
    if device.type != "cuda":
        return True
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``precision: auto`` became on a device (one of ``PRECISIONS``), and why, for the log."""

    precision: str
    why: str

    def line(self, key: str) -> str:
        return f"{key}: auto -> {self.precision}: {self.why}"


def stage_device(accelerator: str) -> torch.device | None:
    """The device a training stage with this ``trainer.accelerator`` runs on (the current CUDA card, or the CPU);
    None for an accelerator with no rule here (``mps``, ``tpu``)."""
    if cuda_in_use(accelerator):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu") if accelerator in ("cpu", *GPU_ACCELERATORS) else None


def resolve_precision(device: torch.device | None) -> PrecisionChoice:
    """``precision: auto`` on ``device``, for training stages and evaluation alike: on CUDA bf16-mixed where the
    card has native bf16 and 16-mixed (fp16 with loss scaling) where it does not (a V100); on a CPU bf16-mixed only
    where bf16 is faster there (AMX, or the cached matmul check of ``cpu_bf16``), 32-true otherwise; 32-true on
    other devices (None: an accelerator with no rule)."""
    if device is not None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        if native_bf16(device):
            return PrecisionChoice("bf16-mixed", f"{name} (compute capability {cap}) has native bfloat16")
        return PrecisionChoice("16-mixed", f"{name} (compute capability {cap}) has no native bfloat16: fp16 with "
                                           f"loss scaling")
    if device is None or device.type != "cpu":
        return PrecisionChoice("32-true", f"no rule for {device.type if device else 'this accelerator'}: full "
                                          f"precision")
    fast, why = cpu_bf16()
    return PrecisionChoice("bf16-mixed" if fast else "32-true", why)


def check_precision(precision: str, accelerator: str, key: str) -> None:
    """Refuse, at the start of a stage, a precision its device cannot run as asked: ``key`` names the setting
    (``pretrain.trainer.precision``)."""
    if precision not in PRECISIONS:
        raise PrecisionError(f"{key} must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision.startswith("bf16") and cuda_in_use(accelerator):
        device = torch.device("cuda", torch.cuda.current_device())
        if not native_bf16(device):
            name = torch.cuda.get_device_name(device)
            cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
            raise PrecisionError(f"{key}={precision}, but {name} (compute capability {cap}) has no native bfloat16: "
                                 f"it would be emulated and slow. Set {key.rsplit('.', 1)[0]}.precision=16-mixed "
                                 f"(fp16 with loss scaling; the v100 launcher does) or 32-true")


_SAID: set[tuple[str, str]] = set()  # (device, choice) of evaluation's auto already logged: once, not per checkpoint


def autocast_dtype(device: torch.device, precision: str = "auto") -> torch.dtype | None:
    """Evaluation's autocast dtype (``evaluate.precision``): ``auto`` as ``resolve_precision`` decides on
    ``device`` (said in the log once per process); ``32-true`` none; ``bf16-mixed`` bf16; ``16-mixed`` fp16 on
    CUDA and bf16 on the CPU (Lightning's reading of it)."""
    if precision == "auto":
        choice = resolve_precision(device)
        if (str(device), choice.precision) not in _SAID:
            _SAID.add((str(device), choice.precision))
            log.info(choice.line("evaluate.precision"))
        precision = choice.precision
    if precision == "32-true":
        return None
    if precision == "bf16-mixed":
        return torch.bfloat16
    if precision == "16-mixed":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    raise ValueError(f"evaluate.precision must be auto or one of {', '.join(PRECISIONS)}, got {precision!r}")


def pin_memory() -> bool:
    """Pinned host buffers for the data loaders: only worth it (and only possible) with CUDA."""
    return torch.cuda.is_available()


def compile_layers(model: nn.Module) -> int:
    """``trainer.compile``: compile every transformer layer of ``model`` in place (``Module.compile``: the
    parameters, their names and the checkpoints stay as they are); returns how many. Per layer, not the whole
    model: the layers are identical, so one compiled graph serves all of them and a stage that runs only the
    bottom layers (step 2 over a mini-model) compiles only those."""
    from minimodel.models.decoder import Layer as DecoderLayer
    from minimodel.models.model import Layer

    layers = [m for m in model.modules() if isinstance(m, (Layer, DecoderLayer))]
    for layer in layers:
        layer.compile()
    return len(layers)
