"""The CosmoFlow config schema: the shared sections plus ``data`` and ``model``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from common.config import MEANING, AppConfig, CountedDataSection, Section, read_renamed_keys
from cosmoflow import formats

# Order of the four targets in the MLPerf files (``y`` / ``unitPar``), where no ``namePar`` says otherwise.
TARGET_NAMES = ("Omega_m", "sigma_8", "n_s", "H0")

TargetName = Literal["Omega_m", "sigma_8", "n_s", "H0"]

OMEGA_B = 0.049  # the mocks' baryon density, fixed (Planck 2018)


class MockSection(Section):
    """Mock universes written by ``python -m cosmoflow.mock`` (and by train when missing)."""

    generate_if_missing: bool = False
    n_train: PositiveInt = 256
    n_validation: PositiveInt = 64
    box_size_mpc_h: PositiveFloat = Field(256.0, description="comoving box side in Mpc/h", json_schema_extra=MEANING)
    particles_per_voxel_side: PositiveInt = Field(2, description="particle lattice is this many times finer than the grid")
    redshifts: list[NonNegativeFloat] = Field(default_factory=lambda: [3.0, 1.5, 0.5, 0.0], min_length=1,
                                              description="the redshift of each input channel",
                                              json_schema_extra=MEANING)
    seed: NonNegativeInt = Field(1234, description="NumPy seed of every sample (a whole number of at least 0)")
    dynamics: Literal["zeldovich", "2lpt", "cola"] = Field(
        "zeldovich", description="how the particles move from the initial field (the same field for a seed under "
                                 "every dynamics): zeldovich (first-order displacement), 2lpt (second order), cola "
                                 "(2LPT initial conditions, then particle-mesh steps in the COLA frame, as pycola "
                                 "made SC18's volumes; cosmoflow/nbody.py)", json_schema_extra=MEANING)
    cola_steps: PositiveInt = Field(10, description="dynamics cola: particle-mesh steps, uniform in the scale "
                                                    "factor from cola_initial_redshift to the lowest redshift (an "
                                                    "output redshift inside a step splits it: 10 are 13 with the "
                                                    "four default redshifts)",
                                    json_schema_extra=MEANING)
    cola_initial_redshift: PositiveFloat = Field(9.0, le=1000.0, description="dynamics cola: where the 2LPT "
                                                 "initial conditions are set (above every output redshift; at most "
                                                 "1000: the growth has no radiation era)", json_schema_extra=MEANING)
    cola_mesh_factor: PositiveInt = Field(2, le=4, description="dynamics cola: the force mesh is this many times "
                                                               "finer than the particle lattice (1 to 4)",
                                          json_schema_extra=MEANING)
    # Parameter ranges around Planck 2018; the targets are normalised to [-1, 1] over them.
    omega_m_range: tuple[PositiveFloat, PositiveFloat] = Field((0.20, 0.40), json_schema_extra=MEANING)
    sigma_8_range: tuple[PositiveFloat, PositiveFloat] = Field((0.60, 1.00), json_schema_extra=MEANING)
    n_s_range: tuple[PositiveFloat, PositiveFloat] = Field((0.90, 1.02), json_schema_extra=MEANING)
    h0_range: tuple[PositiveFloat, PositiveFloat] = Field((60.0, 80.0), json_schema_extra=MEANING)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, values):
        return read_renamed_keys(values, "data.mock")

    @field_validator("omega_m_range")
    @classmethod
    def _flat_with_baryons(cls, value):
        if not OMEGA_B < value[0] <= value[1] <= 1.0:
            raise ValueError(f"must be (low, high) with {OMEGA_B} (the baryons, fixed) < low <= high <= 1 (flat, "
                             "with a non-negative Lambda)")
        return value

    @model_validator(mode="after")
    def _dynamics_within_their_range(self):
        if self.dynamics == "cola" and self.cola_initial_redshift <= max(self.redshifts):
            raise ValueError(f"data.mock.cola_initial_redshift {self.cola_initial_redshift:g} must be above every "
                             f"output redshift (data.mock.redshifts reaches {max(self.redshifts):g})")
        if self.dynamics != "zeldovich" and max(self.redshifts) > 1000.0:
            raise ValueError(f"data.mock.redshifts reaches {max(self.redshifts):g}: dynamics {self.dynamics} "
                             "integrates the growth without radiation, good to z = 1000")
        return self


class CosmoDataSection(CountedDataSection):
    format: Literal[tuple(formats.FAMILIES)] = Field(formats.DEFAULT, description="the file family: one of "
                                                    "cosmoflow/formats/__init__.py's FAMILIES")
    compression: Literal["none", "gzip"] = Field("none", description="TFRecord compression")
    sample_shape: tuple[PositiveInt, PositiveInt, PositiveInt, PositiveInt] = Field(
        (128, 128, 128, 4), description="one sample, channels last: (x, y, z, redshifts)")
    samples_per_file: PositiveInt = Field(1, description="TFRecord samples per file (1 in the MLPerf layout)")
    target_names: list[TargetName] = Field(default_factory=lambda: list(TARGET_NAMES),
                                           description="the targets the network predicts, in this order",
                                           json_schema_extra=MEANING)
    file_target_names: list[TargetName] | None = Field(
        None, description="the order of the targets in the files; default: the raw files' namePar where present, "
                          "else Omega_m, sigma_8, n_s, H0 (the MLPerf data)", json_schema_extra=MEANING)
    target_offset: list[float] | None = Field(
        None, description="targets -> (y - offset) / scale, one value per file target (SC18 records hold "
                          "physical values: its zsAVG); default: none (unitPar are already in [-1, 1])",
        json_schema_extra=MEANING)
    target_scale: list[PositiveFloat] | None = Field(None, description="see target_offset (SC18: zsSTD)",
                                                     json_schema_extra=MEANING)
    apply_log: bool = Field(True, description="x -> log(1 + x); else x / mean(x)", json_schema_extra=MEANING)
    augment: bool = Field(False, description="random flips and axis permutations (isotropy)")
    random_shift: bool = Field(False, description="training rolls each volume by a random offset along each spatial "
                                                  "axis (the mocks are periodic boxes: a shifted box is another "
                                                  "draw of the same universe), drawn from the sample's seed")
    shuffle_buffer: NonNegativeInt = Field(0, description="sample shuffle buffer after reading (0: file shuffle only)")
    stage_dir: str | None = Field(None, description="copy each rank's files here (node-local SSD, /dev/shm) before "
                                  "training; $VARIABLES expanded there (/dev/shm/cosmoflow-${SLURM_JOB_ID}: per job)")
    stage_decompress: bool = Field(False, description="with stage_dir and compression: gzip, stage the training "
                                                      "files inflated (MLPerf's layout as raw samples read at their "
                                                      "offsets; others as TFRecords): no inflating per epoch")
    mock: MockSection = Field(default_factory=MockSection)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, values):
        return read_renamed_keys(values, "data")

    @field_validator("target_names", "file_target_names")
    @classmethod
    def _unique_targets(cls, names):
        if names is not None and (not names or len(set(names)) != len(names)):
            raise ValueError("must be a non-empty list without repeats")
        return names

    @model_validator(mode="after")
    def _target_normalisation(self):
        if (self.target_offset is None) != (self.target_scale is None):
            raise ValueError("data.target_offset and data.target_scale go together")
        if self.target_offset is not None and len(self.target_offset) != len(self.target_scale):
            raise ValueError("data.target_offset and data.target_scale need one value per file target each")
        if self.stage_decompress and not (self.stage_dir and self.stages_inflated()):
            inflated = [formats.family(name) for name in formats.FAMILIES if formats.stages_inflated(name, "gzip")]
            raise ValueError(f"data.stage_decompress needs data.stage_dir, data.format: "
                             f"{' or '.join(family.NAME for family in inflated)} and data.compression: gzip (it "
                             f"stages GZIP {' or '.join(family.WHAT for family in inflated)} files uncompressed)")
        return self

    def stages_inflated(self) -> bool:
        """Whether ``stage_decompress`` has files to inflate (:func:`cosmoflow.formats.stages_inflated`)."""
        return formats.stages_inflated(self.format, self.compression)


class CosmoModelSection(Section):
    name: Literal["cosmoflow"] = "cosmoflow"
    conv_blocks: PositiveInt = 5
    base_filters: PositiveInt = 32
    filter_multiplier: PositiveInt = Field(2, description="filters of block i = base_filters * multiplier**i")
    first_filters: PositiveInt | None = Field(
        None, description="filters of the first block only (default base_filters): a wider first block sees more "
                          "combinations of the 4 redshifts at full resolution, the other blocks unchanged")
    kernel_size: PositiveInt = 3
    padding: Literal["same", "valid"] = "same"
    periodic_padding: bool = Field(False, description="with padding: same, every convolution sees the box as "
                                                      "periodic (wrapped around, as the mocks are) instead of "
                                                      "zero-padded at its faces")
    pool_size: PositiveInt = 2
    batch_norm: bool = False
    batch_norm_momentum: float = Field(0.99, gt=0.0, lt=1.0, description="moving-statistics momentum")
    pooling: Literal["flatten", "average"] = Field(
        "flatten", description="the last block's volume into the dense layers: flatten (the reference: every position "
                               "its own weights) or average (global average pooling: one translation-invariant "
                               "value per filter)")
    dense_units: list[PositiveInt] = Field(default_factory=lambda: [128, 64])
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    l2: NonNegativeFloat = Field(0.0, description="L2 on the dense kernels")
    leaky_relu_slope: NonNegativeFloat = 0.3
    output_scale: PositiveFloat = Field(1.2, description="tanh output scaled by this")
    summaries: list[Literal["power", "log_power", "cross", "one_point"]] = Field(
        default_factory=list, description="summary statistics of each volume (cosmoflow.summaries, the ridge "
                                          "baseline's) computed in the network from its counts, standardised, "
                                          "into the dense head beside the convolutional features; [] (off): the "
                                          "network of the papers")
    summary_bins: PositiveInt = Field(12, description="k bins of the Fourier summaries (model.summaries)")
    summary_residual: bool = Field(
        False, description="the network learns the residual of the ridge baseline: a fixed linear path from the "
                           "standardised summaries to the outputs, set at the start to cosmoflow.information's ridge "
                           "fitted on the data.n_train training volumes, plus the network's head, whose last layer starts at zero (the "
                           "network starts as the baseline); needs model.summaries")

    @model_validator(mode="after")
    def _periodic_needs_same(self):
        if self.periodic_padding and self.padding != "same":
            raise ValueError("model.periodic_padding needs model.padding: same (it replaces the zeros of same "
                             "padding by the box's other side)")
        if len(set(self.summaries)) != len(self.summaries):
            raise ValueError(f"model.summaries {self.summaries}: a part is named twice")
        if self.summary_residual and not self.summaries:
            raise ValueError("model.summary_residual needs model.summaries (the ridge it starts from is fitted on "
                             "them): name the parts, e.g. [power, log_power, cross, one_point]")
        return self


class CosmoflowConfig(AppConfig):
    # Marked MEANING (common.config), checked on resume: the input transform (data.apply_log), what each input
    # channel is (data.mock.redshifts), the targets' order and scale (data.target_names, data.file_target_names,
    # data.target_offset, data.target_scale), the parameter ranges the unitPar outputs stand for
    # (data.mock.*_range: cosmoflow.predict maps the outputs onto them), and the box the summaries' k bins are in
    # (data.mock.box_size_mpc_h).
    data: CosmoDataSection
    model: CosmoModelSection = Field(default_factory=CosmoModelSection)
