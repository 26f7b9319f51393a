"""The ``sweep`` param checked against the RunConfig (every refusal names the point and the key), the
member run folders, and the ranking with a failed member: plain functions on real files, no Airflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY


@pytest.fixture
def base():
    from pipelines.config import load_config

    return load_config(TINY)


def _refusal(base, spec) -> dict[str, str]:
    from pipelines.config import ConfigError
    from pipelines.sweep import points

    with pytest.raises(ConfigError) as info:
        points.members(base, spec)
    return info.value.errors


def test_a_grid_is_every_combination_and_a_list_is_its_points(base):
    from pipelines.sweep import points

    grid = points.members(base, {"train.lr": [0.001, 0.0003], "model.n_layer": [1, 3]})
    assert [m.point for m in grid] == [{"train.lr": 0.001, "model.n_layer": 1}, {"train.lr": 0.001, "model.n_layer": 3},
                                       {"train.lr": 0.0003, "model.n_layer": 1}, {"train.lr": 0.0003, "model.n_layer": 3}]
    assert (grid[3].config.train.lr, grid[3].config.model.n_layer) == (0.0003, 3)
    assert grid[3].config.train.steps == base.train.steps and grid[3].config.name == base.name
    listed = points.members(base, [{"train.lr": 0.001}, {"train.lr": 0.0003, "train.steps": 200}])
    assert [m.index for m in listed] == [0, 1] and listed[1].config.train.steps == 200


@pytest.mark.parametrize(("spec", "errors"), [
    ({"train.lrr": [0.1, 0.2]}, {"sweep[0].train.lrr": "did you mean 'lr'?"}),
    ([{"train.lr": 0.1}, {"train.lr": -1}], {"sweep[1].train.lr": "greater than 0"}),
    ([{"train": 1}, {"train.lr": 0.2}], {"sweep[0].train": "a section, not a leaf"}),
    ([{"data.train": "x"}, {"tokenizer.vocab_size": 300}, {"pack.seq_len": 16}, {"name": "x"}, {"eval.seed": 1}],
     {"sweep[0].data.train": "not sweepable", "sweep[1].tokenizer.vocab_size": "not sweepable",
      "sweep[2].pack.seq_len": "not sweepable", "sweep[3].name": "not sweepable", "sweep[4].eval.seed": "only the deployment sets this"}),
    ([{"model.n_head": 3}, {"train.lr": 0.2}], {"sweep[0].model": "multiple of n_head"}),
    ([{"train.lr": 0.1}, {"train.steps": 7}, {"train.lr": 0.1}], {"sweep[2]": "same config as sweep[0]"}),
    ({"train.lr": [0.1]}, {"sweep": "1 member(s); a sweep has 2 to 16"}),
    ({"train.lr": [0.001 * i for i in range(1, 18)]}, {"sweep": "17 member(s)"}),
    ({"train.lr": 0.1}, {"sweep.train.lr": "non-empty list"}),
    ([{"train.lr": 0.1}, []], {"sweep[1]": "a mapping of dotted config leaves"}),
    ("train.lr=0.1", {"sweep": "expected a grid"}),
])
def test_bad_sweeps_are_refused_naming_point_and_key(base, spec, errors):
    found = _refusal(base, spec)
    for key, reason in errors.items():
        assert reason in found.get(key, ""), found


def _shared_run(base, root: Path) -> Path:
    """A parent run folder as the shared stages leave it (config, preflight report, packed link)."""
    from pipelines import stages
    from pipelines.run_folder import RunFolder
    from trainer import fsio

    folder = RunFolder(root / "run")
    stages.prepare.prepare(base, folder.root)
    fsio.write_json(folder.preflight_report, {"passed": True, "checks": {}})
    fsio.write_json(folder.packed_link, {"path": str(root / "packed"), "key": "k"})
    return folder.root


def test_members_are_run_folders_of_their_own_sharing_the_packed_data(base, tmp_path: Path):
    from pipelines import stages
    from pipelines.run_folder import RunFolder
    from pipelines.sweep import members, points

    run = _shared_run(base, tmp_path)
    points.write(run, points.members(base, [{"train.lr": 0.001}, {"train.lr": 0.0003}]))
    listed = members.write(run, "manual__1")
    assert [m["run_key"] for m in listed] == ["manual__1/sweep/00", "manual__1/sweep/01"]
    for i, m in enumerate(listed):
        member = RunFolder(Path(m["run_dir"]))
        assert member.root == RunFolder(run).sweep_member(i)
        assert stages.prepare.load_run_config(member.root).train.lr == (0.001, 0.0003)[i]
        assert member.packed_link.read_text() == RunFolder(run).packed_link.read_text()
    assert members.write(run, "manual__1") == listed  # a retry finds the same members
    assert members.read(run) == listed


def test_ranking_puts_the_lowest_bits_per_byte_first_and_lists_failed_members(base, tmp_path: Path):
    from pipelines.run_folder import RunFolder
    from pipelines.sweep import members, points, ranking
    from trainer import fsio

    run = _shared_run(base, tmp_path)
    points.write(run, points.members(base, {"train.lr": [0.001, 0.002, 0.003]}))
    listed = members.write(run, "manual__1")
    for m, bpb in ((listed[0], 3.5), (listed[2], 3.1)):
        fsio.write_json(RunFolder(Path(m["run_dir"])).eval_report, {
            "candidate": {"bits_per_byte": bpb, "loss": 2.0, "perplexity": 7.0}, "passed": bpb < 3.2,
            "improvement_bpb": 3.3 - bpb, "baseline": {"label": "uniform floor"}})
    fsio.write_json(RunFolder(Path(listed[1]["run_dir"])).status, {"state": "failed"})
    result = ranking.rank(run)
    assert result["best"] == "02"
    assert [(r["member"], r["state"], r.get("rank")) for r in result["members"]] == [
        ("02", "evaluated", 1), ("00", "evaluated", 2), ("01", "failed", None)]
    assert "trainer state: failed" in result["members"][2]["reason"]
    assert json.loads(RunFolder(run).sweep_ranking.read_text()) == result
    table = RunFolder(run).sweep_ranking_summary.read_text()
    assert table.index("| 1 | 02 |") < table.index("| 2 | 00 |") < table.index("| – | 01 |")


def test_a_sweep_with_no_evaluated_member_fails_the_ranking(base, tmp_path: Path):
    from pipelines.sweep import members, points, ranking

    run = _shared_run(base, tmp_path)
    points.write(run, points.members(base, {"train.lr": [0.001, 0.002]}))
    members.write(run, "manual__1")
    with pytest.raises(ranking.NoMemberEvaluated, match="00: no evaluation report .*never started"):
        ranking.rank(run)
