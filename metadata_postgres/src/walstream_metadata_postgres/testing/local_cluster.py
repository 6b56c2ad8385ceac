"""``walstream local-cluster``: several walstream nodes on this machine, to try a cluster,
failover and the S2 API without any cloud account.

It runs :class:`.cluster.Cluster`: a throwaway PostgreSQL (Debian's ``postgresql`` package), one
moto S3 server and N ``walstream serve`` processes, each with its own deployment file, an s3 WAL
of its own and the ``cluster:`` section at its defaults. Everything it writes is in one folder
(``--folder``, default ``./walstream-cluster``)::

    node-<id>.yaml   the node's deployment (what a user would write for a real deployment)
    node-<id>.log    the node's log (its stderr)
    cluster.json     where everything is, while the cluster runs (``status``, ``kill`` read it)
    env              the same as shell variables: N1 N2 … (node URLs), TOKEN, S3, DSN
    cluster.lock     held by the process that runs the cluster, for as long as it runs
    cluster.log      the output of a cluster started in the background (``start``)

Commands::

    walstream local-cluster up [N]        run N nodes (default 3) until Ctrl-C or SIGTERM;
                                          prints DSN, S3, TOKEN, one NODE line per node
                                          (NODE <id> <url> <deployment> pid <pid>) and ENV
    walstream local-cluster start [N]     the same in the background; returns once every node
                                          answers /health
    walstream local-cluster status        every node: URL, pid, whether /health answers
    walstream local-cluster kill NODE     SIGKILL node NODE (a crash; the others fail it over)
    walstream local-cluster stop          stop a cluster (SIGTERM, then wait until it is gone)

PostgreSQL and moto keep their data in temporary folders deleted at the stop: nothing survives
the cluster. A cluster whose process was SIGKILLed leaves its nodes and PostgreSQL running;
``status`` names their pids.

This module imports the rig (moto, the conformance harness) only when a command runs, so a
missing ``testing`` extra is reported with the line that installs it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["COMMAND", "LocalClusterCommand", "main"]

PROG = "walstream local-cluster"
DEFAULT_FOLDER = Path("walstream-cluster")
DEFAULT_NODES = 3
START_TIMEOUT_S = 180.0
"""``start``: how long every node may take to answer /health (PostgreSQL, moto and N Python
servers starting on a busy machine)."""
STOP_TIMEOUT_S = 90.0
"""``stop``: how long the cluster may take to drain its nodes and stop (then its processes are
killed)."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

STATE_FILE = "cluster.json"
ENV_FILE = "env"
LOCK_FILE = "cluster.lock"
BACKGROUND_LOG = "cluster.log"

INSTALL_HINT = (
    "the local cluster needs the rig of walstream-metadata-postgres: "
    "pip install 'walstream-metadata-postgres[testing]' (or 'walstream[local-cluster]'), "
    "and Debian's postgresql package (apt-get install postgresql)"
)

EPILOG = """\
examples:
  walstream local-cluster up                  # three nodes in ./walstream-cluster, until Ctrl-C
  walstream local-cluster start 3 --folder rig
  . rig/env                                   # N1 N2 N3 TOKEN S3 DSN
  curl -s -H "authorization: Bearer $TOKEN" $N1/health
  walstream local-cluster kill 1 --folder rig
  walstream -c rig/node-2.yaml cluster status
  walstream local-cluster stop --folder rig

Exit status: 0 ok (stop: also when no cluster runs in the folder); 1 the cluster did not
start or stop (its output is printed); 2 usage, no cluster runs in the folder (status, kill),
or one runs there already (up, start).
"""


class LocalClusterCommand:
    """What the ``walstream.cli`` entry point ``local-cluster`` names (see
    :mod:`walstream.cli.extensions`)."""

    description = (
        "Run a cluster of walstream nodes on this machine: a throwaway PostgreSQL, a moto S3 "
        "server and N `walstream serve` processes with leases and automatic failover."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.epilog = EPILOG
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        folder = argparse.ArgumentParser(add_help=False)
        folder.add_argument(
            "--folder",
            type=Path,
            default=DEFAULT_FOLDER,
            metavar="DIR",
            help=f"where the deployments, logs and state live (default ./{DEFAULT_FOLDER})",
        )
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        for name, help_text in (
            ("up", "run the cluster in the foreground until Ctrl-C or SIGTERM"),
            ("start", "run the cluster in the background; returns once every node is healthy"),
        ):
            action = actions.add_parser(name, help=help_text, description=help_text, parents=[folder])
            action.add_argument(
                "nodes",
                nargs="?",
                type=_node_count,
                default=DEFAULT_NODES,
                help=f"how many nodes (default {DEFAULT_NODES})",
            )
            action.add_argument(
                "--token",
                default="cluster-token",
                help="bearer token every node wants (default cluster-token)",
            )
            action.add_argument(
                "--lease",
                metavar="DURATION",
                help="cluster.lease_duration of every node, e.g. 2s (default: walstream's)",
            )
            action.add_argument(
                "--heartbeat",
                metavar="DURATION",
                help="cluster.heartbeat_interval of every node, e.g. 300ms (default: walstream's)",
            )
            if name == "up":
                action.add_argument(
                    "--until-stdin-closes",
                    action="store_true",
                    help="also stop when standard input closes (Ctrl-D; for a parent process "
                    "that holds a pipe)",
                )
                action.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
        actions.add_parser(
            "status",
            help="print every node: URL, pid, health",
            description="Print every node of the cluster: its URL, pid and whether /health "
            "answers. Exit 0 while the cluster runs, 2 when none runs in the folder.",
            parents=[folder],
        )
        kill = actions.add_parser(
            "kill",
            help="SIGKILL one node (a crash)",
            description="SIGKILL one node: it stops with nothing flushed; once its lease "
            "expires another node fails it over.",
            parents=[folder],
        )
        kill.add_argument("node", type=int, help="the node id")
        actions.add_parser(
            "stop",
            help="stop the cluster and wait until it is gone",
            description="Stop the cluster running in the folder (SIGTERM: its nodes drain) and "
            "wait until its process has exited. Exit 0 also when none runs there.",
            parents=[folder],
        )

    def run(self, args: argparse.Namespace) -> int:
        folder: Path = args.folder.absolute()
        try:
            if args.action == "up":
                return _up(args, folder)
            if args.action == "start":
                return _start(args, folder)
            if args.action == "status":
                return _status(folder)
            if args.action == "kill":
                return _kill(folder, args.node)
            return _stop(folder)
        except _Refused as refused:
            print(f"{PROG}: error: {refused}", file=sys.stderr)
            return EXIT_USAGE


COMMAND = LocalClusterCommand()


class _Refused(Exception):
    """A usage error: printed as one line, exit 2."""


def _node_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of nodes, got {text!r}") from None
    if not 1 <= value <= 16:
        raise argparse.ArgumentTypeError(f"between 1 and 16 nodes, got {value}")
    return value


# -- the lock: who runs the cluster of a folder -----------------------------------------------------


def _try_lock(folder: Path) -> int | None:
    """The cluster lock of ``folder``, taken (its fd), or None when a live process holds it."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _running(folder: Path) -> bool:
    """True while a process runs the cluster of ``folder`` (it holds the lock)."""
    if not (folder / LOCK_FILE).exists():
        return False
    fd = _try_lock(folder)
    if fd is None:
        return True
    os.close(fd)
    return False


def _state(folder: Path) -> dict[str, Any]:
    """``cluster.json`` of a running cluster, or :class:`_Refused` saying none runs."""
    path = folder / STATE_FILE
    if not _running(folder) or not path.exists():
        raise _Refused(
            f"no cluster runs in {folder} (start one: {PROG} start --folder {_shown(folder)})"
        )
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def _shown(folder: Path) -> str:
    """``folder`` as the user would type it: relative to the working directory when inside."""
    with contextlib.suppress(ValueError):
        return str(folder.relative_to(Path.cwd())) or "."
    return str(folder)


# -- up ---------------------------------------------------------------------------------------------


def _up(args: argparse.Namespace, folder: Path) -> int:
    try:
        from .cluster import Cluster, ClusterSettings
    except ImportError as missing:
        print(f"{PROG}: error: {INSTALL_HINT} ({missing})", file=sys.stderr)
        return EXIT_USAGE
    folder.mkdir(parents=True, exist_ok=True)
    lock = _try_lock(folder)
    if lock is None:
        raise _Refused(
            f"a cluster already runs in {folder} (stop it: {PROG} stop --folder {_shown(folder)})"
        )
    stop = threading.Event()
    ready_fd: int | None = args.ready_fd

    def request_stop(signum: int, _frame: Any) -> None:
        stop.set()

    previous = {
        signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    if args.until_stdin_closes:

        def stop_at_end_of_input() -> None:
            sys.stdin.read()
            stop.set()

        threading.Thread(target=stop_at_end_of_input, daemon=True).start()
    settings = ClusterSettings(
        nodes=args.nodes,
        token=args.token,
        lease_duration=args.lease,
        heartbeat_interval=args.heartbeat,
        node_logs=True,
    )
    cluster = Cluster(settings, folder=folder)
    try:
        print(f"{PROG}: starting PostgreSQL, moto and {args.nodes} nodes in {folder}", flush=True)
        cluster.start()
        nodes = {
            str(node_id): {
                "url": cluster.url(node_id),
                "pid": node.pid,
                "config": str(node.config_path),
                "log": str(node.log_path),
            }
            for node_id, node in cluster.nodes.items()
        }
        state = {
            "pid": os.getpid(),
            "folder": str(folder),
            "dsn": cluster.postgres.dsn,
            "s3": cluster.s3_endpoint,
            "bucket": "walstream",
            "token": args.token,
            "nodes": nodes,
        }
        _write(folder / STATE_FILE, json.dumps(state, indent=2) + "\n")
        _write(folder / ENV_FILE, _env_text(state))
        _print_state(state)
        print(
            f"{PROG}: ready; Ctrl-C or `{PROG} stop --folder {_shown(folder)}` stops it",
            flush=True,
        )
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)
            ready_fd = None
        stop.wait()
        print(f"{PROG}: stopping", flush=True)
    finally:
        if ready_fd is not None:
            os.close(ready_fd)
        for name in (STATE_FILE, ENV_FILE):
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()
        try:
            cluster.stop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(lock)
    print(f"{PROG}: stopped (deployments and logs stay in {folder})", flush=True)
    return EXIT_OK


def _write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _env_text(state: dict[str, Any]) -> str:
    lines = [f"# walstream local-cluster in {state['folder']}: source it with `. {ENV_FILE}`"]
    lines += [f"N{node_id}={node['url']}" for node_id, node in state["nodes"].items()]
    lines += [f"TOKEN={state['token']}", f"S3={state['s3']}", f"DSN={state['dsn']}"]
    return "\n".join(lines) + "\n"


def _print_state(state: dict[str, Any]) -> None:
    """Where everything is, one ``WHAT value…`` line each (``awk '$1 == "NODE"'`` reads it)."""
    print(f"DSN {state['dsn']}")
    print(f"S3 {state['s3']} bucket {state['bucket']}")
    print(f"TOKEN {state['token']}")
    for node_id, node in state["nodes"].items():
        print(f"NODE {node_id} {node['url']} {node['config']} pid {node['pid']}")
    print(f"ENV {Path(state['folder']) / ENV_FILE}", flush=True)


# -- start (in the background) --------------------------------------------------------------------


def _start(args: argparse.Namespace, folder: Path) -> int:
    try:
        from walstream_conformance.harness.serve import walstream_command
    except ImportError as missing:
        print(f"{PROG}: error: {INSTALL_HINT} ({missing})", file=sys.stderr)
        return EXIT_USAGE
    folder.mkdir(parents=True, exist_ok=True)
    if _running(folder):
        raise _Refused(
            f"a cluster already runs in {folder} (stop it: {PROG} stop --folder {_shown(folder)})"
        )
    read_end, write_end = os.pipe()
    command = [
        *walstream_command(),
        "local-cluster",
        "up",
        str(args.nodes),
        "--folder",
        str(folder),
        "--token",
        args.token,
        "--ready-fd",
        str(write_end),
    ]
    for option, value in (("--lease", args.lease), ("--heartbeat", args.heartbeat)):
        if value is not None:
            command += [option, value]
    log_path = folder / BACKGROUND_LOG
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(write_end,),
            start_new_session=True,  # the terminal's Ctrl-C does not reach it
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    os.close(write_end)
    ready = _read_until_closed(read_end, START_TIMEOUT_S)
    if ready != b"ready\n":
        if ready is None:  # still starting after the timeout
            process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        why = (
            f"not ready within {START_TIMEOUT_S:g}s"
            if ready is None
            else f"exit code {process.returncode}"
        )
        print(
            f"{PROG}: error: the cluster did not start ({why}); its output "
            f"({log_path}):\n{_tail(log_path)}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    state = json.loads((folder / STATE_FILE).read_text())
    _print_state(state)
    print(
        f"{PROG}: running in the background (pid {process.pid}, output in {log_path}); "
        f"stop it with `{PROG} stop --folder {_shown(folder)}`",
        flush=True,
    )
    return EXIT_OK


def _read_until_closed(fd: int, timeout_s: float) -> bytes | None:
    """Everything written to the pipe ``fd`` until its writer closes it; None when that takes
    longer than ``timeout_s`` (the reader thread is abandoned)."""
    chunks: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        with open(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(4096):
                chunks.append(chunk)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout_s):
        return None
    return b"".join(chunks)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.splitlines()[-lines:]) or "(no output)"


# -- status, kill, stop ---------------------------------------------------------------------------


def _status(folder: Path) -> int:
    state = _state(folder)
    print(f"cluster of {state['folder']} (pid {state['pid']})")
    print(f"metadata  {state['dsn']}")
    print(f"s3        {state['s3']}")
    for node_id, node in state["nodes"].items():
        alive = _node_process_alive(node)
        health = _health(node["url"]) if alive else None
        shown = "killed" if not alive else ("healthy" if health else "not answering /health")
        print(f"node {node_id}    {node['url']}  pid {node['pid']}  {shown}")
    return EXIT_OK


def _node_process_alive(node: dict[str, Any]) -> bool:
    """True while the node's pid is a live ``walstream serve`` of its deployment (a reused pid
    is not the node)."""
    try:
        raw = Path(f"/proc/{int(node['pid'])}/cmdline").read_bytes()
    except OSError:
        return False
    arguments = raw.split(b"\0")
    if node["config"].encode() not in arguments:
        return False
    try:  # a killed child the cluster process has not reaped yet is a zombie, not alive
        stat = Path(f"/proc/{int(node['pid'])}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _health(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/health", timeout=5) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _kill(folder: Path, node_id: int) -> int:
    state = _state(folder)
    node = state["nodes"].get(str(node_id))
    if node is None:
        nodes = ", ".join(state["nodes"])
        raise _Refused(f"the cluster in {folder} has no node {node_id} (its nodes: {nodes})")
    if not _node_process_alive(node):
        raise _Refused(f"node {node_id} (pid {node['pid']}) is not running")
    os.kill(int(node["pid"]), signal.SIGKILL)
    print(
        f"killed node {node_id} (pid {node['pid']}, SIGKILL); the other nodes fail it over once "
        "its lease expires"
    )
    return EXIT_OK


def _stop(folder: Path) -> int:
    if not _running(folder):
        # Nothing to stop is not a failure: a script may stop what it is not sure it started.
        print(f"{PROG}: no cluster runs in {folder}")
        return EXIT_OK
    state = _state(folder)
    pid = int(state["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    print(f"{PROG}: stopping the cluster of {folder} (pid {pid})", flush=True)
    if not _wait_for_lock(folder, STOP_TIMEOUT_S):
        # The cluster process is stuck: kill it and what it started.
        for node in state["nodes"].values():
            if _node_process_alive(node):
                os.kill(int(node["pid"]), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        print(
            f"{PROG}: error: the cluster did not stop within {STOP_TIMEOUT_S:g}s; killed it "
            f"and its nodes (PostgreSQL may still run: its data folder is in {state['dsn']})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(f"{PROG}: stopped")
    return EXIT_OK


def _wait_for_lock(folder: Path, timeout_s: float) -> bool:
    """Wait until the cluster process releases the lock of ``folder`` (it has exited)."""
    released = threading.Event()

    def wait() -> None:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the holder exits
            released.set()
        finally:
            os.close(fd)

    threading.Thread(target=wait, daemon=True).start()
    return released.wait(timeout_s)


def main(argv: list[str] | None = None) -> int:
    """``python -m walstream_metadata_postgres.testing.local_cluster``: the same command."""
    parser = argparse.ArgumentParser(prog=PROG, description=COMMAND.description)
    COMMAND.add_arguments(parser)
    return COMMAND.run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
