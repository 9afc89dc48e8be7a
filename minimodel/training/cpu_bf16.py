"""Whether bf16 autocast is worth it on this CPU: the CPU side of ``precision: auto`` (``device.resolve_precision``).

bf16 autocast on a CPU pays only where its matmuls are faster than fp32's: with AMX (``amx_bf16`` in
``/proc/cpuinfo``: Intel Sapphire Rapids and later) they are several times faster; elsewhere it depends (an AMD EPYC
with AVX-512 bf16 ran a 512 x 512 bf16 matmul at about half its fp32 rate). Without AMX a few small timed matmuls
decide (bf16 at least ``SPEEDUP`` times fp32's rate), measured once per machine and kept in a small JSON file
(``cache_path``) keyed by the CPU's model name, the torch version and the thread count.

``MINIMODEL_CPU_BF16=1`` (or ``0``) gives the answer without looking: the test suite sets 0, so its numerics do not
depend on the machine. ``MINIMODEL_CACHE_DIR`` moves the cache (default ``$XDG_CACHE_HOME/minimodel``, else
``~/.cache/minimodel``)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from minimodel.errors import UserError
from minimodel.log import get_logger
from minimodel.store import atomic

log = get_logger(__name__)

ANSWER_ENV = "MINIMODEL_CPU_BF16"  # 1: bf16 on the CPU, 0: fp32; unset: AMX or the measurement decides
CACHE_ENV = "MINIMODEL_CACHE_DIR"
CACHE_FILE = "cpu_bf16.json"
CPUINFO = Path("/proc/cpuinfo")
AMX_FLAG = "amx_bf16"
SPEEDUP = 1.2  # bf16 must reach this multiple of fp32's matmul rate to be chosen
SIZE = 512  # the measured matmuls: SIZE x SIZE, ROUNDS rounds of PER_ROUND each, fp32 and bf16 alternating
ROUNDS = 5
PER_ROUND = 4


@dataclass(frozen=True)
class Measurement:
    """Matmul rates in GFLOP/s (the best round of each)."""

    fp32: float
    bf16: float

    @property
    def speedup(self) -> float:
        return self.bf16 / self.fp32


def cpu_info(path: Path = CPUINFO) -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags from ``/proc/cpuinfo`` (``("", {})`` where there is none: not Linux)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", frozenset()
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and not model:
            model = value.strip()
        elif name == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


def cache_path() -> Path:
    """Where the measurement is kept: ``$MINIMODEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/minimodel``, else
    ``~/.cache/minimodel``; the file ``cpu_bf16.json``."""
    if os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "minimodel"
    else:
        root = Path.home() / ".cache" / "minimodel"
    return root / CACHE_FILE


def machine_key(model: str) -> str:
    """What the measurement depends on: the CPU model, torch's version (its kernels) and the thread count."""
    return f"{model or 'unknown CPU'} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def measure(size: int = SIZE, rounds: int = ROUNDS, per_round: int = PER_ROUND) -> Measurement:
    """fp32 and bf16 matmul rates of ``size`` x ``size`` matrices on this CPU, the best of ``rounds`` rounds of
    ``per_round`` products each, fp32 and bf16 alternating (a load that comes and goes weighs on both alike).
    At 512 about 0.1 s on a 2-core machine."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    for x, y in ((a32, b32), (a16, b16)):  # warm-up: first-call allocations and kernel selection
        torch.mm(x, y)
    for _ in range(rounds):
        for x, y in ((a32, b32), (a16, b16)):
            start = time.perf_counter()
            for _ in range(per_round):
                torch.mm(x, y)
            best[x.dtype] = min(best[x.dtype], time.perf_counter() - start)
    flops = 2 * size**3 * per_round / 1e9
    return Measurement(fp32=flops / best[torch.float32], bf16=flops / best[torch.bfloat16])


def _read_cache(path: Path) -> dict:
    try:
        cache = atomic.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        log.warning(f"{path} is not a readable JSON file ({e}): measuring bf16 on this CPU again and rewriting it")
        return {}
    return cache if isinstance(cache, dict) else {}


def _cached(entry: object) -> Measurement | None:
    if not isinstance(entry, dict):
        return None
    fp32, bf16 = entry.get("fp32_gflops"), entry.get("bf16_gflops")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (fp32, bf16))
    return Measurement(float(fp32), float(bf16)) if ok else None  # type: ignore[arg-type]


def cached_measurement(model: str) -> tuple[Measurement, str]:
    """This machine's measurement and where it came from ("measured, cached in PATH", "cached in PATH" or
    "measured; not cached: WHY"): read from the cache when it holds this machine's key, measured and written
    there otherwise. A cache that cannot be written costs a measurement per process, nothing more."""
    path, key = cache_path(), machine_key(model)
    cache = _read_cache(path)
    found = _cached(cache.get(key))
    if found is not None:
        return found, f"cached in {path}"
    m = measure()
    cache[key] = {"fp32_gflops": round(m.fp32, 1), "bf16_gflops": round(m.bf16, 1), "size": SIZE,
                  "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        atomic.make_dirs(path.parent)
        atomic.write_json(path, cache)
    except (OSError, UserError) as e:
        return m, f"measured; not cached: {e}"
    return m, f"measured, cached in {path}"


def cpu_bf16() -> tuple[bool, str]:
    """Whether bf16 autocast is faster than fp32 on this CPU, and why (for the log): ``MINIMODEL_CPU_BF16`` where
    set; yes with AMX; otherwise the cached or measured matmul rates, bf16 at least ``SPEEDUP`` x fp32."""
    said = os.environ.get(ANSWER_ENV, "")
    if said:
        if said not in ("0", "1"):
            raise UserError(f"{ANSWER_ENV} must be 1 (bf16 autocast on the CPU) or 0 (fp32), got {said!r}")
        return said == "1", f"{ANSWER_ENV}={said}"
    model, flags = cpu_info()
    if AMX_FLAG in flags:
        return True, f"CPU with AMX ({AMX_FLAG} in {CPUINFO})"
    m, where = cached_measurement(model)
    verdict = "faster" if m.speedup >= SPEEDUP else f"not {SPEEDUP}x faster"
    return m.speedup >= SPEEDUP, (f"CPU without AMX; bf16 matmul {m.speedup:.2f}x fp32 ({m.bf16:.0f} against "
                                  f"{m.fp32:.0f} GFLOP/s at {SIZE}x{SIZE}: {verdict}; {where})")
