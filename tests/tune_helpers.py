"""What the autotuner's tests share: a GPU stand-in and candidates on a fake clock, so that
the tuner's choices are checked without a GPU (``tests/test_tune.py``,
``test_tune_requires.py``, ``test_tune_requires_per_call.py``); and the C++ launcher's
rule evaluator run on cases in a subprocess (``test_requires.py``,
``test_tune_requires_per_call.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch

from pnex_magic.compiler import ResourceUsage
from pnex_magic.launch import autotune


def fake_gpu(monkeypatch) -> None:
    """The tuner sees an sm_90 "Fake GPU" whose kernels take 16 registers, and may time."""
    monkeypatch.setattr(autotune, "_device_facts", lambda index: ("Fake GPU", "sm_90"))
    monkeypatch.setattr(autotune, "_resources", lambda d, arch, layout, variant=0: ResourceUsage(16, 0, 0, 0, 0, 0, 0, 0))
    monkeypatch.delenv("PNEX_AUTOTUNE", raising=False)


class FakeClock:
    """Candidates on a fake clock: candidate (block ``b``, Tune values ``v...``) takes
    ``times[(b[0], *v)]`` seconds (a candidate missing there is a KeyError: it must not be
    timed); ``runs`` lists the candidates run, in order.  ``n_threads(variant)``: the
    call's threads with a variant's values (default 4096)."""

    def __init__(self, spec, times, n_threads=None):
        self.spec, self.times, self.runs = spec, times, []
        self.n_threads = n_threads or (lambda variant: (4096,))

    def runner(self):
        return autotune.Runner(self.run, lambda: None, self.n_threads, torch.device("cpu"))

    def run(self, index):
        self.runs.append(index)
        return [torch.ones(3)]

    def seconds(self, call, device):
        call()
        block, variant = self.spec.launch_candidates[self.runs[-1]]
        return self.times[(block[0], *self.spec.tune_variants[variant])]


CHECK_RULES_CHILD = """
import json, sys
from pnex_magic.launch import native
launcher = native.load_launcher(built_only=True)  # the session's build (PNEX_CACHE_DIR), never a new one
kernel, cases = json.loads(sys.stdin.read())
print("RESULT " + json.dumps([launcher.check_rules(c["rules"], kernel, c["sizes"], c["ints"]) for c in cases]))
"""


def cpp_check_rules(kernel: str, cases: list[dict], built_launcher, stand_in, pnex_env) -> list:
    """Each case (``rules``: programs, ``sizes`` and ``ints`` per parameter) through the C++
    launcher's ``check_rules`` test entry (the code its argument checks run), in a process
    with the session's stand-in build: per case, the message of the first rule broken
    ("" if none) and each rule's value."""
    import launcher_stand_in

    env = dict(launcher_stand_in.environment(pnex_env, stand_in), PNEX_CACHE_DIR=str(built_launcher.parent.parent),
               PNEX_LAUNCHER="native")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECK_RULES_CHILD)],
                          input=json.dumps([kernel, cases]), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "RESULT " in done.stdout, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])
