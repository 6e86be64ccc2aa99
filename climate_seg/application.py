"""The two climate applications, registered together in pyproject.toml: the config's ``task`` key (default
``segmentation``) chooses :mod:`climate_seg.segmentation` or :mod:`climate_seg.detection`, for a training and for
the evaluation of a finished run alike (neither imports TensorFlow here)."""

from __future__ import annotations

from climate_seg.detection.application import APPLICATION as DETECTION
from climate_seg.segmentation.application import APPLICATION as SEGMENTATION
from common.application import Tasks
from common.commands import Command, Output, datatools_command, parser_of
from common.storage.sample_files import DatasetFiles

TASKS = Tasks(key="task", choices={"segmentation": SEGMENTATION, "detection": DETECTION}, default="segmentation",
              commands=(
                  Command("climate_seg.cam5.synth", parser_of("climate_seg.cam5.synth"),
                          writes=(Output("--out", "generated"),),
                          summary="synthetic CAM5 netCDF (segmentation) or ExtremeWeather snapshots"),
                  datatools_command("climate_seg.cam5.data", DatasetFiles("CAM5 (DeepCAM)", ("*.h5",),
                                                                          exclude=("stats*.h5",))),
                  Command("climate_seg.cam5.convert", parser_of("climate_seg.cam5.convert"),
                          reads=(("--input", "samples"), ("--labels", "samples")),
                          writes=(Output("--out", "file"),), summary="CAM5 netCDF into training samples"),
                  Command("climate_seg.cam5.stats", parser_of("climate_seg.cam5.stats"),
                          reads=(("directory", "samples"),), writes=(Output("--out", "file"),),
                          summary="per-channel statistics of a folder of samples"),
              ))
