import pathlib

import pytest
import yaml

from common.config import load_config, save_config
from common.errors import ConfigError
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


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs/cosmoflow").glob("*.yaml")))
def test_shipped_configs_validate(name):
    load_config(CosmoflowConfig, REPO / "configs/cosmoflow" / name)


def test_cli_config_error_exits_2_with_one_line(tmp_path):
    path = write(tmp_path, "data: {data_dir: /d}\ntrain: {epoch: 3}\n")
    result = run_python(["-m", "cosmoflow.train", "--config", str(path), "--dry-run"], check=False)
    assert result.returncode == 2
    error_lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(error_lines) == 1 and "unknown key 'train.epoch'" in error_lines[0] and str(path) in error_lines[0]
