"""`braid bench grammar --test-suite DIR`: the JSON-Schema-Test-Suite's layout (files of test
groups) scored as MaskBench is, one case a group, each compiled and its instances judged."""

from __future__ import annotations

import json

from braid.runtime.cli.main import main

_GROUPS = [
    {
        "description": "a bounded integer",
        "schema": {"type": "integer", "minimum": 0, "maximum": 9},
        "tests": [
            {"description": "in range", "data": 3, "valid": True},
            {"description": "above", "data": 12, "valid": False},
            {"description": "a string", "data": "3", "valid": False},
        ],
    },
    {
        "description": "a remote ref",
        "schema": {"$ref": "http://localhost:1234/integer.json"},
        "tests": [{"description": "anything", "data": 1, "valid": True}],
    },
]


def test_each_group_is_a_case_compiled_and_judged(tmp_path):
    suite, corpus = tmp_path / "draft2020-12", tmp_path / "corpus"
    suite.mkdir()
    corpus.mkdir()
    (suite / "bounds.json").write_text(json.dumps(_GROUPS))
    out = tmp_path / "grammar.json"
    argv = ["bench", "grammar", "--test-suite", str(suite), "--corpus", str(corpus)]
    assert main([*argv, "--skip-e2e", "--json", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "grammar-test-suite.json").read_text())}
    assert rows["bounds_0"]["status"] == "pass"
    assert rows["bounds_1"]["status"] == "compile_error"
    assert "http://localhost:1234/integer.json" in rows["bounds_1"]["error"]
    summary = json.loads(out.read_text())["test_suite"]
    assert (summary["schemas"], summary["passing"], summary["compile_errors"]) == (2, 1, 1)
