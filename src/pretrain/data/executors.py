"""Where the tasks of `pretrain prepare --tasks N` run: datatrove's executors on this machine
(LocalPipelineExecutor), as a Slurm job array (SlurmPipelineExecutor) or on Ray (RayPipelineExecutor). Each
takes the pipeline steps sharded.py builds; datatrove is imported only when one runs, so `prepare --help` and
the argument checks stay light."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..files import write_atomic
from ..progress import counting_bar

EXECUTORS = ("local", "slurm", "ray")


@dataclass(frozen=True)
class SlurmOptions:
    """What `sbatch` is told (https://slurm.schedmd.com/sbatch.html): every task takes one CPU."""

    partition: str
    time: str = "24:00:00"
    mem_per_cpu_gb: int = 2  # a task's peak RSS stays under 1 GiB (benchmarks/bench_prepare.py)
    qos: str = ""  # none unless given: a cluster without a "normal" QOS refuses one
    job_name: str = "pretrain-prepare"
    sbatch_args: dict = field(default_factory=dict)  # more #SBATCH lines, e.g. {"account": "proj"}
    env_command: str = ""  # run before each task; default: activate the Python environment running prepare


@contextlib.contextmanager
def logs_aside(logs: str, tasks: int | None = None) -> Iterator[None]:
    """datatrove's logs (the launcher's and those of the tasks it runs or forks) go to LOGS/launcher.log and
    each task's to LOGS/logs/task_NNNNN.log, not to the terminal: a failing task's traceback and every task's
    pipeline and stats would bury the one-line error `prepare` ends with. With `tasks`, the terminal shows how
    many are done (a bar, on a terminal only) from datatrove's completion marks."""
    from datatrove.utils.logging import setup_default_logger

    terminal, log_file = sys.stderr, Path(logs) / "launcher.log"
    done = len(list((Path(logs) / "completions").glob("*"))) if tasks else 0
    if tasks and done:
        print(f"{done} of {tasks} tasks were done by an earlier run; running the other {tasks - done}", file=terminal)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", buffering=1) as log, contextlib.redirect_stderr(log):
        setup_default_logger()  # datatrove's sink: sys.stderr as it is now; each task adds the same
        try:
            with counting_bar("tokenize", enabled=bool(tasks), file=terminal) as advance:
                stop = threading.Event()
                if advance is not None:
                    threading.Thread(target=_count_completions, args=(logs, tasks, advance, stop), daemon=True).start()
                try:
                    yield
                finally:
                    stop.set()
        finally:
            sys.stderr = terminal
            setup_default_logger()


def _count_completions(logs: str, tasks: int, advance, stop: threading.Event) -> None:
    completions = Path(logs) / "completions"
    while not stop.wait(0.5):
        advance(len(list(completions.glob("*"))) if completions.is_dir() else 0, tasks, "tasks")


def run_local(pipeline: list[Any], tasks: int, workers: int | None, logs: str) -> None:
    """The tasks on this machine: `workers` at once (default all cores)."""
    import multiprocess.util
    from datatrove.executor import LocalPipelineExecutor

    from .preparation import default_workers

    # One task at a time runs in this process; more run in a pool of forked processes (this process holds no
    # threads or tokenizer state yet). Each forked process (pool workers, datatrove's Manager) watches this one.
    watch = LauncherWatch()  # referenced until run() returns: the registry holds it weakly
    multiprocess.util.register_after_fork(watch, LauncherWatch.start)
    with logs_aside(logs, tasks):
        LocalPipelineExecutor(
            pipeline,
            tasks=tasks,
            workers=min(tasks, workers or default_workers()),
            logging_dir=logs,
            start_method="fork",
        ).run()


class LauncherWatch:
    """Started in each process datatrove's local executor forks: it exits within 0.2 s of the `pretrain prepare`
    that forked it (killed, say). Nothing else stops them: an orphaned pool worker would go on writing its
    shard while a rerun writes the same one, and datatrove's Manager process would wait forever."""

    def __init__(self):
        self.pid = os.getpid()

    def start(self) -> None:
        # prepare's SIGTERM handler (raise KeyboardInterrupt) is inherited by fork: the pool ends its workers
        # with SIGTERM, which must end them, not raise inside a Manager call and leave them hanging.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        threading.Thread(target=self._watch, daemon=True, name="exit-with-launcher").start()

    def _watch(self) -> None:
        # The forked processes are the launcher's children: the kernel re-parents them the moment it exits,
        # even while it is an unreaped zombie (which os.kill(pid, 0) would still find).
        while os.getppid() == self.pid:
            time.sleep(0.2)
        os._exit(1)


def run_ray(pipeline: list[Any], tasks: int, workers: int | None, logs: str) -> None:
    """The tasks on Ray: the cluster at RAY_ADDRESS when set (`ray start --head` on the head node), else a
    local one started here with `workers` CPUs (https://docs.ray.io/en/latest/ray-core/starting-ray.html).

    A cluster the user started is left running; the tasks are actors of this driver, which Ray ends when the
    driver ends, however it ends (an actor's lifetime is its owner's unless it is "detached"), and datatrove
    cancels them when run() raises. A local instance ends with this process, however it ends: RayReaper."""
    try:
        import ray
    except ImportError:
        raise UsageError('--executor ray needs ray: pip install "pretrain[ray]" (or pip install ray)') from None
    from datatrove.executor.ray import RayPipelineExecutor

    from .preparation import default_workers

    reaper = None
    with logs_aside(logs, tasks):
        # The tasks' output stays in their log files (log_to_driver), Ray's own goes where sys.stderr does now.
        if not ray.is_initialized():
            if os.environ.get("RAY_ADDRESS"):
                ray.init(log_to_driver=False, configure_logging=False)
            else:
                reaper = RayReaper()
                ray.init(
                    num_cpus=workers or default_workers(),
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
        try:
            RayPipelineExecutor(
                pipeline, tasks=tasks, workers=workers or -1, logging_dir=logs, cpus_per_task=1, mem_per_cpu_gb=2
            ).run()
        finally:
            if reaper is not None:
                ray.shutdown()
                reaper.release()


class RayReaper:
    """Ends every process of the local Ray instance this process starts when this process ends, SIGKILL
    included. ray.init's own fate sharing takes the GCS and the raylet with a killed driver, but not the
    raylet's agents (DashboardAgent, RuntimeEnvAgent), nor always the task workers and what they fork.

    A watchdog process, started before Ray, follows this process's descendants (every Ray process is one:
    the GCS and raylet are its children, the agents and workers the raylet's) until this process ends (EOF on
    its stdin: the pipe's only writer is this process), then kills every one it saw that still runs, and
    their children."""

    def __init__(self):
        # Its own session: a Ctrl-C in the terminal does not end it before it has swept.
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import RayReaper; RayReaper.watch({os.getpid()})"],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )

    def release(self) -> None:
        """After ray.shutdown(): the watchdog sweeps what remains, now."""
        assert self.watchdog.stdin is not None  # stdin=PIPE
        self.watchdog.stdin.close()
        self.watchdog.wait()

    @staticmethod
    def watch(launcher_pid: int) -> None:
        import select

        import psutil

        launcher, seen = psutil.Process(launcher_pid), {}

        def look(process):  # its descendants but this watchdog, as psutil.Process (pid and start time)
            for child in process.children(recursive=True):
                if child.pid != os.getpid():
                    seen.setdefault(child.pid, child)

        # Orphans are re-parented away from the launcher at once: look often enough to have seen each.
        while not select.select([sys.stdin], [], [], 0.1)[0]:
            try:
                look(launcher)
            except psutil.NoSuchProcess:
                break
        for _ in range(50):  # a dying raylet may still start a worker: sweep until none is left
            alive = []
            for process in list(seen.values()):
                try:
                    look(process)
                    if process.status() != psutil.STATUS_ZOMBIE:
                        process.kill()
                        alive.append(process)
                except psutil.NoSuchProcess:
                    del seen[process.pid]
            if not alive:
                return
            psutil.wait_procs(alive, timeout=0.2)


def submit_slurm(
    tokenize: list, manifest: list, logs: Path, tasks: int, workers: int | None, slurm: SlurmOptions, record: Path
) -> None:
    """The job array of the `tokenize` steps (one array task per datatrove task) and, depending on it, a one-task
    job of the `manifest` steps; their job ids go to `record` (see refuse_while_slurm_builds)."""
    from datatrove.executor.slurm import SlurmPipelineExecutor

    env_command = slurm.env_command or (f"source {sys.prefix}/bin/activate" if sys.prefix != sys.base_prefix else "")
    common: dict[str, Any] = dict(
        time=slurm.time,
        partition=slurm.partition,
        cpus_per_task=1,
        mem_per_cpu_gb=slurm.mem_per_cpu_gb,
        qos=slurm.qos,
        sbatch_args=dict(slurm.sbatch_args),
        env_command=env_command or None,
        mail_type="NONE",
    )
    array = SlurmPipelineExecutor(
        tokenize,
        tasks=tasks,
        workers=workers or -1,
        job_name=slurm.job_name,
        logging_dir=str(logs / "tokenize"),
        **common,
    )
    last = SlurmPipelineExecutor(
        manifest,
        tasks=1,
        job_name=f"{slurm.job_name}-manifest",
        depends=array,
        logging_dir=str(logs / "manifest"),
        **common,
    )
    try:
        with logs_aside(str(logs / "tokenize")):
            last.run()  # submits the array first
    except subprocess.CalledProcessError as e:  # sbatch printed why on stderr
        raise UsageError(
            f"sbatch refused the job (exit {e.returncode}, its message is above): fix the --slurm-* "
            "or --sbatch options and run the same command again"
        ) from None
    jobs = [str(job) for job in (array.job_id, last.job_id) if job not in (None, -1)]  # -1: nothing to run
    write_atomic(record, json.dumps({"jobs": jobs}) + "\n")


def refuse_while_slurm_builds(record: Path, what: str) -> None:
    """UsageError while a Slurm job that an earlier `prepare` submitted for `what` has not ended: its launcher
    returns at once, and a second one would delete or rewrite OUT.partial under the running array. `record`
    holds the job ids (the array's, then the manifest job's, which waits for the array); squeue lists a job
    until it ends, and forgets it some minutes later ("Invalid job id")."""
    if not record.is_file():
        return
    jobs = json.loads(record.read_text(encoding="utf-8"))["jobs"]
    ids = ",".join(jobs)
    if jobs and shutil.which("squeue") is None:
        raise UsageError(
            f"{what} was submitted as Slurm job {ids} and squeue is not here to tell whether it "
            f"still runs: run this where Slurm is, or once the job has ended delete {record}"
        )
    queued = (
        subprocess.run(["squeue", "--noheader", "--format=%i %T %r", f"--jobs={ids}"], capture_output=True, text=True)
        if jobs
        else None
    )
    if queued and queued.returncode and "Invalid job id" not in queued.stderr:
        raise UsageError(
            f"squeue --jobs={ids} failed ({' '.join(queued.stderr.split())[:200]}); {what} was "
            f"submitted as Slurm job {ids}: run this again once squeue works"
        )
    live = queued.stdout.splitlines() if queued and not queued.returncode else []
    if live:
        raise UsageError(
            f"{what} is being built by Slurm job {ids} (squeue: {live[-1]}); wait for it to end, or "
            f"stop it with `scancel {' '.join(jobs)}`"
        )
    record.unlink()
