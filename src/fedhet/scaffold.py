"""``fedhet new rule NAME``: a plug-in package for a new aggregation rule, ready to install,
test and bench.

The package holds a rule that already runs (a steps-weighted average of the local work each
client finished by the deadline, with every hook a rule may override written out and
documented), its entry point, a test that runs ``fedhet check`` on it and a bench suite that
compares it with SALF, drop-stragglers and FedAvg. ``pip install -e .`` and ``pytest`` pass
on it as created; from there the author edits ``aggregate`` and the hooks."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from string import Template

from fedhet.errors import ConfigError

NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")

PYPROJECT = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "$name"
version = "0.1.0"
description = "The $name aggregation rule for fedhet"
requires-python = ">=3.11"
dependencies = ["fedhet"]

[project.optional-dependencies]
test = ["pytest>=8"]  # python -m pip install -e ".[test]"

# Installed (pip install -e .), the rule answers to [algorithm] name = "$name".
[project.entry-points."fedhet.algorithms"]
$name = "$package.rule:$cls"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

RULE = '''"""The $name rule: the server steps by the average of the clients' updates, each weighted by
the local steps it finished by the deadline (a client that finished none sends nothing).

A rule is a few parts; this one writes its aggregation and its client part and keeps the
shared planner and reporting. Edit ``aggregate`` (and the client hook) to make it yours.
Round numbers count from 0 in these hooks (``context.plan.round``) and from 1 in what
fedhet prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedhet.algorithms import Aggregation, Algorithm, ClientPart
from fedhet.errors import ConfigError


@dataclass
class ${cls}Options:
    """The rule's ``[algorithm]`` keys: ``server_lr``, eta_s in w + eta_s sum_u a_u Delta_u."""

    server_lr: float = 1.0  # eta_s, the server's step on the weighted average

    def validate(self) -> None:
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr = {self.server_lr}: must be > 0")


class StepsWeightedMean(Aggregation):
    """Server side: the new global model from the round's updates. The part may keep
    server memory across rounds (``init_state``, checkpointed with the run)."""

    def aggregate(self, params, buffers, updates, state, context, layout):
        """New global (params, buffers) from this round's updates (sorted by client)."""
        weights = torch.tensor([float(u.steps) for u in updates])
        if not updates or not weights.sum() > 0:
            return params, buffers  # nobody delivered: keep the model
        weights = weights / weights.sum()
        step = sum(w * u.delta for w, u in zip(weights, updates, strict=True))
        new_buffers = buffers
        if buffers.numel():
            buffer_step = sum(w * u.delta_buffers for w, u in zip(weights, updates, strict=True))
            new_buffers = buffers + buffer_step
        return params + self.options.server_lr * step, new_buffers


class PlainSGD(ClientPart):
    """Client side: each hook runs on the client, over its own state (a local loss,
    sample selection and what it does after its steps are hooks too)."""

    def gradient_correction(self, task, state, region, local, anchor):
        """A term added to each local step's gradient over ``region`` (FedProx's
        mu (w - w_t)); None: plain SGD."""
        return None


class $cls(Algorithm):
    """A client delivers the whole local steps it finished by the deadline
    (``partial_work = "steps"``); the server averages the updates with weights a_u
    proportional to those steps."""

    name = "$name"
    summary = "steps-weighted average of the clients' finished local work"
    Options = ${cls}Options
    partial_work = "steps"  # "none": only finishers are asked; "layers": SALF's layer cut
    # tuned by `fedhet bench` beside the learning rate (a search-space range per option)
    hyperparameters: ClassVar[dict] = {"server_lr": {"low": 0.25, "high": 2.0, "log": True}}
    # The parts it changes. The planner (deadline, learning rate, each client's batch and
    # steps; each client's task cut to its outcome) and the reporting are the defaults:
    # set ``Planner`` or ``Reporting`` to a subclass of fedhet.algorithms.Planner/Reporting.
    Aggregation = StepsWeightedMean
    Client = PlainSGD
'''

TEST = '''"""The $name rule passes `fedhet check` (class, rounds, interrupted and resumed), and its
aggregation is the steps-weighted average it says it is."""

from __future__ import annotations

import torch

from fedhet.cli import main


def test_the_rule_passes_fedhet_check():
    assert main(["check", "$package.rule:$cls", "--rounds", "5"]) == 0


def _round(rule_path: str):
    """A real round of a tiny run: the world, the rule, and the first round's context (plan,
    drawn outcomes, marginals) as the engine builds them."""
    import numpy as np

    from fedhet.algorithms.types import RoundContext
    from fedhet.config import from_dict
    from fedhet.world import build_world

    world = build_world(from_dict({
        "run": {"name": "t", "seed": 1, "threads": 1, "device": "cpu"},
        "data": {"dataset": "digits", "num_clients": 2},
        "model": {"name": "mlp", "hidden": [8]},
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": rule_path},
    }))
    rule, system = world.algorithm, world.server_system
    state = rule.init_state(world.setting())
    plan = rule.planner.plan(0, state, system, 1.0)
    outcomes = system.sample(plan.workload(), np.random.default_rng(0))
    context = RoundContext(plan, outcomes, system.marginals(plan.workload()), world.num_clients,
                           world.flat.num_layers, client_sizes=world.client_sizes)
    return world, rule, state, context


def test_aggregate_weights_updates_by_the_steps_they_finished():
    from fedhet.messages import ClientUpdate, Coverage

    world, rule, state, context = _round("$package.rule:$cls")
    size = world.initial_params.numel()
    updates = [
        ClientUpdate(client=u, coverage=Coverage(), steps=steps, num_samples=8, loss=0.0,
                     delta=torch.full((size,), value), delta_buffers=torch.zeros(0))
        for u, (steps, value) in enumerate([(1, 3.0), (3, -1.0)])
    ]
    params, _ = rule.aggregation.aggregate(world.initial_params, world.initial_buffers, updates, state,
                                           context, world.flat.layout)
    assert torch.allclose(params, world.initial_params)  # (1 x 3 + 3 x -1) / 4 = 0
'''

SUITE = """# $name against SALF, drop-stragglers and FedAvg on scikit-learn's digits, two straggler
# scenarios, 4 tuning trials per method and scenario, 3 seeds (about a minute on two cores):
#   fedhet bench suites/$name.toml
[suite]
name = "$name"
description = "the $name rule against SALF, drop-stragglers and FedAvg"
methods = ["$name", "salf", "drop", "fedavg"]   # "$name": the entry point pip install -e . made
trials = 4
seeds = 3
validation_fraction = 0.2
objective = "final_test_accuracy"
random_trials = 2
pruner = "none"

[params]
"train.lr" = { low = 0.02, high = 0.5, log = true }

[run]
seed = 1
rounds = 100000           # the time budget ends every run
time_budget = 30.0        # simulated seconds, the same for every method
eval_every = 10

[data]
dataset = "digits"
partition = "dirichlet"
alpha = 0.5
num_clients = 10

[model]
name = "mlp"
hidden = [32]

[train]
batch_size = 16
local_steps = 3

[system]
model = "per-step"
time_per_sample_step = 0.002    # a step of 16 examples: 0.032 s / P_u
capability_profile = "lognormal"
capability_sigma = 0.8
deadline = 0.2

[scenarios.lognormal]
description = "capabilities lognormal (sigma 0.8): slow clients finish fewer of their 3 steps"

[scenarios.wide]
description = "a wider spread of capabilities (sigma 1.2)"
"system.capability_sigma" = 1.2
"""

README = """# $name

A fedhet aggregation rule, as a plug-in package (made by `fedhet new rule $name`).

```bash
python -m pip install -e ".[test]"    # registers [algorithm] name = "$name" (and pytest)
python -m pytest                      # fedhet check on the rule, and its aggregation
fedhet bench suites/$name.toml        # against SALF, drop-stragglers and FedAvg
```

The rule is `src/$package/rule.py`: its aggregation and client parts; edit `aggregate` and
the hooks there.
"""


MAX_NAME = 40  # characters: a package, a class and a suite file are named after it


def check_rule_name(name: str) -> None:
    """Refuse, in one line, a name the package could not use: not lower case letters, digits,
    ``-`` or ``_``; longer than :data:`MAX_NAME`; a Python keyword; the name of an importable
    module (fedhet, torch, numpy, a standard module: importing the rule would find that one)
    or of a built-in rule (two rules of one name)."""
    import importlib.util
    import keyword

    from fedhet.registry import builtins

    label = f"fedhet new rule {name!r}"
    if not NAME.fullmatch(name):
        raise ConfigError(f"{label}: a rule name is lower case letters, digits, - or _")
    if len(name) > MAX_NAME:
        raise ConfigError(f"{label}: {len(name)} characters; a rule name has at most {MAX_NAME}")
    package = name.replace("-", "_")
    if keyword.iskeyword(package) or keyword.issoftkeyword(package):
        raise ConfigError(f"{label}: {package!r} is a Python keyword; choose another name")
    if package in sys.stdlib_module_names or importlib.util.find_spec(package) is not None:
        raise ConfigError(f"{label}: a module {package!r} is already importable here; choose another name")
    if name in builtins("algorithm"):
        raise ConfigError(f"{label}: fedhet has a built-in rule of that name; choose another name")


def new_rule(name: str, out: Path) -> Path:
    """Write the package for rule ``name`` (lower case, digits, ``-`` or ``_``) into
    ``out / name`` and return that folder; an existing folder is refused."""
    check_rule_name(name)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a folder")
    folder = out / name
    if folder.exists():
        raise ConfigError(f"{folder}: already exists; choose another name or --out")
    package = name.replace("-", "_")
    cls = "".join(part.capitalize() for part in re.split(r"[-_]", name))
    values = {"name": name, "package": package, "cls": cls}
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"src/{package}/__init__.py": '"""The $name rule for fedhet."""\n',
        f"src/{package}/rule.py": RULE,
        "tests/test_rule.py": TEST,
        f"suites/{name}.toml": SUITE,
    }
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values))
    return folder
