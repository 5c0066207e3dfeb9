"""``objective``: each objective's data shapes, strategies and options are checked at
validation, every refusal naming the field to change."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.spec import OBJECTIVES, JobSpec

PREFS = {"source": "jsonl", "path": "/d/p.jsonl", "shape": "preference"}


def spec(**fields) -> JobSpec:
    return JobSpec.model_validate({"name": "o", "resources": {"workers": 2}, **fields})


def test_causal_lm_is_the_default_and_dpo_takes_its_options():
    assert spec().objective == "causal_lm" and spec().dpo is None
    job = spec(objective="dpo", data=PREFS, dpo={"beta": 0.5, "loss": "ipo"})
    assert (job.dpo.beta, job.dpo.loss, job.dpo.reference_folder) == (0.5, "ipo", None)
    assert spec(objective="dpo", data=PREFS, dpo={"reference": "s3://b/ref"}).dpo.reference_folder


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"objective": "dpo", "data": PREFS, "parallelism": {"strategy": "tp", "tp": 2}},
            "parallelism.strategy tp is not available with objective dpo",
        ),
        (
            {"objective": "dpo", "data": PREFS, "parallelism": {"strategy": "pp", "pp": 2}},
            "use parallelism.strategy ddp or fsdp",
        ),
        ({"objective": "dpo"}, "data.shape text is not trained by objective dpo"),
        ({"data": PREFS}, "data.shape preference is not trained by objective causal_lm"),
        ({"dpo": {"beta": 1}}, "dpo holds options of objective dpo; remove it"),
        (
            {"objective": "dpo", "data": {**PREFS, "packing": True}},
            "data.packing does not apply to objective dpo",
        ),
        (
            {"objective": "dpo", "data": {**PREFS, "eval": {"source": "synthetic"}}},
            "data.eval.shape text is not trained by objective dpo",
        ),
        (
            {"objective": "dpo", "data": {**PREFS, "source": "prepared"}},
            "data.shape preference reads jsonl or parquet rows",
        ),
        (
            {"objective": "dpo", "data": PREFS, "dpo": {"reference": "models/ref"}},
            "dpo.reference must be base or the absolute path",
        ),
        ({"objective": "ppo"}, "objective"),
    ],
)
def test_what_an_objective_cannot_train_is_refused_naming_the_field(fields, message):
    with pytest.raises(ValidationError) as e:
        spec(**fields)
    assert message in str(e.value)


def test_every_objective_names_shapes_that_exist_and_reasons_for_refusals():
    shapes = JobSpec.model_fields["data"].annotation.model_fields["shape"].annotation.__args__
    for name, obj in OBJECTIVES.items():
        assert set(obj.shapes) <= set(shapes), name
        assert all(len(reason) > 40 for reason in obj.refused.values()), name
