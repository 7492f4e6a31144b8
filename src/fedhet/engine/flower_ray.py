"""One Ray head for all the Flower simulations of a command.

Flower's simulation runtime starts Ray when none is connected and shuts it down at the end
of every simulation (flwr 1.41's ``RayBackend.terminate`` calls ``ray.shutdown()``). A
command that runs several Flower runs (a comparison, a grid, a tune) therefore paid Ray's
start-up and teardown once per run. Here the first Flower run of a process starts one local
Ray in a child process (``python -m fedhet.engine.flower_ray``: ``ray.init``, then it waits
for its standard input to close); each simulation connects to it by address, and Flower's
``ray.shutdown()`` then only disconnects. The head stops when the process exits
(``atexit``) or dies (its pipe closes); if the head itself is killed, Ray's reaper stops
its processes. Unlike ``ray start``, this head registers no machine-wide default cluster,
so another program's ``ray.init()`` on the machine still starts its own.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from fedhet.errors import FedhetError

START_TIMEOUT = 120.0  # seconds the head has to accept connections
say = logging.getLogger("fedhet.start")  # what is starting, shown by the command line


@dataclass
class RayHead:
    """A local Ray this process started in a child: the child and its GCS address."""

    process: subprocess.Popen
    address: str
    started_in: float  # seconds from the start until the head took connections

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Close the head's standard input: it shuts its Ray down and exits."""
        if self.alive() and self.process.stdin is not None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


_head: RayHead | None = None


def command_ray_address() -> str:
    """The address of this process's Ray head, started on the first call (one line says
    what starts and how long it took); a head that died is started again."""
    global _head
    if _head is None or not _head.alive():
        cpus = os.cpu_count() or 1
        say.info("flower: starting one local Ray (%d CPUs) for this command's Flower runs", cpus)
        _head = start_head(cpus)
        atexit.register(_head.stop)
        say.info("flower: Ray at %s ready in %.1f s", _head.address, _head.started_in)
    return _head.address


def start_head(cpus: int, timeout: float = START_TIMEOUT) -> RayHead:
    """Start the child that holds a local Ray of ``cpus`` CPUs and read its address; one
    line (with the child's last words) if it exits or says nothing within ``timeout`` s."""
    begin = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "fedhet.engine.flower_ray", str(cpus)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    output, errors = process.stdout, process.stderr
    assert output is not None and errors is not None  # both are pipes
    answer: list[str] = []
    reader = threading.Thread(target=lambda: answer.append(output.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    address = answer[0].strip() if answer else ""
    if not address:
        process.kill()
        if reader.is_alive():
            why = f"no answer within {timeout:g} s"
        else:
            why = (errors.read().strip().splitlines() or ["no output"])[-1]
        raise FedhetError(f"flower: the local Ray did not start ({why})")
    threading.Thread(target=errors.read, daemon=True).start()  # drain Ray's notices
    return RayHead(process, address, time.monotonic() - begin)


def hold_ray(cpus: int) -> None:
    """The child's work: start a local Ray of ``cpus`` CPUs, print its GCS address, keep it
    until standard input closes (the parent stopped or died), then shut it down."""
    import ray

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()
    ray.shutdown()


if __name__ == "__main__":
    hold_ray(int(sys.argv[1]))
