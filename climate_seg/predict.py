"""Apply a trained climate run to new data, segmentation or detection (the run's config says which).

    python -m climate_seg.predict --run-dir RUN --input PATH [PATH ...] --out OUT [--force] [task options]

Segmentation: per input (CAM5 netCDF files, or the suite's HDF5 samples) ``OUT/<stem>.mask.nc``, the class
mask (``--probabilities``: and each class's probability) on the input's own time, lat, lon coordinates, and
``OUT/<stem>.mask.png`` (:mod:`climate_seg.segmentation.predict`).  Detection: the boxes per time step
(:mod:`climate_seg.detection.predict`, where the detection task declares one).  Both: ``OUT/predictions.json``,
the index (:mod:`common.predict`).  The task is chosen where the training's is, by
:data:`climate_seg.application.TASKS`.
"""

from __future__ import annotations

from common.predict import main as predict_main

if __name__ == "__main__":
    predict_main("climate_seg", description=__doc__.split("\n\n")[0])
