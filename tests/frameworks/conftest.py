"""The frameworks check: transformers', PEFT's, TRL's, Accelerate's, DeepSpeed's and torchtitan's own
code as the judge of longseq's planner and exports. Run by scripts/frameworks-check.sh (CI's last
stage) in the virtual environment of tests/frameworks/requirements.txt."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def longseq_binary():
    binary = os.environ.get("LONGSEQ_BINARY", str(ROOT / "build" / "cli" / "longseq"))
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no longseq binary at {binary} (build it, or set LONGSEQ_BINARY)")
    return binary
