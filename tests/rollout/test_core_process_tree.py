"""process_tree.owning_leftovers: a run's scope that adopts orphans and ends what is left at its end."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

import agenttune.rollout.process_tree as process_tree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")

# Starts a grandchild in a new session, prints its pid and exits: the grandchild is orphaned at once.
STARTER = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({seconds})'], "
           "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)")


def orphan(seconds: float) -> int:
    done = subprocess.run([sys.executable, "-c", STARTER.format(seconds=seconds)], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_orphans_started_within_are_adopted_and_killed_those_from_before_are_spared():
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    reports: list[list[str]] = []
    try:
        with process_tree.owning_leftovers(reports.append):
            assert process_tree.is_subreaper()
            pid = orphan(300)
            assert psutil.Process(pid).ppid() == psutil.Process().pid  # adopted here, not by init
            exited = orphan(0.1)  # adopted, then exits during the run: a zombie until reaped
            time.sleep(0.5)
        assert not psutil.pid_exists(pid)
        assert not psutil.pid_exists(exited)  # reaped, not left a zombie
        assert [len(report) for report in reports] == [1] and reports[0][0].startswith(f"{pid} ")
        assert before.poll() is None  # was there before the run: not the run's to kill
        assert not process_tree.is_subreaper()  # put back as it was
    finally:
        before.kill()
        before.wait()


def test_nothing_left_reports_nothing():
    reports: list[list[str]] = []
    with process_tree.owning_leftovers(reports.append):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert reports == []


def test_a_process_kept_after_the_run_is_spared_and_the_others_are_killed():
    reports: list[list[str]] = []
    with process_tree.owning_leftovers(reports.append):
        kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        process_tree.keep_after_run(kept.pid)  # a service the caller started during the run and stops itself
        left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert kept.poll() is None
        assert left.wait(timeout=10) is not None  # killed at the run's end
        assert [report[0].split()[0] for report in reports] == [str(left.pid)]
    finally:
        kept.kill()
        kept.wait()
