"""Everything about ranks.  The only module in the project that imports Horovod.

``init()`` returns a :class:`Distributed` object; the rest of the code asks it
for rank, size, allreduces and broadcasts and never calls ``hvd.*`` itself.
When the process was not started by a launcher (horovodrun, mpirun, srun with
more than one task) a single-process backend with the same API is used, so
the same code runs on a laptop without Horovod installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from common.deferred import tensorflow as tf   # at first use: the launcher (launch) never needs it
from common.errors import UserInputError
from common.storage.transaction import write_json_file

# Imported where used, not here: Horovod, only in a process that a launcher (horovodrun, mpirun, srun) started as
# one of several ranks (and horovodrun's runner in :func:`launch`).

log = logging.getLogger(__name__)

# Variables of Keras 3 random seed generators (dropout and friends).  They are
# left out of the initial broadcast so that ranks keep different dropout masks.
SEED_STATE_MARKER = "seed_generator"

_LAUNCHER_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")


def launched_world_size() -> int:
    """World size announced by a launcher in the environment (1 when none)."""
    if "HOROVOD_RANK" in os.environ or "HOROVOD_SIZE" in os.environ:
        return int(os.environ.get("HOROVOD_SIZE", "1"))
    for name in _LAUNCHER_SIZE_VARIABLES[1:]:
        value = os.environ.get(name)
        if value and value.isdigit() and int(value) > 1:
            # srun without a step of several tasks leaves SLURM_NTASKS of the
            # allocation; only SLURM_STEP_NUM_TASKS / SLURM_PROCID say we are a step.
            if name == "SLURM_NTASKS" and "SLURM_PROCID" not in os.environ:
                continue
            return int(value)
    return 1


def single_process_environment(environ=None) -> dict[str, str]:
    """``environ`` (default: this process's) without what a launcher tells its ranks about their world (rank,
    size, the PMI/PMIx and Horovod variables), so that a child process started by one rank runs as a run of one
    process (:mod:`common.tools.sysbench` times a one-node run so)."""
    environ = dict(os.environ if environ is None else environ)
    launcher = ("HOROVOD_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MPI_LOCAL")
    return {k: v for k, v in environ.items()
            if not k.startswith(launcher) and k not in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS")}


def _local_size_hint() -> int:
    for name in ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "").split("(")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


class Distributed:
    """One process: rank 0 of 1.  Every collective is the identity.

    The API every other module uses; :class:`HorovodDistributed` is the same over
    Horovod ranks.  (Tests stand in for one rank of many by setting ``rank`` and
    ``size`` on an instance: the collectives stay identities.)
    """

    backend = "single"
    controller: str | None = None   # how Horovod's ranks found each other: mpi or gloo

    def __init__(self):
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        # Hybrid mode (SC17): synchronous groups of contiguous ranks, asynchronous across groups.
        self.groups, self.group_size, self.group_index, self.group_root = 1, 1, 0, 0
        self.is_group_leader = True
        # Instances (distributed.instances): independent models on contiguous ranks.  rank and size above are
        # this instance's; world_rank and world_size the job's.
        self.instances, self.instance_index, self.world_rank, self.world_size = 1, 0, 0, 1

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        """Nodes in the job, counted as ranks over ranks per node (1 for a single process)."""
        return max(1, self.size // max(1, self.local_size))

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, local_rank={self.local_rank})"

    # -- collectives (identities here) -------------------------------------------------------
    def allreduce_gradients(self, gradients, compression: str = "none"):
        """Average gradients over ranks (one grouped allreduce; ``compression="fp16"`` halves the bytes)."""
        return list(gradients)

    def allreduce(self, value, average: bool = True, name: str | None = None, group_only: bool = False):
        """Sum or average a tensor over ranks (eager or in a tf.function); ``group_only``: over this rank's
        synchronous group."""
        return tf.convert_to_tensor(value)

    def start_leader_average(self, arrays: list[np.ndarray], name: str):
        """Hybrid mode's asynchronous average of ``arrays`` across group leaders; a single
        process has no other group."""
        raise RuntimeError("cross-group exchanges need Horovod ranks in several groups")

    def broadcast_in_group(self, variables) -> None:
        """Copy variables from this group's leader to the rest of the group."""

    def average_scalars(self, values: dict[str, float]) -> dict[str, float]:
        """Average a dict of Python numbers over ranks (same keys on every rank)."""
        return dict(values)

    def sum_array(self, array: np.ndarray) -> np.ndarray:
        """Element-wise sum of a numpy array over ranks."""
        return np.asarray(array)

    def broadcast_object(self, obj, root_rank: int = 0):
        """Send a picklable Python object from ``root_rank`` to every rank."""
        return obj

    def allgather_object(self, obj) -> list:
        """A picklable Python object from every rank, as a list indexed by rank."""
        return [obj]

    def broadcast_variables(self, variables, root_rank: int = 0) -> None:
        """Copy the values of Keras (or tf) variables from ``root_rank`` to all (not the dropout seed state)."""

    def barrier(self) -> None:
        """Return when every rank (of this instance) has got here."""

    def world_barrier(self) -> None:
        """Return when every rank of the job, every instance's, has got here."""

    def world_allgather_object(self, obj) -> list:
        """A picklable Python object from every rank of the job, as a list indexed by world rank."""
        return [obj]

    def shutdown(self) -> None:
        """End this process's part in the job (every rank calls it, after its last collective): Horovod's
        background loop stops, and no collective works afterwards."""

    def prefix_job(self, participants: int, reduce_gradients: bool = True) -> "Distributed | None":
        """The first ``participants`` ranks as a job of their own (every collective among them only), or None on
        the ranks outside it; with ``reduce_gradients=False`` a step reduces everything but its gradients (a
        microbenchmark: :mod:`common.tools.sysbench` times the step of a rank in a job without the gradient
        allreduce; :func:`common.tools.sysbench.time_allreduce` times allreduces in one).  One process is its own
        job of one."""
        if participants != 1:
            raise ValueError(f"a job of one process has no {participants} ranks")
        return self


class HorovodDistributed(Distributed):
    """Horovod ranks (horovodrun, mpirun, srun)."""

    backend = "horovod"

    def __init__(self, hvd, groups: int = 1, process_sets=None, instances: int = 1, instance_set=None,
                 prefix_sets: dict | None = None):
        super().__init__()
        self._hvd = hvd
        self.world_rank, self.world_size = hvd.rank(), hvd.size()
        # With instances, every collective below stays inside this instance's process set; Horovod names the
        # root of a broadcast by its world rank, hence the offset.
        self.instances = instances
        self.size = self.world_size // instances
        self.instance_index = self.world_rank // self.size
        self._offset = self.instance_index * self.size
        self.rank = self.world_rank - self._offset
        self._instance_set = instance_set
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.controller = "mpi" if hvd.mpi_enabled() else "gloo"
        self.groups = groups
        self.group_size = self.size // groups
        self.group_index = self.rank // self.group_size
        self.group_root = self.group_index * self.group_size
        self.is_group_leader = self.rank == self.group_root
        self._group_set, self._leaders_set = process_sets if process_sets else (None, None)
        self._exchanger = None
        self._prefix_sets = dict(prefix_sets or {})
        self._reduce_gradients = True

    def _everyone(self) -> dict:
        """The process set of "every rank": this instance's, or Horovod's global one."""
        return {"process_set": self._instance_set} if self._instance_set is not None else {}

    def allreduce_gradients(self, gradients, compression: str = "none"):
        """Gradients averaged over the ranks of this group (sparse ones made dense, ``None`` kept), in one grouped
        allreduce, optionally sent as fp16."""
        if self.group_size == 1 or not self._reduce_gradients:
            return list(gradients)
        hvd = self._hvd
        dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]
        present = [i for i, g in enumerate(dense) if g is not None]
        codec = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        reduced = hvd.grouped_allreduce([dense[i] for i in present], op=hvd.Average, compression=codec,
                                        **self._within_group())
        out = list(dense)
        for i, g in zip(present, reduced):
            out[i] = g
        return out

    def _within_group(self) -> dict:
        return {"process_set": self._group_set} if self._group_set is not None else self._everyone()

    def allreduce(self, value, average: bool = True, name: str | None = None, group_only: bool = False):
        """``value`` averaged (or summed) over every rank, or only over this rank's group with ``group_only``."""
        if group_only and self.group_size == 1:
            return tf.convert_to_tensor(value)
        op = self._hvd.Average if average else self._hvd.Sum
        scope = self._within_group() if group_only else self._everyone()
        return self._hvd.allreduce(tf.convert_to_tensor(value), op=op, name=name, **scope)

    def start_leader_average(self, arrays: list[np.ndarray], name: str):
        """Group leaders only: average ``arrays`` over the leaders in a background thread.

        Returns a future whose result is the list of averaged arrays; the
        caller keeps training meanwhile (each leader's own group never waits
        for the exchange until it needs the result).
        """
        if self._exchanger is None:
            self._exchanger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="group-exchange")
        hvd, leaders = self._hvd, self._leaders_set

        def exchange():
            tensors = [tf.constant(a) for a in arrays]
            reduced = hvd.grouped_allreduce(tensors, op=hvd.Average, process_set=leaders, name=name)
            return [r.numpy() for r in reduced]

        return self._exchanger.submit(exchange)

    def broadcast_in_group(self, variables) -> None:
        """``variables`` set to the group root's values on every rank of this group."""
        if self.group_size == 1:
            return
        self._hvd.broadcast_variables([getattr(v, "value", v) for v in variables],
                                      root_rank=self._offset + self.group_root, process_set=self._group_set)

    def average_scalars(self, values: dict[str, float]) -> dict[str, float]:
        """Each named scalar averaged over every rank, in one float64 allreduce (keys sorted, so every rank agrees)."""
        if not values:
            return {}
        keys = sorted(values)
        vector = tf.constant([float(values[k]) for k in keys], dtype=tf.float64)
        averaged = self._hvd.allreduce(vector, op=self._hvd.Average, name="average_scalars",
                                       **self._everyone()).numpy()
        return {k: float(v) for k, v in zip(keys, averaged)}

    def sum_array(self, array: np.ndarray) -> np.ndarray:
        """``array`` summed element-wise over every rank."""
        return self._hvd.allreduce(tf.convert_to_tensor(array), op=self._hvd.Sum, name="sum_array",
                                   **self._everyone()).numpy()

    def broadcast_object(self, obj, root_rank: int = 0):
        return self._hvd.broadcast_object(obj, root_rank=self._offset + root_rank, **self._everyone())

    def allgather_object(self, obj) -> list:
        return self._hvd.allgather_object(obj, **self._everyone())

    def broadcast_variables(self, variables, root_rank: int = 0) -> None:
        """``variables`` set to ``root_rank``'s values on every rank, except the dropout seed state (each rank keeps
        its own)."""
        raw = [getattr(v, "value", v) for v in variables if SEED_STATE_MARKER not in getattr(v, "path", v.name)]
        if raw:
            self._hvd.broadcast_variables(raw, root_rank=self._offset + root_rank, **self._everyone())

    def barrier(self) -> None:
        # horovod.tensorflow has no barrier op; a tiny allreduce is one.
        self._hvd.allreduce(tf.constant(0.0), op=self._hvd.Sum, name="barrier", **self._everyone())

    def world_barrier(self) -> None:
        self._hvd.allreduce(tf.constant(0.0), op=self._hvd.Sum, name="world_barrier")

    def world_allgather_object(self, obj) -> list:
        return self._hvd.allgather_object(obj, name="world_allgather_object")

    def shutdown(self) -> None:
        global _CURRENT
        self._hvd.shutdown()
        _CURRENT = None

    def prefix_job(self, participants: int, reduce_gradients: bool = True) -> "Distributed | None":
        if participants > self.world_size or self.instances > 1 or self.groups > 1 or (
                participants < self.world_size and participants not in self._prefix_sets):
            raise ValueError(f"no process set of the first {participants} ranks (distributed.init(prefix_sets=True))")
        if self.world_rank >= participants:
            return None
        scope = self._prefix_sets[participants] if participants < self.world_size else None
        view = HorovodDistributed(self._hvd, instance_set=scope, prefix_sets=self._prefix_sets)
        view.size = view.group_size = participants
        view._reduce_gradients = reduce_gradients
        return view


_CURRENT: Distributed | None = None
_THREADS_CONFIGURED = False


def horovod_build() -> dict | None:
    """What the installed Horovod was built with: ``{"version", "nccl_built", "mpi_built", "gloo_built"}``, or
    None when Horovod is not importable (an import error of a broken build, such as an undefined symbol, is
    raised: TensorFlow loads Horovod's op library at import)."""
    try:
        # deferred: Horovod is optional for one process
        import horovod
        import horovod.tensorflow as hvd_module
    except ModuleNotFoundError:
        return None
    return {"version": horovod.__version__, "nccl_built": bool(hvd_module.nccl_built()),
            "mpi_built": bool(hvd_module.mpi_built()), "gloo_built": bool(hvd_module.gloo_built())}


def init(intra_op_threads: int = 0, inter_op_threads: int = 0, pin_gpu: bool = True, groups: int = 1,
         instances: int = 1, prefix_sets: bool = False) -> Distributed:
    """Start the distributed backend once per process and return it.

    Horovod is used when a launcher says the world has more than one rank or
    when horovodrun started us; otherwise a single-process backend (with a
    warning when Horovod is not even importable, since multi-rank runs need it).

    Threads: with ``intra_op_threads=0`` each rank takes its share of this
    node's cores, so N ranks on one machine do not oversubscribe it.

    ``groups > 1`` registers Horovod process sets: each group of size / groups
    contiguous ranks, and the set of group leaders (every group's first rank).

    ``instances > 1`` registers one process set per instance (size / instances
    contiguous ranks) and returns this rank's instance as "every rank": rank,
    size and every collective are the instance's; ``world_*`` are the job's.

    ``prefix_sets`` registers a process set of the first p ranks for every p
    from 2 to size - 1 (:meth:`Distributed.prefix_job`: jobs of fewer ranks than
    the job's; not with groups or instances).
    """
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT

    launched = launched_world_size()
    hvd = None
    try:
        # deferred: Horovod is optional for one process; its absence is an error only for several ranks
        import horovod.tensorflow as hvd_module
    except ImportError as exc:
        if launched > 1 or "HOROVOD_RANK" in os.environ:
            raise UserInputError(
                f"launched as {launched} ranks but Horovod is not importable ({exc}); run `make setup`") from None
        warnings.warn("Horovod is not importable; running as a single process", RuntimeWarning, stacklevel=2)
        hvd_module = None
    process_sets, instance_set, prefixes = None, None, {}
    if hvd_module is not None and (launched > 1 or "HOROVOD_RANK" in os.environ):
        if prefix_sets:
            prefixes = {p: hvd_module.ProcessSet(list(range(p))) for p in range(2, launched)}
            hvd_module.init(process_sets=list(prefixes.values()))
        elif instances > 1:
            instance_size, instance_sets = _contiguous_sets(hvd_module, launched, instances, "instances")
            hvd_module.init(process_sets=instance_sets)
            instance_set = instance_sets[hvd_module.rank() // instance_size]
        elif groups > 1:
            group_size, group_sets = _contiguous_sets(hvd_module, launched, groups, "groups")
            leaders_set = hvd_module.ProcessSet([g * group_size for g in range(groups)])
            hvd_module.init(process_sets=[*group_sets, leaders_set] if group_size > 1 else [leaders_set])
            rank = hvd_module.rank()
            mine = group_sets[rank // group_size] if group_size > 1 else None
            process_sets = (mine, leaders_set)
        else:
            hvd_module.init()
        hvd = hvd_module
    elif groups > 1:
        raise UserInputError(f"distributed.groups={groups} needs at least {groups} Horovod ranks")
    elif instances > 1:
        raise UserInputError(f"distributed.instances={instances} needs at least {instances} Horovod ranks "
                             f"(launch with horovodrun -np N, srun or mpirun)")

    local_size = hvd.local_size() if hvd is not None else _local_size_hint() if launched > 1 else 1
    configure_threads(intra_op_threads, inter_op_threads, local_size)
    dist = (HorovodDistributed(hvd, groups=groups, process_sets=process_sets, instances=instances,
                               instance_set=instance_set, prefix_sets=prefixes) if hvd is not None else Distributed())
    if pin_gpu:
        _pin_gpu(dist.local_rank)
    _CURRENT = dist
    return dist


def _contiguous_sets(hvd_module, ranks: int, parts: int, key: str):
    """(ranks per part, one Horovod process set of contiguous ranks per part); ``key`` names the config key."""
    if ranks % parts:
        raise UserInputError(f"distributed.{key}={parts} does not divide the {ranks} ranks")
    size = ranks // parts
    return size, [hvd_module.ProcessSet(list(range(k * size, (k + 1) * size))) for k in range(parts)]


def configure_threads(intra_op_threads: int, inter_op_threads: int, local_size: int) -> None:
    """TensorFlow's thread pools: ``intra_op_threads`` (0: this node's cores over ``local_size`` ranks) and
    ``inter_op_threads`` (0: TensorFlow's default); once, before TensorFlow starts (later calls change nothing)."""
    global _THREADS_CONFIGURED
    if _THREADS_CONFIGURED:
        return
    _THREADS_CONFIGURED = True
    if intra_op_threads == 0:
        intra_op_threads = max(1, (os.cpu_count() or 1) // max(1, local_size))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        if inter_op_threads:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    except RuntimeError:
        log.warning("TensorFlow was already initialised; thread settings left as they are")


def _pin_gpu(local_rank: int) -> None:
    """One GPU per rank: rank k on a node sees only its k-th GPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    try:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
        log.warning("TensorFlow was already initialised; GPU pinning left as it is")


def launch(argv: list[str]) -> int:
    """``horovodrun argv...``, with horovodrun's build check answered from a record of this Horovod build.

    Before it starts any rank, horovodrun asks whether Horovod was built with Gloo (``--gloo``) or MPI by
    importing Horovod's TensorFlow extension, so TensorFlow, in a child process: about 6 s of one core on every
    launch, and TensorFlow's start-up lines in the launcher's output.  The answer belongs to the installed build,
    so it is recorded once per build (the extension library's and TensorFlow's files, this interpreter:
    :func:`_build_record_path`) and read back.  Only a "built" answer is taken from the record: a "not built"
    one, a record that cannot be written or read, and the commands that start no rank (``--help``,
    ``--version``, ``--check-build``) leave horovodrun to check as it always does.  Everything else is
    horovodrun's own: arguments, rank output, exit codes.
    """
    try:
        from horovod.runner import launch as runner   # deferred: only a launcher process needs horovodrun's runner
    except ModuleNotFoundError as exc:
        raise UserInputError(f"Horovod is not importable here ({exc}); run `make setup` (it builds Horovod: "
                             "scripts/build_horovod.sh)") from None

    starts_ranks = not {"-h", "--help", "-v", "--version", "-cb", "--check-build"} & set(argv)
    build = _recorded_build() if starts_ranks else None
    if build is not None:
        if build["gloo_built"]:
            runner.gloo_built = lambda verbose=False: True
        if build["mpi_built"]:
            runner.mpi_built = lambda verbose=False: True
    sys.argv = ["horovodrun", *argv]
    try:
        return runner.run_commandline()
    except RuntimeError as exc:
        # horovodrun's way of saying a rank failed is a RuntimeError, which its own command line prints as a
        # traceback of the launcher; here it is one line after the ranks' output, and horovodrun's exit code, 1.
        said = str(exc)
        first = re.search(r"Process name: (\S+)\s+Exit code: (-?\d+)", said)
        if first:
            print(f"error: a rank failed and Horovod stopped the job: the first was rank {first[1]}, "
                  f"Exit code: {first[2]} (its lines above say why)", file=sys.stderr, flush=True)
            return 1
        if said.startswith("mpirun failed with exit code"):
            print(f"error: {said} (the ranks' lines above say why)", file=sys.stderr, flush=True)
            return 1
        raise


def _build_record_path() -> pathlib.Path | None:
    """Where :func:`launch` keeps what this build of Horovod was built with: a file in the suite's cache folder
    (beside the cached Horovod wheels; ``$XDG_CACHE_HOME`` when it is an absolute path, as the XDG rules say,
    else ``~/.cache``) named by the identity of the files the answer comes from, so a rebuilt or reinstalled
    Horovod or TensorFlow, or another interpreter, gets a record of its own.  None without Horovod."""
    horovod, tensorflow = importlib.util.find_spec("horovod"), importlib.util.find_spec("tensorflow")
    if horovod is None or tensorflow is None or not horovod.submodule_search_locations:
        return None
    libraries = sorted(pathlib.Path(horovod.submodule_search_locations[0], "tensorflow").glob("mpi_lib*.so"))
    identity = [sys.executable]
    for path in [*libraries, pathlib.Path(tensorflow.origin)]:
        stat = path.stat()
        identity.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}")
    key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:24]
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or "")
    if not cache.is_absolute():
        cache = pathlib.Path.home() / ".cache"
    return cache / "hpc-dl-suite" / "horovod-builds" / f"{key}.json"


def _recorded_build() -> dict | None:
    """``{"gloo_built", "mpi_built"}`` of this Horovod build: read from its record, or found out once (a child
    process imports the extension, as horovodrun's own check does) and recorded; None when neither works."""
    def whole(record) -> bool:
        return isinstance(record, dict) and all(isinstance(record.get(k), bool) for k in ("gloo_built", "mpi_built"))

    try:
        path = _build_record_path()
        if path is None:
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):   # none yet, or not one (cut short, edited): found out again
            record = None
        if whole(record):
            return record
        found = subprocess.run([sys.executable, "-c", "import json; from common.distributed import horovod_build; "
                                "print(json.dumps(horovod_build()))"], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        record = json.loads(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
    if not whole(record):
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # force: the file at this name is the suite's own record (a link there is replaced, not written through)
        write_json_file(path, record, "common.distributed", force=True, source="horovodrun --check-build")
    except (OSError, UserInputError):   # not kept (a read-only or full cache): the answer still serves this launch
        pass
    return record
