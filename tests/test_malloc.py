"""host.keep_freed_memory: glibc's malloc keeps what the process frees (a step's tensors) for its next allocations
instead of handing it back to the system, which a process without it does; runs record the setting."""

import json
import os
import platform
import subprocess
import sys

import pytest

from skiplab import host
from tests.train.test_distributed import ROOT

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# a fresh process frees six 24 MiB tensors it has written, and reports its resident memory before and after
PROBE = """
import json, os, sys
import torch
from skiplab import host
kept = host.keep_freed_memory() if sys.argv[1] == "keep" else None
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
tensors = [torch.ones(6 << 20) for _ in range(6)]
held = rss()
del tensors
print(json.dumps({"kept": kept, "freed_mib": (held - rss()) / 2**20, "settings": host.malloc_settings()}))
"""


def probe(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in [k for k in env if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"]:
        env.pop(k)
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_kept_memory_stays_with_the_process_and_is_handed_back_without():
    default, kept = probe("default"), probe("keep")
    assert default["kept"] is None and default["freed_mib"] > 100  # the 144 MiB went back to the system
    assert kept["kept"] == {"mmap_threshold": 32 << 20, "trim_threshold": 2**31 - 1}
    assert kept["freed_mib"] < 8  # kept in the heap for the next step
    assert kept["settings"] == {"kept": kept["kept"], "env": {}} and default["settings"]["kept"] is None


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_setting_is_applied_once_and_recorded_in_the_environment(monkeypatch):
    first = host.keep_freed_memory()
    assert host.keep_freed_memory() is first and host.environment()["malloc"]["kept"] == first
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert host.malloc_settings()["env"] == {"MALLOC_ARENA_MAX": "2"}


def test_elsewhere_nothing_changes(monkeypatch):
    monkeypatch.setattr(host, "_kept", None)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert host.keep_freed_memory() is None and host.malloc_settings()["kept"] is None
