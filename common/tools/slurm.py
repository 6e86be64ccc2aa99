"""Helpers the SLURM scripts call (slurm/*.sbatch).

    python -m common.tools.slurm env   --config C [--set k=v ...]   # shell assignments for the job
    python -m common.tools.slurm stage --config C [--set k=v ...]   # run under srun: each rank stages its share

``env`` prints ``export`` lines for the Horovod knobs of the config's
``distributed`` section, and ``STAGE_DIR=...`` (empty when the config asks
for no staging; its ``$VARIABLES``, such as ``${SLURM_JOB_ID}``, expanded).
``stage`` builds the datasets once, which copies each rank's share of the
training files to ``data.stage_dir`` in parallel; the training step that
follows finds them in place, checks them, and copies nothing.
"""

from __future__ import annotations

import argparse
import shlex

from common.console import logs
from common.cli import exit_process, find_application, run_command
from common.config import load_config
from common.storage.staging import expand_stage_dir

# Imported where used, not here: TensorFlow and the engine modules that import it, so that --help and argument or
# config errors answer without it.


def horovod_environment(cfg) -> dict[str, str]:
    """The environment the job's ranks need from the config's ``distributed`` section (Horovod's fusion,
    cycle time, hierarchical allreduce...) and HDF5's file locking off."""
    d = cfg.distributed
    env = {"HDF5_USE_FILE_LOCKING": "FALSE"}
    if d.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(d.fusion_threshold_mb * 1024 * 1024))
    if d.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{d.cycle_time_ms:g}"
    if d.hierarchical_allreduce:
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    return env


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m common.tools.slurm")
    parser.add_argument("command", choices=["env", "stage"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--app")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    application = find_application(args.config, args.app)
    cfg = load_config(application.config_schema, args.config, args.set)
    if args.command == "env":
        for key, value in horovod_environment(cfg).items():
            print(f"export {key}={shlex.quote(value)}")
        stage_dir = getattr(cfg.data, "stage_dir", None)   # with its $VARIABLES expanded, as staging does
        print(f"STAGE_DIR={shlex.quote(expand_stage_dir(stage_dir) if stage_dir else '')}")
        return 0
    # deferred: TensorFlow and Horovod; `env` (run inside the batch script) must not load them
    from common import distributed

    dist = distributed.init(cfg.train.intra_op_threads, cfg.train.inter_op_threads,
                            groups=cfg.distributed.groups, instances=cfg.distributed.instances)
    logs.configure(dist.rank, dist.size, ("common", application.package))
    from common.trainer import prepare_data   # deferred: imports TensorFlow, after the arguments are parsed

    datasets = prepare_data(application, cfg, dist)   # the trainer's own: staging happens as it reads
    dist.world_barrier()   # every rank of the job (of every instance) before any leaves
    if dist.world_rank == 0:   # with distributed.instances, every instance staged its own shares
        instances = f" in {dist.instances} instances" if dist.instances > 1 else ""
        stage_dir = expand_stage_dir(cfg.data.stage_dir)
        print(f"staged the training files of {dist.world_size} rank(s){instances} to {stage_dir} "
              f"({datasets.train_samples} samples per epoch)", flush=True)
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="common.tools.slurm"))
