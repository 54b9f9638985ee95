"""runtime/engine/core_share.py: the engine's thread team follows the cores other programs leave
free, from /proc/stat's busy time less this process's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from braid.runtime.engine.core_share import SAMPLE_S, CoreShare, _cpu_busy_seconds


class Machine:
    """A fake clock and CPU counters: each `tick` advances SAMPLE_S, the other programs using
    `others` cores' worth of it and this process `own`."""

    def __init__(self) -> None:
        self.now = self.busy = self.own = 0.0

    def tick(self, others: float, own: float) -> None:
        self.now += SAMPLE_S
        self.busy += (others + own) * SAMPLE_S
        self.own += own * SAMPLE_S


def share(machine: Machine, max_threads: int = 4, cores: int = 4) -> CoreShare:
    return CoreShare(
        max_threads, set(range(cores)), lambda: machine.busy, lambda: machine.own,
        lambda: machine.now,
    )  # fmt: skip


def test_the_team_shrinks_to_the_free_cores_and_grows_back():
    machine = Machine()
    cores = share(machine)
    assert cores.threads() == 4
    sizes = []
    for others in [0, 0, 2, 2, 2, 3.2, 3.2, 0.2, 0.2]:
        machine.tick(others, own=4 - others)
        sizes.append(cores.threads())
    # A new size once two samples agree: 2 free cores, then 1 (never 0), then all 4 again.
    assert sizes == [4, 4, 4, 2, 2, 2, 1, 1, 4]


def test_one_burst_of_other_work_changes_nothing():
    machine = Machine()
    cores = share(machine)
    sizes = []
    for others in [0, 3, 0, 3, 0]:
        machine.tick(others, own=1)
        sizes.append(cores.threads())
    assert sizes == [4] * 5


def test_never_more_than_configured_and_no_sampling_between_ticks():
    machine = Machine()
    cores = share(machine, max_threads=2, cores=8)
    for _ in range(3):
        machine.tick(others=1, own=2)  # 7 cores free, but 2 threads asked for
        assert cores.threads() == 2
    machine.now += SAMPLE_S / 2
    machine.busy += 100  # read only once SAMPLE_S has passed since the last sample
    assert cores.threads() == 2


def test_proc_stat_is_read_for_the_given_cores():
    if not Path("/proc/stat").is_file():
        pytest.skip("no /proc/stat here")
    one, every = _cpu_busy_seconds({0}), _cpu_busy_seconds(set(range(os.cpu_count())))
    assert 0 < one <= every
