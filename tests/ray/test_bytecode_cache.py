"""Issue 48: a worker's imports where the environment forbids writing bytecode (the GPU image sets
PYTHONDONTWRITEBYTECODE=1): without a place for it, every worker compiled every module from source again (peft's import
took 20.5 s so on the H100, 11.6 s with its bytecode kept). run/ray_env.keep_bytecode keeps it under the cache."""

from __future__ import annotations

import importlib.util
import py_compile
import sys
from pathlib import Path

import pytest

from medgpt_ray.run.ray_env import keep_bytecode, worker_env


@pytest.fixture
def bytecode_forbidden(monkeypatch, tmp_path):
    """The driver's environment as the GPU image's: bytecode forbidden, no prefix; the cache under tmp_path. This
    process's own sys settings come back afterwards (keep_bytecode changes them)."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv("MEDGPT_RAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.setattr(sys, "pycache_prefix", sys.pycache_prefix)
    return tmp_path


def _installed_without_bytecode(root: Path, monkeypatch, compiled: bool = False) -> tuple[str]:
    """A package installed as pip --no-compile leaves it (or compiled, as pip does by default)."""
    site = root / "site"
    (site / "bytecode_probe_pkg").mkdir(parents=True)
    init = site / "bytecode_probe_pkg" / "__init__.py"
    init.write_text("")
    if compiled:
        py_compile.compile(str(init), cfile=importlib.util.cache_from_source(str(init)))
    monkeypatch.syspath_prepend(str(site))
    return ("bytecode_probe_pkg",)


def test_a_worker_keeps_its_bytecode_under_the_cache_where_the_environment_forbids_writing_it(
        ray_cluster, bytecode_forbidden, monkeypatch):
    source = bytecode_forbidden / "src"
    source.mkdir()
    (source / "bytecode_probe_module.py").write_text("VALUE = 'imported'\n")
    prefix = keep_bytecode(_installed_without_bytecode(bytecode_forbidden, monkeypatch))
    assert prefix == str(bytecode_forbidden / "cache" / "pycache")
    env = worker_env()
    assert env["PYTHONDONTWRITEBYTECODE"] == "" and env["PYTHONPYCACHEPREFIX"] == prefix

    def import_in_worker(source_dir: str) -> tuple[int, str | None, str]:  # defined here: pickled by value
        import importlib
        import sys

        sys.path.insert(0, source_dir)
        module = importlib.import_module("bytecode_probe_module")
        return sys.flags.dont_write_bytecode, sys.pycache_prefix, module.VALUE

    # A fresh worker process with the stage workers' environment (a runtime env of its own: not a reused worker).
    task = ray_cluster.remote(import_in_worker).options(runtime_env={"env_vars": env})
    flag, worker_prefix, value = ray_cluster.get(task.remote(str(source)), timeout=120)
    assert (flag, worker_prefix, value) == (0, prefix, "imported")
    assert list(Path(prefix).rglob("bytecode_probe_module.*.pyc")), "the worker wrote no bytecode under the cache"
    assert not (source / "__pycache__").exists(), "bytecode went beside the sources, which the setting forbids"


def test_nothing_changes_where_bytecode_is_allowed_installed_or_the_user_named_its_place(bytecode_forbidden,
                                                                                        monkeypatch):
    compiled = _installed_without_bytecode(bytecode_forbidden, monkeypatch, compiled=True)
    assert keep_bytecode(compiled) is None  # compiled at install: nothing to gain, a compile of everything to pay
    assert worker_env()["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in worker_env()

    (bytecode_forbidden / "site" / "bytecode_probe_pkg" / "__pycache__").rename(bytecode_forbidden / "gone")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(bytecode_forbidden / "mine"))
    assert keep_bytecode(compiled) is None
    assert worker_env()["PYTHONPYCACHEPREFIX"] == str(bytecode_forbidden / "mine")  # passed on as it is
    assert worker_env()["PYTHONDONTWRITEBYTECODE"] == "1"

    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert keep_bytecode(compiled) is None
    assert not {"PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"} & set(worker_env())
