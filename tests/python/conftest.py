"""pytest configuration for the qmoe Python suites: the CLI under test, fresh seeds, and a summary
of the largest differences measured against onnxruntime."""

import os
import random
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ortqmoe  # noqa: E402

# A fresh base seed per session unless QMOE_TEST_SEED is set; each test derives its own from it and
# its node id, so one failing test can be reproduced alone.
_BASE_SEED = (int(os.environ.get("QMOE_TEST_SEED", "0"), 0)
              or random.SystemRandom().randrange(1, 2**63))

# name -> (worst value, case id), filled by tests through record_max.
MAXIMA = {}


def pytest_addoption(parser):
    parser.addoption("--qmoe-cli", default=None,
                     help="path of the qmoe CLI (default: $QMOE_CLI, then "
                     + ortqmoe.DEFAULT_CLI + ")")


def pytest_report_header(config):
    cli = ortqmoe.find_cli(config.getoption("--qmoe-cli"))
    return [f"qmoe seed: QMOE_TEST_SEED={_BASE_SEED}", f"qmoe cli: {cli or 'NOT FOUND'}"]


@pytest.fixture(scope="session")
def cli(pytestconfig):
    path = ortqmoe.find_cli(pytestconfig.getoption("--qmoe-cli"))
    if path is None:
        given = pytestconfig.getoption("--qmoe-cli") or os.environ.get("QMOE_CLI")
        where = given or ortqmoe.DEFAULT_CLI
        pytest.fail(f"qmoe CLI not found at {where}; {ortqmoe.BUILD_HINT}", pytrace=False)
    return path


@pytest.fixture
def seed(request):
    s = (_BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**63
    print(f"[seed] {s} (reproduce the whole run with QMOE_TEST_SEED={_BASE_SEED})")
    return s


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.fixture
def record_max(request):
    def record(name, value):
        worst = MAXIMA.get(name)
        if worst is None or value > worst[0]:
            MAXIMA[name] = (value, request.node.name)
    return record


def pytest_terminal_summary(terminalreporter):
    if not MAXIMA:
        return
    terminalreporter.section("qmoe: largest relative-norm differences")
    for name in sorted(MAXIMA):
        value, case = MAXIMA[name]
        terminalreporter.write_line(f"{name:48s} {value:.3e}  ({case})")
    terminalreporter.write_line(f"seed: QMOE_TEST_SEED={_BASE_SEED}")
