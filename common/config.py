"""YAML configuration: one validated schema per application.

An application declares its schema as a pydantic model that reuses the shared
sections below (``train``, ``optimizer``, ``distributed``, ``mlperf``) and adds
its own ``data`` and ``model`` sections.  Defaults live in the schema; unknown
keys and wrong types are errors that name the key path and the file.  So are a
key given twice in a file (naming both lines), aliases that expand without
bound, and a ``distributed.instance_overrides`` entry that makes a bad
instance config: every command that loads a config refuses them up front.
"""

from __future__ import annotations

import copy
import functools
import logging
import pathlib
import types
import typing
from typing import Any, Literal, TypeVar

import pydantic
import yaml
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                      ValidationInfo, field_validator, model_validator)

from common.errors import ConfigError
from common.storage.outputs import write_text

log = logging.getLogger(__name__)

Precision = Literal["fp32", "mixed_float16", "mixed_bfloat16", "auto"]


def _admits_bool(annotation) -> bool:
    """Whether a field's type takes true/false (bool itself, Any, or a union or Literal holding them)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return any(isinstance(value, bool) for value in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _admits_bool(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_admits_bool(arg) for arg in typing.get_args(annotation))
    return False


def _element_type(annotation):
    """The element type of list[X] / tuple[X, ...] fields (None for anything else)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _element_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        found = [t for t in map(_element_type, typing.get_args(annotation)) if t is not None]
        return found[0] if found else None
    if origin in (list, tuple) and typing.get_args(annotation):
        return typing.get_args(annotation)[0]
    return None


# Marks a field whose value decides what the network's weights or outputs mean (its input transform, its
# targets' order and units, the scale its kernels learned): ``Field(..., json_schema_extra=MEANING)``.  A
# checkpoint records every marked field beside the model section (:func:`network_data_record`), and a resume
# that changed one is refused, naming it; a checkpoint written before a field was marked is compared on the
# fields it records.  The model section is recorded whole: its fields need no mark.
MEANING = {"meaning": True}


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, and so is true/false for a number.

    pydantic's lax mode reads ``true`` as 1 for an int field (``--set data.batch_size=true`` would train
    with batch 1); a number field refuses a YAML boolean here.  Numbers written as strings by YAML 1.1
    (``1e-4``) are still read, as lax mode does.
    """

    # inf and nan are no value of any key (a learning rate of inf passed "> 0" and trained to a NaN)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info: ValidationInfo):
        annotation = cls.model_fields[info.field_name].annotation
        element = _element_type(annotation)
        if isinstance(value, bool) and not _admits_bool(annotation):
            raise ValueError(f"expected {_type_name(annotation)}, not a boolean")
        if element is not None and isinstance(value, (list, tuple)) and not _admits_bool(element) \
                and any(isinstance(item, bool) for item in value):
            raise ValueError(f"expected a list of {_type_name(element).removeprefix('a ')}s, not booleans")
        return value


def _type_name(annotation) -> str:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return "a number" if annotation in (int, float) else getattr(annotation, "__name__", str(annotation))


class DataSection(Section):
    """Keys every application's ``data`` section has."""

    data_dir: str = Field(description="directory holding the dataset files")
    batch_size: PositiveInt = Field(1, description="samples per rank per step")
    on_bad_file: Literal["fail", "skip"] = Field(
        "fail", description="a truncated or malformed file stops the run (fail) or is left out and reported (skip)")
    derived_dir: str | None = Field(
        None, description="where the suite writes what it computes from the data (channel statistics, class counts, "
        "maxima), never the data folder: default a folder per dataset under $HPCDL_DERIVED_DIR or "
        "~/.cache/hpc-dl-suite/derived; on several nodes, one they all see")


class CountedDataSection(DataSection):
    """A data section whose training and validation splits training may cut to their first samples (evaluation
    and prediction read every sample)."""

    # The key that selects what training uses of each split it reads.
    COUNT_KEYS: typing.ClassVar[dict[str, str]] = {"train": "n_train", "validation": "n_validation"}

    n_train: PositiveInt | None = Field(None, description="training samples to use (default: all present)")
    n_validation: PositiveInt | None = Field(None, description="validation samples to use (default: all present)")

    def requested(self, split: str) -> tuple[int | None, str | None]:
        """(the samples training uses of ``split``, None for all of them; the key that says so, ``data.n_train``);
        (None, None) for a split training does not read."""
        key = self.COUNT_KEYS.get(split)
        return (getattr(self, key), f"data.{key}") if key else (None, None)


class TrainSection(Section):
    epochs: PositiveInt = 1
    seed: int = 0
    deterministic: bool = Field(False, description="TF op determinism and all seeds fixed")
    precision: Precision = Field(
        "fp32", description="auto: mixed_bfloat16 where the device has bf16 units, else fp32 (mixed_float16 on "
                            "pre-Ampere GPUs); resolved at start and recorded in the run's config.yaml")
    output_dir: str | None = Field(None, description="run directory (overridden by --output-dir)")
    intra_op_threads: NonNegativeInt = Field(0, description="0: cores / ranks on this node")
    inter_op_threads: NonNegativeInt = Field(0, description="0: TensorFlow's default")
    throughput_warmup_steps: NonNegativeInt = Field(
        2, description="steps at the start of each epoch left out of the samples/s figure")
    peak_tflops: PositiveFloat | None = Field(
        None, description="known peak of one rank's device, for the ratio; --measure-peak measures it")
    keep_checkpoints: PositiveInt = 2
    tensorboard: bool = True
    steps_per_execution: PositiveInt = 1
    hang_timeout_s: NonNegativeFloat = Field(
        120.0, description="exit (code 4) when no step or validation batch completes for this long, or the ranks' "
                           "meeting after a save once the file is written (0: never)")
    startup_timeout_s: NonNegativeFloat = Field(
        1800.0, description="exit (code 4) when start-up (data screening, model build, broadcast, the first "
                            "step's trace) takes longer than this (0: never)")
    save_timeout_s: NonNegativeFloat = Field(
        1800.0, description="exit (code 4) when writing a checkpoint or the final model takes longer (0: never); "
                            "the ranks waiting for rank 0's write are not taken for hung until they see it written")
    max_nonfinite_steps: PositiveInt = Field(
        10, description="with loss scaling: stop after this many NaN/Inf losses in a row")
    gradient_lag: Literal[0, 1] = Field(
        0, description="1: apply step t's allreduced gradients at step t+1, so the allreduce overlaps the update")
    precise_bn_batches: NonNegativeInt = Field(
        0, description="after the last epoch: batch-norm moving statistics replaced by the average over this many "
                       "training batches per rank run with the final weights (common/nn/batch_norm.py), validation "
                       "rerun; 0: keep the moving averages")


class ScheduleSection(Section):
    """Learning rate: base LR scaled by global batch, warmup, then decay.

    The peak learning rate is ``optimizer.learning_rate * f(global_batch /
    base_batch_size)`` with f the identity (``linear``), the square root
    (``sqrt``) or 1 (``none``).
    """

    scaling: Literal["none", "linear", "sqrt"] = "none"
    base_batch_size: PositiveInt = Field(1, description="global batch the base LR was tuned for")
    warmup_epochs: NonNegativeFloat = 0.0
    warmup_steps: NonNegativeInt = Field(0, description="used when warmup_epochs is 0")
    warmup_start: Literal["zero", "base"] = Field(
        "zero", description="warmup starts at 0 or at the unscaled base LR")
    decay: Literal["none", "step", "polynomial", "cosine"] = "none"
    decay_boundaries: dict[NonNegativeInt, PositiveFloat] = Field(
        default_factory=dict, description="step decay: {epoch: factor of the peak LR from that epoch on}")
    decay_epochs: PositiveFloat | None = Field(
        None, description="polynomial/cosine: epochs from the end of warmup to the end LR (default: the rest of training)")
    end_factor: NonNegativeFloat = Field(0.0, description="polynomial/cosine: final LR as a fraction of the peak")
    power: PositiveFloat = 1.0


class LarcSection(Section):
    enabled: bool = False
    trust_coefficient: PositiveFloat = 0.002
    clip: bool = True
    epsilon: NonNegativeFloat = 1e-8


class OptimizerSection(Section):
    name: Literal["sgd", "adam", "lars"] = "sgd"
    learning_rate: PositiveFloat = 1e-3
    momentum: NonNegativeFloat = 0.9
    nesterov: bool = False
    beta_1: NonNegativeFloat = 0.9
    beta_2: NonNegativeFloat = 0.999
    epsilon: NonNegativeFloat = 1e-7
    weight_decay: NonNegativeFloat = 0.0
    eeta: PositiveFloat = Field(0.001, description="LARS trust coefficient")
    lars_epsilon: NonNegativeFloat = 0.0
    exclude_from_weight_decay: list[str] = Field(default_factory=lambda: ["bias", "batch_normalization"])
    exclude_from_layer_adaptation: list[str] | None = None
    larc: LarcSection = Field(default_factory=LarcSection)
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)


class DistributedSection(Section):
    gradient_compression: Literal["none", "fp16"] = "none"
    # Horovod knobs, exported by the SLURM scripts (python -m common.tools.slurm env) before the ranks start.
    fusion_threshold_mb: PositiveFloat | None = Field(None, description="HOROVOD_FUSION_THRESHOLD (default 128 MiB)")
    cycle_time_ms: PositiveFloat | None = Field(None, description="HOROVOD_CYCLE_TIME")
    hierarchical_allreduce: bool = Field(False, description="HOROVOD_HIERARCHICAL_ALLREDUCE (intra-node, then inter)")
    groups: PositiveInt = Field(1, description="synchronous groups of ranks, asynchronous across groups (SC17)")
    exchange_every: PositiveInt = Field(10, description="steps between weight exchanges across groups")
    instances: PositiveInt = Field(1, description="independent models trained at once, each on ranks / instances "
                                                  "contiguous ranks with train.seed + k, in <output-dir>/instance-<k>")
    instance_overrides: list[dict[str, Any]] = Field(
        default_factory=list, description="one mapping of key path -> value per instance (a sweep), applied "
                                          "after train.seed + k: [{optimizer.learning_rate: 0.001}, ...]")

    @model_validator(mode="after")
    def _instances_fit(self):
        if self.instance_overrides and self.instances == 1:
            raise ValueError("distributed.instance_overrides is for a job of several instances (distributed.instances "
                             "> 1); a lone run takes its settings from the config itself: set them there")
        if self.instance_overrides and len(self.instance_overrides) != self.instances:
            raise ValueError(f"distributed.instance_overrides has {len(self.instance_overrides)} entries for "
                             f"distributed.instances={self.instances}: give one mapping per instance")
        if self.instances > 1 and self.groups > 1:
            raise ValueError("distributed.instances and distributed.groups cannot be combined: each instance "
                             "is one synchronous group")
        for overrides in self.instance_overrides:
            for key in overrides:
                if key.split(".")[0] == "distributed":
                    raise ValueError(f"distributed.instance_overrides: {key!r}: an instance cannot change the "
                                     "distributed section (every instance shares the job's ranks)")
        return self


class MlperfSection(Section):
    enabled: bool = False
    log_file: str = "mlperf.log"
    submission_org: str = "hpc-dl-suite"
    submission_platform: str = "unknown"
    submission_division: Literal["closed", "open"] = "closed"
    submission_status: Literal["cloud", "onprem", "preview", "research"] = "research"
    accelerators_per_node: NonNegativeInt = 0


class AppConfig(Section):
    """What every application schema has; apps narrow ``data`` and add ``model``, and mark with
    :data:`MEANING` the fields outside ``model`` that decide what the network's weights mean."""

    data: DataSection
    train: TrainSection = Field(default_factory=TrainSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    mlperf: MlperfSection = Field(default_factory=MlperfSection)


ConfigT = TypeVar("ConfigT", bound=AppConfig)


def meaning_keys(schema: type[BaseModel]) -> tuple[str, ...]:
    """The dotted keys of ``schema``'s fields marked :data:`MEANING`, its sections' fields included
    (``data.mock.omega_m_range``), in the schema's field order."""
    keys = []
    for name, field in schema.model_fields.items():
        if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("meaning") is True:
            keys.append(name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys.extend(f"{name}.{key}" for key in meaning_keys(field.annotation))
    return tuple(keys)


def network_data_record(cfg: AppConfig) -> dict:
    """``{dotted key: JSON value}`` of the config's fields marked :data:`MEANING` (:func:`meaning_keys`): what a
    checkpoint records beside its model section."""
    dumped = config_to_dict(cfg)
    return {key: functools.reduce(dict.__getitem__, key.split("."), dumped) for key in meaning_keys(type(cfg))}


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"optimizer.learning_rate=0.01"`` -> (["optimizer", "learning_rate"], 0.01).

    The value is parsed as YAML, so numbers, booleans, lists and mappings work.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    parts = key.strip().split(".")
    if any(not p for p in parts):
        raise ConfigError(f"--set {text!r}: empty component in key path {key!r}")
    try:
        value = _load_yaml(raw) if raw.strip() else None
    except _Refused as exc:
        raise ConfigError(f"--set {text!r}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {text!r}: value is not valid YAML ({exc.__class__.__name__})") from None
    return parts, value


def apply_overrides(raw: dict, overrides: list[str] | None) -> dict:
    """Return a copy of ``raw`` with each ``a.b=value`` override set."""
    result = copy.deepcopy(raw)
    for text in overrides or []:
        parts, value = parse_override(text)
        _set_path(result, parts, value, f"--set {text!r}")
    return result


def apply_values(raw: dict, values: dict[str, Any], source: str) -> dict:
    """Return a copy of ``raw`` with each ``{"a.b": value}`` set (values already parsed, as YAML gives them)."""
    result = copy.deepcopy(raw)
    for key, value in values.items():
        parts = str(key).split(".")
        if any(not p for p in parts):
            raise ConfigError(f"{source}: empty component in key path {key!r}")
        _set_path(result, parts, copy.deepcopy(value), f"{source}: {key!r}")
    return result


# Keys renamed, read under their old name until 0.2.0 (read_renamed_keys, in the validator of each section that
# had one; --set of either name: _set_path): old -> new.
RENAMED_KEYS = {"n_valid": "n_validation"}
_WARNED_RENAMES: set[tuple[str, str]] = set()


def read_renamed_keys(values, section: str):
    """A section's raw keys with each old name of :data:`RENAMED_KEYS` read as its new one, with a warning naming
    the key (both names in one section: refused).  CosmoFlow's ``n_valid``: one spelling of the validation count
    in every application."""
    if not isinstance(values, dict):
        return values
    for old, new in RENAMED_KEYS.items():
        if old in values:
            if new in values:
                raise ValueError(f"{section}.{old} is the old name of {section}.{new}: give only {section}.{new}")
            if (section, old) not in _WARNED_RENAMES:   # once a process: a command may read its config twice
                _WARNED_RENAMES.add((section, old))
                log.warning(f"{section}.{old} is deprecated (read until 0.2.0): call it {section}.{new}")
            values = dict(values)
            values[new] = values.pop(old)
    return values


def _set_path(node: dict, parts: list[str], value, where: str) -> None:
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{where}: {'.'.join(parts[: depth + 1])} is a value, not a section")
        node = child
    # A value set over the file's under the other spelling of a renamed key replaces it (the file giving both
    # spellings stays an error): `--set data.n_validation=8` on an old config, `data.mock.n_valid=8` on a new one.
    for old, new in RENAMED_KEYS.items():
        if parts[-1] in (old, new):
            node.pop(new if parts[-1] == old else old, None)
    node[parts[-1]] = value


def _format_validation_error(exc: pydantic.ValidationError, source: str) -> str:
    problems = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<top level>"
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown key '{path}'")
        elif err["type"] == "missing":
            problems.append(f"missing required key '{path}'")
        else:
            message = err["msg"].removeprefix("Value error, ")
            given = err.get("input")
            # a section's own check (a model_validator) names its keys itself: its input is the whole section
            problems.append(f"key '{path}': {message}" + ("" if isinstance(given, dict) else f" (got {given!r})"))
    return f"{source}: " + "; ".join(problems)


# A config holds a few hundred values, a sweep a few thousand; aliases that add more than this to what the file
# writes ("billion laughs": ten aliases of ten aliases of ...) would have validation and error messages walk billions.
MAX_ALIASED_NODES = 100_000


class _Refused(yaml.YAMLError):
    """YAML that parses but that a config may not be: the message names the key or the reason, not the file."""


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, strict where a config must be.

    A key given twice in one mapping is refused (PyYAML keeps the last silently: a second ``distributed:``
    section would drop the first's ``instances``), naming its section path and both lines.  Merge keys keep
    YAML's meaning: in ``{<<: *defaults, lr: 0.1}`` the written ``lr`` overrides the merged one, no duplicate.
    Aliases may not add more than MAX_ALIASED_NODES nodes to what the file writes, nor hold their own anchor.
    """

    def construct_document(self, node):
        sizes = {}
        expanded = _expanded_size(node, sizes, set())
        if expanded - len(sizes) > MAX_ALIASED_NODES:   # len(sizes): the nodes the file writes
            raise _Refused(f"anchors and aliases expand {len(sizes)} YAML nodes to {expanded}, more than the "
                           f"{MAX_ALIASED_NODES} aliases may add to a config")
        self._refuse_duplicate_keys(node, "", set())
        return super().construct_document(node)

    def _refuse_duplicate_keys(self, node, path: str, seen: set) -> None:
        """Each mapping node once (an alias's target is checked where its anchor is), with its section path."""
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._refuse_duplicate_keys(item, f"{path}[{index}]", seen)
        elif isinstance(node, yaml.MappingNode):
            first_line = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":   # its keys are defaults the written ones override
                    self._refuse_duplicate_keys(value_node, path, seen)
                    continue
                if not isinstance(key_node, yaml.ScalarNode):   # ``? [a, b]``: the constructor refuses it unhashable
                    continue
                key = self.construct_object(key_node)   # as the mapping will hold it: `1` and `1.0` are one key
                key_path = f"{path}.{key}" if path else str(key)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise _Refused(f"key '{key_path}' is given twice, at lines {first_line[key]} and {line} (YAML "
                                   "would silently keep the last): give each key once")
                first_line[key] = line
                self._refuse_duplicate_keys(value_node, key_path, seen)


def _expanded_size(node, sizes: dict, open_nodes: set) -> int:
    """How many nodes ``node`` is once every alias is replaced by a copy of its anchor's node."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise _Refused(f"the anchor at line {node.start_mark.line + 1} is used inside itself: the config would "
                       "be infinitely deep")
    open_nodes.add(id(node))
    children = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    sizes[id(node)] = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    return sizes[id(node)]


def _load_yaml(text: str):
    """``text`` as YAML, by the strict loader (a _Refused or another yaml.YAMLError where it is not loadable)."""
    return yaml.load(text, Loader=_StrictLoader)   # noqa: S506 (a SafeLoader: plain data only)


def read_yaml(path: str | pathlib.Path) -> dict:
    """A YAML file's mapping; a ConfigError naming the file if it is missing, not UTF-8, not YAML, not a mapping,
    or repeats a key (naming the key and both lines) or expands without bound through its aliases."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: " + ("a folder, not a YAML config file" if path.is_dir() else "config file not found"))
    try:
        raw = _load_yaml(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); expected a YAML "
                          "config") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    except _Refused as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: invalid YAML{where}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    return raw


def validate(schema: type[ConfigT], raw: dict, source: str) -> ConfigT:
    """``raw`` checked against ``schema``; a ConfigError naming each bad key path and ``source``."""
    try:
        return schema.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None


def load_config(schema: type[ConfigT], path: str | pathlib.Path | None,
                overrides: list[str] | None = None, defaults: dict | None = None) -> ConfigT:
    """Read ``path`` (or ``defaults`` when None), apply overrides, validate; with several instances (or
    instance overrides), every instance's config too, so that every command refuses a bad sweep up front."""
    raw = read_yaml(path) if path is not None else copy.deepcopy(defaults or {})
    source = str(path) if path is not None else "<embedded default config>"
    if overrides:
        source += " (with --set overrides)"
    cfg = validate(schema, apply_overrides(raw, overrides), source)
    distributed = getattr(cfg, "distributed", None)
    if isinstance(distributed, DistributedSection) and (distributed.instances > 1 or distributed.instance_overrides):
        instance_configs(schema, cfg, source)
    return cfg


def instance_configs(schema: type[ConfigT], cfg: ConfigT, source: str | None = None) -> list[ConfigT]:
    """The config of each of ``cfg.distributed.instances`` instances: ``train.seed + k``, then the instance's
    ``distributed.instance_overrides`` entry; each validated (a ConfigError names ``source``, the config's file,
    where given, the instance and the key)."""
    raw = config_to_dict(cfg)
    prefix = f"{source}: " if source else ""
    out = []
    for k in range(cfg.distributed.instances):
        where = f"distributed.instance_overrides[{k}]"
        values = {"train.seed": cfg.train.seed + k, **(cfg.distributed.instance_overrides[k]
                                                      if cfg.distributed.instance_overrides else {})}
        out.append(validate(schema, apply_values(raw, values, prefix + where), f"{prefix}instance {k} ({where})"))
    return out


def config_to_dict(cfg: BaseModel) -> dict:
    """Every key with its resolved value, as plain JSON/YAML types (what ``config.yaml`` records)."""
    return cfg.model_dump(mode="json")


def save_config(cfg: BaseModel, path: str | pathlib.Path, force: bool = False) -> None:
    """Write the resolved config (defaults filled in) as YAML, atomically, never over a user's file."""
    write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False), force=force)
