"""TensorFlow, matplotlib and h5py, imported at their first use, not at the import of the module that uses them.

The paths that never touch them must not pay for them: ``--help`` and the config checks answer in a fraction
of a second without TensorFlow (tests/test_console.py), the models also build and train on Keras' JAX backend
where TensorFlow is absent, matplotlib (about 0.3 s) loads only where a figure is drawn, and h5py (about 0.3 s)
only where an HDF5 file is read or written.  A module names
them once, at its top, instead of by an import inside each function that uses them (the pattern of Keras'
own ``keras.src.utils.module_utils.LazyModule``)::

    from common.deferred import tensorflow as tf

    def native_conv(x, kernel):
        return tf.nn.conv2d(x, kernel, 1, "SAME")   # TensorFlow is imported here, at the first attribute read

Horovod has its own rule: only ``common/distributed.py`` imports it (tests/test_layout.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


class DeferredModule:
    """The module ``name``, imported (after ``before``, when given) when one of its attributes is first read."""

    def __init__(self, name: str, before: Callable[[], None] | None = None):
        self._name = name
        self._before = before
        self._module = None

    def __getattr__(self, attribute: str):
        # Reached only for names this object lacks: every attribute of the module, never _name or _module.
        if self._module is None:
            if self._before is not None:
                self._before()
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)

    def __repr__(self) -> str:
        return f"<deferred module {self._name!r}{'' if self._module is None else ' (imported)'}>"


def _agg_backend() -> None:
    # Figures are files: no display on a compute node, and the same pixels everywhere.
    importlib.import_module("matplotlib").use("Agg")


tensorflow = DeferredModule("tensorflow")
pyplot = DeferredModule("matplotlib.pyplot", before=_agg_backend)
h5py = DeferredModule("h5py")
