"""The two climate applications, registered together in pyproject.toml: the config's ``task`` key (default
``segmentation``) chooses :mod:`climate_seg.segmentation` or :mod:`climate_seg.detection`, for a training and for
the evaluation of a finished run alike (neither imports TensorFlow here)."""

from __future__ import annotations

from climate_seg.detection.application import APPLICATION as DETECTION
from climate_seg.segmentation.application import APPLICATION as SEGMENTATION
from common.application import Tasks

TASKS = Tasks(key="task", choices={"segmentation": SEGMENTATION, "detection": DETECTION}, default="segmentation")
