"""`dpmerge score-group` refuses a malformed group before reading anything: every merge needs its two files,
each entry an operator, and nothing it does not know. (That its files equal those of 'dpmerge merge' and
'dpmerge evaluate' is tests/test_pipeline.py::test_the_group_job_writes_what_the_per_file_commands_write.)"""

import pytest

from dpmerge.cli import main
from dpmerge.stages.group import score_group

COMMON = dict(backbone_spec={"kind": "efficientnet_lite0"}, base="w0", task_vectors=["a", "b"], heads=["ha", "hb"],
              data=["da", "db"], individual_out="individual.parquet")


@pytest.mark.parametrize("merges,merged,scores,message", [
    ({"ties": {"method": "ties"}}, {}, {"ties": "s"}, "--merged must name one file per merge of --merges ['ties']; "
                                                       "missing ['ties']"),
    ({"ties": {"method": "ties"}}, {"ties": "m"}, {"ties": "s", "ta": "t"}, "not in --merges ['ta']"),
    ({"ties": {"density": 0.2}}, {"ties": "m"}, {"ties": "s"}, "--merges 'ties': expected an object with 'method'"),
    ({"ties": {"method": "ties", "density": 0.2}}, {"ties": "m"}, {"ties": "s"},
     "--merges 'ties': unknown field(s) ['density']; expected ['method', 'params', 'vectors']"),
    ({"ties": {"method": "ties", "params": [0.2]}}, {"ties": "m"}, {"ties": "s"}, "'params' must be an object"),
    # the second entry's bad hyperparameter is found before the first merge is made
    ({"wa": {"method": "weight_averaging"}, "ties": {"method": "ties", "params": {"density": 2.0}}},
     {"wa": "m1", "ties": "m2"}, {"wa": "s1", "ties": "s2"}, "--merges 'ties': ties density must be in [0, 1]"),
    ({"x": {"method": "fishr"}}, {"x": "m"}, {"x": "s"}, "--merges 'x': "),
])
def test_a_malformed_merge_entry_is_refused_by_name(merges, merged, scores, message):
    with pytest.raises(ValueError) as refused:
        score_group(**COMMON, merges=merges, merged=merged, scores=scores)
    assert message in str(refused.value)


def test_one_task_vector_per_head():
    with pytest.raises(ValueError, match="1 --task-vectors for 2 --heads"):
        score_group(**{**COMMON, "task_vectors": ["a"]})


def test_the_command_line_refuses_merges_that_are_not_a_json_object(capsys):
    with pytest.raises(SystemExit):
        main(["score-group", "--backbone-spec", "{}", "--base", "w0", "--task-vectors", "a", "--heads", "h",
              "--data", "d", "--individual-out", "i.parquet", "--merges", "[1]"])
    assert "--merges: must be a JSON object" in capsys.readouterr().err
