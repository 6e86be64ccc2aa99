"""What this environment's TensorFlow and Horovod were built with, as one line.

    python -m common.tools.build_info            # gpu-build: horovod 0.28.1 nccl_built=True mpi=True ...
    python -m common.tools.build_info --require-gpu-build   # exit 1 unless NCCL and CUDA are both built in

The line (its form is pinned: ``make check-gpu-build`` and ``scripts/gpu_check.sh`` print it, and people grep
it) is ``gpu-build: horovod <version> nccl_built=<bool> mpi=<bool> tensorflow <version> cuda_build=<bool>``;
``cuda_build`` is ``tf.test.is_built_with_cuda()``.  It needs no GPU: a CUDA build of TensorFlow without a
driver runs on the CPU.  ``--json`` prints the same facts (and the GPUs TensorFlow sees) as JSON instead.
"""

from __future__ import annotations

import argparse
import json

from common.cli import exit_process, run_command
from common.errors import UserInputError


def build_line(facts: dict) -> str:
    """The pinned one-line form of :func:`build_facts`."""
    return (f"gpu-build: horovod {facts['horovod'] or 'none'} nccl_built={facts['nccl_built']} "
            f"mpi={facts['mpi_built']} tensorflow {facts['tensorflow']} cuda_build={facts['cuda_build']}")


def build_facts() -> dict:
    """Horovod's version and built-in operations, TensorFlow's version, whether it is a CUDA build, and the
    GPUs it sees (imports both)."""
    # deferred: TensorFlow and Horovod load only after the arguments are parsed (--help answers without them)
    import tensorflow as tf
    from common.distributed import horovod_build

    horovod = horovod_build()
    return {"horovod": horovod["version"] if horovod else None,
            "nccl_built": bool(horovod and horovod["nccl_built"]),
            "mpi_built": bool(horovod and horovod["mpi_built"]),
            "gloo_built": bool(horovod and horovod["gloo_built"]),
            "tensorflow": tf.__version__,
            "cuda_build": bool(tf.test.is_built_with_cuda()),
            "gpus_visible": len(tf.config.list_physical_devices("GPU"))}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m common.tools.build_info", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="the facts as one JSON object instead of the line")
    parser.add_argument("--require-gpu-build", action="store_true",
                        help="exit 1 unless Horovod has NCCL and TensorFlow is a CUDA build")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    facts = build_facts()
    print(json.dumps(facts) if args.json else build_line(facts), flush=True)
    if facts["horovod"] is None:
        raise UserInputError("Horovod is not importable in this environment; run `make setup` "
                             "(or `make check-gpu-build` for the GPU build)")
    if args.require_gpu_build and not (facts["nccl_built"] and facts["cuda_build"]):
        missing = [name for name in ("nccl_built", "cuda_build") if not facts[name]]
        print(f"build_info: not a GPU build ({', '.join(missing)} False)", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="common.tools.build_info"))
