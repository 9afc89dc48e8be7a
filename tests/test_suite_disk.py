"""The suite's own disk use: the SmolLM2 tests write hundreds of MB to GBs each (a float32 copy of the GGUF file,
checkpoints of a 135M model), and a run that kept every test's directory to the end filled a CI machine's disk."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import module_scratch


def test_a_passing_tests_directory_is_not_kept(pytestconfig: pytest.Config):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"


def test_a_module_directory_is_removed_when_its_tests_passed_and_kept_when_one_failed(tmp_path_factory):
    request = SimpleNamespace(session=SimpleNamespace(testsfailed=3))
    with module_scratch(request, tmp_path_factory, "passed") as passed:  # type: ignore[arg-type]
        (passed / "model.pt").write_bytes(b"x" * 1000)
    assert not passed.exists()
    with module_scratch(request, tmp_path_factory, "failed") as failed:  # type: ignore[arg-type]
        (failed / "model.pt").write_bytes(b"x" * 1000)
        request.session.testsfailed += 1
    assert (failed / "model.pt").is_file()
