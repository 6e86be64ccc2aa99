"""common/deferred.py: TensorFlow, matplotlib and h5py named at a module's top, imported at their first use."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

# Modules that name a deferred module at their top and serve paths that must not load it.
LIGHT_MODULES = ("common.storage.outputs", "common.storage.plots", "common.tools.datatools", "common.tools.scaling",
                 "cosmoflow.learning_curve", "hep_cnn.maxima")


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_loads_nothing_and_the_first_use_loads_it():
    code = (f"import sys\nimport {', '.join(LIGHT_MODULES)}\n"
            "heavy = ('tensorflow', 'matplotlib', 'h5py')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "from common.deferred import h5py, pyplot\n"
            "pyplot.figure()\n"
            "import matplotlib\n"
            "print(matplotlib.get_backend().lower(), h5py.File.__module__.split('.')[0])")
    before, after = _run(code).splitlines()
    assert before == "[]"
    assert after == "agg h5py"   # figures drawn without a display, on every node
