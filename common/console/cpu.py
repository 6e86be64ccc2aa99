"""The CPU this process runs on, and which TensorFlow kernels it gets.

TensorFlow 2.21 on x86 has two CPU kernel sets: oneDNN's and Eigen's.  It
turns oneDNN on by default only on CPUs with AVX512_VNNI, AVX512_BF16 or AMX;
every AVX2 CPU (AMD Zen 1-3, most Intel client parts, laptops) and Cori's KNL
(AVX-512F without VNNI) get Eigen, which trains CosmoFlow about 4x slower
(MaxPool3DGrad and Conv3DBackpropFilter) and has no gradient at all for dilated
2D convolutions.  So the suite asks for oneDNN on every x86 CPU:
:func:`enable_onednn` sets ``TF_ENABLE_ONEDNN_OPTS=1`` before TensorFlow is
imported (``common/__init__.py`` calls it, so every entry point and every
Horovod rank gets it), unless the user set the variable, which wins.

:func:`describe` is what runs, benchmarks and CI record: the CPU model, the
instruction-set features that decide speed, and whether oneDNN is on.
"""

from __future__ import annotations

import functools
import os
import platform

# Imported where used, not here: TensorFlow, only when a function asks it: this module runs before TensorFlow is
# imported.

ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# Set beside ONEDNN_VARIABLE when the suite (not the user) chose it, so child processes can tell.
_SET_BY_SUITE = "HPC_DL_SUITE_SET_ONEDNN"

# The /proc/cpuinfo flags that decide TensorFlow's CPU speed and kernel choice.
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset]:
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), e.g. ``AMD EPYC 7B13``."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset:
    """The CPU's feature flags as ``/proc/cpuinfo`` spells them (empty where it is not readable)."""
    return _cpuinfo()[1]


def has_bf16_units() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX-512 BF16 or AMX)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def enable_onednn(environ=None) -> None:
    """Ask TensorFlow for its oneDNN kernels on x86 unless ``TF_ENABLE_ONEDNN_OPTS`` is already set.

    Takes effect only in a process that has not imported TensorFlow yet (and in
    its children); :func:`onednn_enabled` tells what TensorFlow actually runs.
    """
    environ = os.environ if environ is None else environ
    if is_x86() and ONEDNN_VARIABLE not in environ:
        environ[ONEDNN_VARIABLE] = "1"
        environ[_SET_BY_SUITE] = "1"


def onednn_setting() -> str:
    """Who decided the kernel set: ``"user: TF_ENABLE_ONEDNN_OPTS=0"``, ``"suite: ...=1"`` or ``"TensorFlow's default"``."""
    value = os.environ.get(ONEDNN_VARIABLE)
    if value is None:
        return "TensorFlow's default"
    who = "suite" if os.environ.get(_SET_BY_SUITE) == "1" and value == "1" else "user"
    return f"{who}: {ONEDNN_VARIABLE}={value}"


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN CPU kernels in this process (imports TensorFlow)."""
    # deferred: this module is read before TensorFlow loads (it sets TF_ENABLE_ONEDNN_OPTS)
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def describe() -> dict:
    """The CPU and kernel facts a measurement needs beside it (imports TensorFlow)."""
    flags = cpu_flags()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "cpus_available": cores,
        "isa": {flag: flag in flags for flag in SPEED_FLAGS},
        "onednn": onednn_enabled(),
        "onednn_setting": onednn_setting(),
    }


def one_line(facts: dict | None = None) -> str:
    """``describe()`` for a log or table line: ``Intel Xeon ... (avx2 avx512f avx512_bf16), oneDNN on``."""
    facts = facts or describe()
    present = [flag for flag, on in facts["isa"].items() if on and flag not in ("fma", "amx_tile")]
    onednn = "on" if facts["onednn"] else "off"
    return (f"{facts['cpu_model']} ({' '.join(present) or 'no AVX2'}; {facts['cpus_available']} CPUs), "
            f"oneDNN {onednn} ({facts['onednn_setting']})")
