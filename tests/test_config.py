import pathlib
import re
import time

import pytest
import yaml

import common.config
from common import registry
from common.cli import find_application
from common.config import (MAX_ALIASED_NODES, instance_configs, load_config, meaning_keys, network_data_record,
                           read_yaml, save_config)
from common.errors import ConfigError, UserInputError
from common.storage.checkpoint import check_compatible
from cosmoflow.config import CosmoflowConfig
from conftest import REPO, run_python


def write(tmp_path, text) -> pathlib.Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_come_from_the_schema(tmp_path):
    cfg = load_config(CosmoflowConfig, write(tmp_path, "data: {data_dir: /d}\n"))
    assert cfg.data.batch_size == 1
    assert cfg.train.precision == "fp32"
    assert cfg.optimizer.name == "sgd"
    assert cfg.mlperf.enabled is False
    assert cfg.model.base_filters == 32


def test_unknown_key_names_path_and_file(tmp_path):
    path = write(tmp_path, "data: {data_dir: /d, batchsize: 4}\n")
    with pytest.raises(ConfigError) as info:
        load_config(CosmoflowConfig, path)
    message = str(info.value)
    assert str(path) in message and "unknown key 'data.batchsize'" in message
    assert "\n" not in message


def test_wrong_type_names_key(tmp_path):
    path = write(tmp_path, "data: {data_dir: /d}\ntrain: {epochs: many}\n")
    with pytest.raises(ConfigError, match=r"key 'train.epochs'.*'many'"):
        load_config(CosmoflowConfig, path)


@pytest.mark.parametrize("text, key", [
    ("data: {data_dir: /d, batch_size: 0}", "data.batch_size"),
    ("data: {data_dir: /d}\noptimizer: {name: rmsprop}", "optimizer.name"),
    ("data: {data_dir: /d}\ntrain: {precision: fp8}", "train.precision"),
    ("model: {}", "data"),
])
def test_invalid_values_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(CosmoflowConfig, write(tmp_path, text + "\n"))


def test_set_overrides_nested_keys(tmp_path):
    path = write(tmp_path, "data: {data_dir: /d}\n")
    cfg = load_config(CosmoflowConfig, path, ["optimizer.schedule.decay_boundaries={3: 0.5}",
                                              "data.batch_size=16", "model.dense_units=[8, 4]"])
    assert cfg.optimizer.schedule.decay_boundaries == {3: 0.5}
    assert cfg.data.batch_size == 16
    assert cfg.model.dense_units == [8, 4]


@pytest.mark.parametrize("override, pattern", [
    ("data.batch_size", "expected section.key=value"),
    ("data.batch_size.x=3", "is a value, not a section"),
    ("data.nope=3", "unknown key 'data.nope'"),
    ("distributed.instance_overrides=[{train.seed: 1, train.seed: 2}]", r"key '\[0\].train.seed' is given twice"),
])
def test_bad_overrides(tmp_path, override, pattern):
    path = write(tmp_path, "data: {data_dir: /d, batch_size: 2}\n")
    with pytest.raises(ConfigError, match=pattern):
        load_config(CosmoflowConfig, path, [override])


def test_invalid_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d"):
        load_config(CosmoflowConfig, write(tmp_path, "data:\n  - [unclosed\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(CosmoflowConfig, tmp_path / "absent.yaml")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(CosmoflowConfig, REPO / "configs/cosmoflow/mlperf.yaml", ["train.epochs=3"])
    save_config(cfg, tmp_path / "resolved.yaml")
    again = load_config(CosmoflowConfig, tmp_path / "resolved.yaml")
    assert again == cfg
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text())["train"]["epochs"] == 3


APP_CONFIGS = sorted(str(p.relative_to(REPO)) for app in registry.names() for p in (REPO / "configs" / app).glob("*.yaml"))


@pytest.mark.parametrize("name", APP_CONFIGS)
def test_shipped_configs_validate(name):
    load_config(find_application(str(REPO / name)).config_schema, REPO / name)


def test_the_strict_loader_reads_every_shipped_yaml_as_yaml_does():
    """Systems and published points included: the strict loader refuses, it never reads differently."""
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        assert read_yaml(path) == yaml.safe_load(path.read_text()), path


def test_cli_config_error_exits_2_with_one_line(tmp_path):
    path = write(tmp_path, "data: {data_dir: /d}\ntrain: {epoch: 3}\n")
    result = run_python(["-m", "cosmoflow.train", "--config", str(path), "--dry-run"], check=False)
    assert result.returncode == 2
    error_lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(error_lines) == 1 and "unknown key 'train.epoch'" in error_lines[0] and str(path) in error_lines[0]


# -- the strict loader: nothing in a file silently dropped, nothing expanding without bound ----------------------

def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-3000:])
    return lines[0]


@pytest.mark.parametrize("text, key, lines", [
    ("data:\n  data_dir: /d\n  batch_size: 2\n  on_bad_file: skip\n  batch_size: 4\n", "data.batch_size", (3, 5)),
    # A second section: yaml.safe_load would keep only it, dropping `instances` without a word.
    ("data: {data_dir: /d}\ndistributed:\n  instances: 2\ntrain: {epochs: 2}\ndistributed:\n"
     "  gradient_compression: fp16\n", "distributed", (2, 5)),
    ("data: {data_dir: /d}\ndistributed:\n  instances: 2\n  instance_overrides:\n  - {}\n"
     "  - optimizer.learning_rate: 0.1\n    optimizer.learning_rate: 0.2\n",
     "distributed.instance_overrides[1].optimizer.learning_rate", (6, 7)),
    ("data: {data_dir: /d}\noptimizer:\n  schedule:\n    decay_boundaries: {3: 0.5, 3: 0.1}\n",
     "optimizer.schedule.decay_boundaries.3", (4, 4)),
])
def test_a_key_given_twice_names_its_path_and_both_lines(tmp_path, text, key, lines):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(CosmoflowConfig, path)
    message = str(info.value)
    assert message.startswith(f"{path}: key '{key}' is given twice, at lines {lines[0]} and {lines[1]}")
    assert "\n" not in message


def test_merge_keys_keep_their_yaml_meaning(tmp_path):
    """``<<: *base`` then a written key: the written one wins, as YAML defines; that is no duplicate."""
    path = write(tmp_path, "data: {data_dir: /d}\n"
                           "distributed:\n"
                           "  instances: 3\n"
                           "  instance_overrides:\n"
                           "  - &base {optimizer.learning_rate: 0.01, model.dropout: 0.1}\n"
                           "  - <<: *base\n"
                           "    optimizer.learning_rate: 0.02\n"
                           "  - <<: [{optimizer.momentum: 0.5}, *base]\n"
                           "    model.dropout: 0.3\n")
    cfg = load_config(CosmoflowConfig, path)
    configs = instance_configs(CosmoflowConfig, cfg)
    assert [c.optimizer.learning_rate for c in configs] == [0.01, 0.02, 0.01]
    assert [c.model.dropout for c in configs] == [0.1, 0.1, 0.3]
    assert [c.optimizer.momentum for c in configs] == [cfg.optimizer.momentum] * 2 + [0.5]


def billion_laughs(levels: int = 9) -> str:
    """The classic: ten aliases of ten aliases of ... ten values, 10**levels values once expanded."""
    lines = ["data: {data_dir: /d}", "model:", "  dense_units: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]", "train:"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines + [f"optimizer: {{exclude_from_weight_decay: *l{levels - 1}}}"]) + "\n"


def test_billion_laughs_fails_fast_with_one_line(tmp_path):
    """Without the bound, --dry-run walked the billion values in validation for over ten minutes (and SIGTERM,
    a stop request to the trainer, did not end it); the run is killed at the timeout."""
    path = write(tmp_path, billion_laughs())
    started = time.monotonic()
    line = one_error_line(run_python(["-m", "cosmoflow.train", "--config", str(path), "--dry-run"], timeout=120,
                                     check=False))
    assert line.startswith(f"error: {path}: anchors and aliases expand ")
    assert re.search(rf"expand \d+ YAML nodes to \d{{10}}, more than the {MAX_ALIASED_NODES} aliases may add to a "
                     "config$", line)
    assert time.monotonic() - started < 60


def test_an_anchor_used_inside_itself_is_refused(tmp_path):
    path = write(tmp_path, "data: {data_dir: /d}\nmodel:\n  dense_units: &loop [1, *loop]\n")
    with pytest.raises(ConfigError, match=r"the anchor at line 3 is used inside itself"):
        load_config(CosmoflowConfig, path)


def test_only_what_aliases_add_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(common.config, "MAX_ALIASED_NODES", 500)   # the rule with small numbers
    path = write(tmp_path, billion_laughs(levels=2))   # aliases add 100 values: fine
    assert len(read_yaml(path)["optimizer"]["exclude_from_weight_decay"]) == 10
    # What a file writes out is not bounded, only what aliases add: a file's size is the memory it takes.
    path.write_text(f"data: {{data_dir: /d}}\nmodel: {{dense_units: [{', '.join(['1'] * 600)}]}}\n")
    assert len(load_config(CosmoflowConfig, path).model.dense_units) == 600
    path.write_text(billion_laughs(levels=3))   # aliases add 1000
    with pytest.raises(ConfigError, match="more than the 500 aliases may add to a config"):
        read_yaml(path)


# -- distributed.instance_overrides: checked by every command that loads a config, before any rank starts ------

@pytest.mark.parametrize("overrides, expected", [
    ([], "instance 1 (distributed.instance_overrides[1]): unknown key 'optimizer.learning_rat'"),
    (["distributed.instance_overrides=[{}, {data.batch_size: 0}]"],
     "instance 1 (distributed.instance_overrides[1]): key 'data.batch_size': "),
    (["distributed.instance_overrides=[{}, {data.batch_size.x: 1}]"],
     "distributed.instance_overrides[1]: 'data.batch_size.x': data.batch_size is a value, not a section"),
])
def test_load_config_checks_every_instance(tmp_path, overrides, expected):
    path = write(tmp_path, "data: {data_dir: /d}\ndistributed:\n  instances: 2\n"
                           "  instance_overrides: [{}, {optimizer.learning_rat: 0.1}]\n")
    with pytest.raises(ConfigError) as info:
        load_config(CosmoflowConfig, path, overrides)
    assert str(info.value).startswith(f"{path}") and expected in str(info.value)


@pytest.fixture
def no_tensorflow(tmp_path) -> dict:
    """PYTHONPATH for a child in which importing TensorFlow, Keras or Horovod ends it with exit code 97 (no message:
    the start-up filter holds standard error while TensorFlow loads): a config error must answer without them."""
    for module in ("tensorflow", "keras", "horovod"):
        package = tmp_path / "no_tensorflow" / module
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("import os\nos._exit(97)\n")
    return {"PYTHONPATH": str(tmp_path / "no_tensorflow")}


@pytest.mark.parametrize("command", [
    ["-m", "common.tools.slurm", "env"],   # what slurm/launch.sh runs before srun
    ["-m", "cosmoflow.train", "--dry-run"],
    ["-m", "common.tools.check_data"],
    ["-m", "common.tools.bench"],
])
def test_every_command_refuses_a_bad_instance_override(tmp_path, no_tensorflow, command):
    """Each refuses it before TensorFlow loads (the stand-in packages end the process with 97)."""
    path = tmp_path / "cosmoflow" / "sweep.yaml"   # the folder names the application
    path.parent.mkdir()
    path.write_text("data: {data_dir: /d}\ndistributed:\n  instances: 2\n"
                    "  instance_overrides: [{}, {optimizer.learning_rat: 0.1}]\n")
    line = one_error_line(run_python([*command, "--config", str(path)], timeout=300, check=False,
                                     env=no_tensorflow))
    assert line == (f"error: {path}: instance 1 (distributed.instance_overrides[1]): unknown key "
                    "'optimizer.learning_rat'")


@pytest.mark.parametrize("command", [
    ["-m", "common.tools.check_data"],
    ["-m", "common.tools.slurm", "env"],
])
def test_an_application_asked_for_by_name_must_be_registered(no_tensorflow, command):
    """--app names the application: an unknown name is refused (it was once taken as a mere hint, and the
    config's folder chose instead), before TensorFlow loads."""
    result = run_python([*command, "--app", "nosuchapp", "--config", "configs/hep_cnn/demo.yaml"], timeout=300,
                        check=False, env=no_tensorflow)
    assert one_error_line(result).startswith("error: nosuchapp: not a registered application (registered: ")


@pytest.mark.parametrize("task", ["[a, b]", "{x: 1}", "null", "3", "Segmentation"])
def test_a_task_that_is_not_one_of_the_tasks_is_one_line(tmp_path, task):
    path = tmp_path / "climate.yaml"
    path.write_text(f"task: {task}\ndata: {{data_dir: /d}}\n")
    with pytest.raises(ConfigError, match=r"task: expected one of 'segmentation', 'detection', got "):
        find_application(str(path), "climate_seg")


# -- what a checkpoint's weights mean: the schema fields marked MEANING, checked on resume ---------------

# Written out by hand on purpose: the schemas are the source, this pins them (a field marked or unmarked by
# mistake shows here), and a newly registered application must say its own.
MEANING_KEYS = {
    "cosmoflow": ("data.target_names", "data.file_target_names", "data.target_offset", "data.target_scale",
                  "data.apply_log", "data.mock.box_size_mpc_h", "data.mock.redshifts", "data.mock.dynamics",
                  "data.mock.cola_steps", "data.mock.cola_initial_redshift", "data.mock.cola_mesh_factor",
                  "data.mock.omega_m_range", "data.mock.sigma_8_range", "data.mock.n_s_range", "data.mock.h0_range"),
    "hep_cnn": ("data.image_size", "data.channels", "data.scale_by_maxima"),
    "climate_seg": ("data.downsample", "data.normalization"),
    "climate_detection": ("data.grid", "data.file_channels", "data.channels", "data.box_columns", "data.box_classes",
                          "data.normalization"),
}


def test_every_application_marks_the_fields_its_weights_mean():
    marked = {application.name: meaning_keys(application.config_schema)
              for package in registry.names() for application in registry.applications(package)}
    assert marked == MEANING_KEYS


def resume_record(cfg) -> dict:
    """The part of a checkpoint's record that says which network its weights belong to (as
    common.trainer._resume_record writes it)."""
    return {"model": {**cfg.model.model_dump(mode="json"), **network_data_record(cfg)}}


def cosmoflow_config(*overrides):
    return load_config(CosmoflowConfig, None, list(overrides), defaults={"data": {"data_dir": "/d"}})


@pytest.mark.parametrize("override, named", [
    # the parameter range the unitPar outputs stand for (cosmoflow.predict maps them onto it): was resumed silently
    ("data.mock.omega_m_range=[0.1, 0.5]", "data.mock.omega_m_range [0.2, 0.4], this run has [0.1, 0.5]"),
    ("model.base_filters=8", "model.base_filters 32, this run has 8"),
])
def test_a_resume_that_changed_what_the_weights_mean_is_refused_naming_the_key(override, named):
    written = resume_record(cosmoflow_config())
    with pytest.raises(UserInputError) as refused:
        check_compatible("ckpt-epoch-00001.npz", written, {}, [], [], resume_record(cosmoflow_config(override)))
    assert str(refused.value).startswith(f"ckpt-epoch-00001.npz: written with {named} (the network its weights "
                                         "belong to); not resumed")


def test_a_checkpoint_written_before_a_field_was_marked_is_compared_on_the_fields_it_records():
    written = resume_record(cosmoflow_config())
    for key in ("data.mock.redshifts", "data.mock.omega_m_range", "data.mock.sigma_8_range", "data.mock.n_s_range",
                "data.mock.h0_range"):
        del written["model"][key]   # what a checkpoint recorded before the ranges were marked
    check_compatible("ckpt-epoch-00001.npz", written, {}, [], [],
                     resume_record(cosmoflow_config("data.mock.omega_m_range=[0.1, 0.5]")))
    with pytest.raises(UserInputError, match=r"written with data\.apply_log True, this run has False"):
        check_compatible("ckpt-epoch-00001.npz", written, {}, [], [],
                         resume_record(cosmoflow_config("data.apply_log=false")))
