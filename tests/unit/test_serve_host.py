"""`serve --host` beyond loopback without an API key is refused before Ray starts, naming the fix (issue 48 item 4);
loopback, a key, or an explicit --no-api-key pass."""

from __future__ import annotations

import pytest

from medgpt_ray.cli import main
from medgpt_ray.cli.serve import open_to_all


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "myhost.example"])
def test_an_open_host_without_a_key_is_refused(host):
    with pytest.raises(ValueError, match=f"--host {host} without an API key.*--no-api-key"):
        open_to_all(host, None, False)


@pytest.mark.parametrize("host, key, accepted", [("127.0.0.1", None, False), ("localhost", None, False),
                                                 ("::1", None, False), ("0.0.0.0", "k", False),
                                                 ("0.0.0.0", None, True)])
def test_loopback_a_key_or_an_explicit_choice_pass(host, key, accepted):
    open_to_all(host, key, accepted)


def test_the_cli_says_so_and_starts_nothing(tiny_model, capsys, monkeypatch):
    monkeypatch.delenv("MEDGPT_RAY_API_KEY", raising=False)
    assert main(["serve", "--model", str(tiny_model), "--template", "chatml", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "error: --host 0.0.0.0 without an API key" in err and "Traceback" not in err


def test_the_issues_name_for_the_choice_is_the_same_flag():
    import argparse

    from medgpt_ray.cli.serve import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    for flag in ("--no-api-key", "--allow-no-key"):
        assert parser.parse_args(["--model", "m", "--host", "0.0.0.0", flag]).no_api_key is True
    assert parser.parse_args(["--model", "m"]).no_api_key is False
