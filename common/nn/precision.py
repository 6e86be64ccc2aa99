"""Numeric precision policy: fp32, mixed_float16, mixed_bfloat16, or auto.

``auto`` picks by the device: mixed_bfloat16 where it has bf16 units (CPUs
with AVX-512 BF16 or AMX, GPUs of compute capability 8.0 and up),
mixed_float16 on older GPUs, fp32 on other CPUs (Cori's KNL).  The trainer
resolves it once at start (rank 0's answer for all ranks) and records the
resolved policy in the run's config.yaml and summary.

Layers compute in the policy's compute dtype and keep float32 variables; the
applications build their last layer with ``dtype="float32"`` so that outputs
(and losses) are float32.  mixed_float16 needs loss scaling (the trainer wraps
the optimizer in ``keras.optimizers.LossScaleOptimizer``); bfloat16 does not.
"""

from __future__ import annotations

import keras

from common.console.cpu import has_bf16_units
from common.deferred import tensorflow as tf   # imported at first use: absent on Keras' JAX backend
from common.errors import ConfigError

POLICIES = {"fp32": "float32", "mixed_float16": "mixed_float16", "mixed_bfloat16": "mixed_bfloat16"}


def resolve(precision: str) -> str:
    """The concrete policy for ``precision`` on this process's device (``auto`` decided, others as given)."""
    if precision != "auto":
        return precision
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0))
        return "mixed_bfloat16" if tuple(capability) >= (8, 0) else "mixed_float16"
    return "mixed_bfloat16" if has_bf16_units() else "fp32"


# The functions below take a resolved policy (``resolve`` first: the trainer and the bench do, once).

def set_precision(precision: str) -> None:
    """Set the global Keras dtype policy; call before building the model."""
    try:
        keras.config.set_dtype_policy(POLICIES[precision])
    except KeyError:
        raise ValueError(f"precision must be one of {sorted(POLICIES)} (resolve 'auto' first), "
                         f"got {precision!r}") from None


def needs_loss_scaling(precision: str) -> bool:
    """Whether the gradients need a loss scale: float16 only (bfloat16 has float32's range)."""
    return precision == "mixed_float16"


def compute_dtype(precision: str) -> str:
    """The dtype layers compute in under a resolved precision (``fp32`` -> float32, ...)."""
    return {"fp32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[precision]


def check_device_support(precision: str) -> None:
    """mixed_float16 is a GPU policy: TensorFlow's CPU kernels lack float16 for
    ops such as MaxPool3D, so fail early with a message instead of mid-graph."""
    if precision == "mixed_float16" and not tf.config.list_physical_devices("GPU"):
        raise ConfigError("train.precision: mixed_float16 needs a GPU (TensorFlow has no float16 CPU kernels "
                          "for ops such as MaxPool3D); use mixed_bfloat16 on CPUs")
