"""JobSpec validation: tables of good and bad specs, and the JSON round trip for the worker."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.spec import JobSpec, parse_spec


def _spec(**sections) -> dict:
    """A minimal spec mapping with ``sections`` merged in."""
    return {"name": "tiny", **sections}


GOOD = {
    "minimal": _spec(),
    "name-47-chars": {"name": "a" * 47},
    "name-single-char": {"name": "x"},
    "name-digits-and-dashes": {"name": "0-job-9"},
    "elastic-range": _spec(
        resources={"workers": {"min": 1, "max": 4}},
        train={"global_batch_size": 48, "micro_batch_size": 4},
    ),
    "elastic-min-equals-max": _spec(resources={"workers": {"min": 2, "max": 2}}),
    "fractional-cpus": _spec(resources={"cpus_per_worker": 0.5}),
    "gpu-workers": _spec(resources={"gpus_per_worker": 8}),
    "dp-times-one": _spec(parallelism={"dp": 2}, resources={"workers": 2}),
    "tp": _spec(
        parallelism={"strategy": "tp", "tp": 2},
        resources={"workers": 4},
        train={"global_batch_size": 16, "micro_batch_size": 4},
    ),
    "pp": _spec(parallelism={"strategy": "pp", "pp": 2}, resources={"workers": 2}),
    "hybrid-3d": _spec(
        parallelism={"strategy": "hybrid", "dp": 2, "tp": 2, "pp": 2},
        resources={"workers": 8},
        train={"micro_batch_size": 2},
    ),
    "tp-elastic-multiples": _spec(
        parallelism={"strategy": "tp", "tp": 2},
        resources={"workers": {"min": 2, "max": 6}},
        train={"global_batch_size": 24, "micro_batch_size": 4},
    ),
    "fsdp-options": _spec(
        parallelism={"strategy": "fsdp", "fsdp": {"zero_stage": 2, "cpu_offload": True}}
    ),
    "pipeline-options": _spec(
        model={"preset": "gpt-small"},
        parallelism={
            "strategy": "pp",
            "pp": 2,
            "pipeline": {"schedule": "interleaved_1f1b", "microbatches": 4},
        },
    ),
    "text-data": _spec(data={"source": "text", "path": "/data/corpus.txt"}),
    "jsonl-data": _spec(data={"source": "jsonl", "path": "/data/corpus.jsonl"}),
    "file-storage": _spec(checkpoint={"storage": "file:///var/lib/etrain/ckpt"}),
    "async-alias": _spec(checkpoint={"async": True}),
    "async-field-name": _spec(checkpoint={"async_": True}),
    "warmup-one-below-steps": _spec(train={"steps": 10, "warmup_steps": 9}),
    "sgd-momentum": _spec(train={"optimizer": "sgd", "momentum": 0.9}),
    "bf16": _spec(train={"precision": "bf16"}),
    "unlimited-failures": _spec(failure={"max_failures": -1}),
    "every-seconds": _spec(checkpoint={"every_steps": None, "every_seconds": 30}),
    # object storage
    "storage-s3-bucket": _spec(checkpoint={"storage": "s3://my-bucket"}),
    "storage-s3-prefix": _spec(checkpoint={"storage": "s3://my-bucket/a/b"}),
    "storage-s3-minio": _spec(
        checkpoint={"storage": "s3://ckpt.example/jobs"},
        stores={
            "s3": {
                "endpoint_url": "http://minio.etrain.svc:9000",
                "region": "us-east-1",
                "credentials_secret": "minio-creds",
            }
        },
    ),
    "storage-s3-https-endpoint": _spec(
        checkpoint={"storage": "s3://my-bucket/p"},
        stores={"s3": {"endpoint_url": "https://s3.example.com"}},
    ),
    "storage-gs": _spec(checkpoint={"storage": "gs://my_bucket/prefix"}),
    "storage-gs-emulator": _spec(
        checkpoint={"storage": "gs://my_bucket/p"},
        stores={"gcs": {"endpoint_url": "http://gcs-emulator:9023/"}},
    ),
    # retention and the automatic interval
    "keep-every": _spec(checkpoint={"keep_every": 1000}),
    "keep-every-with-every-seconds": _spec(checkpoint={"every_seconds": 60, "keep_every": 7}),
    "interval-auto": _spec(checkpoint={"interval": "auto"}),
    "interval-auto-initial-steps": _spec(
        checkpoint={"interval": "auto", "every_steps": 50, "mtbf_prior_s": 3600, "keep_every": 7}
    ),
}


@pytest.mark.parametrize("data", list(GOOD.values()), ids=list(GOOD))
def test_good_specs_validate(data):
    spec = parse_spec(data)
    assert isinstance(spec, JobSpec)
    assert spec.name == data["name"]


# (spec, field the rejection must name). The field is looked for in the message
# and in the error location together, which is what the API's 422 shows.
BAD = {
    # layouts the model cannot take
    "tp-not-dividing-heads": (
        _spec(
            parallelism={"strategy": "tp", "tp": 8},
            resources={"workers": 8},
            train={"global_batch_size": 16, "micro_batch_size": 2},
        ),
        "parallelism.tp",
    ),
    "pp-more-stages-than-layers": (
        _spec(
            parallelism={"strategy": "pp", "pp": 4, "pipeline": {"microbatches": 4}},
            resources={"workers": 4},
        ),
        "parallelism.pp",
    ),
    "1f1b-fewer-microbatches-than-stages": (
        _spec(
            parallelism={
                "strategy": "pp",
                "pp": 2,
                "pipeline": {"schedule": "1f1b", "microbatches": 1},
            },
            model={"preset": "gpt-small"},
        ),
        "parallelism.pipeline.microbatches",
    ),
    "interleaved-microbatches-not-in-rounds": (
        _spec(
            parallelism={
                "strategy": "pp",
                "pp": 2,
                "pipeline": {"schedule": "interleaved_1f1b", "microbatches": 5},
            },
            model={"preset": "gpt-small"},
            train={"global_batch_size": 20, "micro_batch_size": 4},
        ),
        "parallelism.pipeline.microbatches",
    ),
    "interleaved-needs-twice-the-layers": (
        _spec(
            parallelism={
                "strategy": "pp",
                "pp": 2,
                "pipeline": {"schedule": "interleaved_1f1b", "microbatches": 4},
            }
        ),
        "2 layers",
    ),
    "pp-batch-not-multiple-of-microbatches": (
        _spec(
            parallelism={"strategy": "pp", "pp": 2, "pipeline": {"microbatches": 8}},
            train={"global_batch_size": 16, "micro_batch_size": 4},
        ),
        "parallelism.pipeline.microbatches",
    ),
    "seq-len-beyond-preset": (_spec(data={"seq_len": 4096}), "data.seq_len"),
    # unknown fields, at every level
    "unknown-top": (_spec(bogus=1), "bogus"),
    "unknown-model": (_spec(model={"preset": "gpt-tiny", "weights": "x"}), "weights"),
    "preset-and-hf": (_spec(model={"preset": "llama-7b", "hf": "/m"}), "model.hf"),
    "unknown-data": (_spec(data={"tokenizer": "bpe"}), "tokenizer"),
    "unknown-parallelism": (_spec(parallelism={"zero": 3}), "zero"),
    "unknown-fsdp": (_spec(parallelism={"fsdp": {"offload": True}}), "offload"),
    "unknown-pipeline": (_spec(parallelism={"pipeline": {"stages": 2}}), "stages"),
    "unknown-resources": (_spec(resources={"memory": "8Gi"}), "memory"),
    "unknown-worker-range": (_spec(resources={"workers": {"min": 1, "max": 2, "step": 1}}), "step"),
    "unknown-train": (_spec(train={"micro_batch": 4}), "micro_batch"),
    "unknown-checkpoint": (_spec(checkpoint={"intervals": "auto"}), "intervals"),
    "unknown-s3": (
        _spec(checkpoint={"storage": "s3://my-bucket"}, stores={"s3": {"access_key": "x"}}),
        "access_key",
    ),
    "unknown-failure": (_spec(failure={"retries": 1}), "retries"),
    # name rules
    "name-missing": ({}, "name"),
    "name-empty": ({"name": ""}, "name"),
    "name-48-chars": ({"name": "a" * 48}, "name"),
    "name-uppercase": ({"name": "Tiny"}, "name"),
    "name-underscore": ({"name": "my_job"}, "name"),
    "name-leading-dash": ({"name": "-job"}, "name"),
    "name-trailing-dash": ({"name": "job-"}, "name"),
    "name-dot": ({"name": "job.v1"}, "name"),
    # enumerations and bounds
    "unknown-preset": (_spec(model={"preset": "gpt-huge"}), "preset"),
    "unknown-source": (_spec(data={"source": "parquet"}), "source"),
    "seq-len-too-small": (_spec(data={"seq_len": 4}), "seq_len"),
    "unknown-strategy": (_spec(parallelism={"strategy": "zero3"}), "strategy"),
    "zero-stage-4": (_spec(parallelism={"fsdp": {"zero_stage": 4}}), "zero_stage"),
    "unknown-schedule": (
        _spec(parallelism={"strategy": "pp", "pp": 2, "pipeline": {"schedule": "zb"}}),
        "schedule",
    ),
    "zero-workers": (_spec(resources={"workers": 0}), "workers"),
    "negative-workers": (_spec(resources={"workers": -2}), "workers"),
    "zero-cpus": (_spec(resources={"cpus_per_worker": 0}), "cpus_per_worker"),
    "too-many-gpus": (_spec(resources={"gpus_per_worker": 17}), "gpus_per_worker"),
    "zero-lr": (_spec(train={"lr": 0}), "lr"),
    "unknown-optimizer": (_spec(train={"optimizer": "lion"}), "optimizer"),
    "momentum-one": (_spec(train={"optimizer": "sgd", "momentum": 1.0}), "momentum"),
    "unknown-precision": (_spec(train={"precision": "fp16"}), "precision"),
    "keep-last-zero": (_spec(checkpoint={"keep_last": 0}), "keep_last"),
    "max-failures-below-minus-one": (_spec(failure={"max_failures": -2}), "max_failures"),
    # worker range
    "range-min-above-max": (
        _spec(resources={"workers": {"min": 3, "max": 2}}),
        "resources.workers.min",
    ),
    "range-min-zero": (_spec(resources={"workers": {"min": 0, "max": 2}}), "min"),
    "range-max-missing": (_spec(resources={"workers": {"min": 1}}), "max"),
    # batch arithmetic
    "global-not-multiple-of-micro": (
        _spec(train={"global_batch_size": 10, "micro_batch_size": 4}),
        "train.global_batch_size",
    ),
    "global-not-multiple-of-micro-x-dp": (
        _spec(resources={"workers": 4}, train={"global_batch_size": 8, "micro_batch_size": 4}),
        "train.global_batch_size",
    ),
    "elastic-dp-3-breaks-batch": (
        _spec(
            resources={"workers": {"min": 2, "max": 4}},
            train={"global_batch_size": 16, "micro_batch_size": 4},
        ),
        "train.global_batch_size",
    ),
    "tp-elastic-dp-breaks-batch": (
        _spec(
            parallelism={"strategy": "tp", "tp": 2},
            resources={"workers": {"min": 2, "max": 6}},
            train={"global_batch_size": 8, "micro_batch_size": 4},
        ),
        "train.global_batch_size",
    ),
    # degrees vs strategy
    "ddp-with-tp": (_spec(parallelism={"strategy": "ddp", "tp": 2}), "parallelism.tp"),
    "fsdp-with-tp": (_spec(parallelism={"strategy": "fsdp", "tp": 2}), "parallelism.tp"),
    "ddp-with-pp": (_spec(parallelism={"strategy": "ddp", "pp": 2}), "parallelism.pp"),
    "tp-with-pp": (_spec(parallelism={"strategy": "tp", "tp": 2, "pp": 2}), "parallelism.pp"),
    "pp-with-tp": (_spec(parallelism={"strategy": "pp", "tp": 2, "pp": 2}), "parallelism.tp"),
    # dp x tp x pp = workers
    "workers-not-multiple-of-tp": (
        _spec(parallelism={"strategy": "tp", "tp": 2}, resources={"workers": 3}),
        "resources.workers",
    ),
    "elastic-max-not-multiple-of-tp-pp": (
        _spec(
            parallelism={"strategy": "hybrid", "tp": 2, "pp": 2},
            resources={"workers": {"min": 4, "max": 6}},
        ),
        "resources.workers",
    ),
    "dp-times-tp-not-workers": (
        _spec(parallelism={"strategy": "tp", "dp": 2, "tp": 2}, resources={"workers": 2}),
        "parallelism.dp",
    ),
    "dp-with-elastic-workers": (
        _spec(parallelism={"dp": 2}, resources={"workers": {"min": 1, "max": 2}}),
        "parallelism.dp",
    ),
    "dp-zero": (_spec(parallelism={"dp": 0}), "dp"),
    # data
    "text-without-path": (_spec(data={"source": "text"}), "data.path"),
    "jsonl-without-path": (_spec(data={"source": "jsonl"}), "data.path"),
    "jsonl-empty-path": (_spec(data={"source": "jsonl", "path": ""}), "data.path"),
    "synthetic-with-path": (_spec(data={"source": "synthetic", "path": "/x"}), "data.path"),
    # checkpoint storage schemes
    "storage-http": (_spec(checkpoint={"storage": "http://host/ckpt"}), "checkpoint.storage"),
    "storage-azure": (_spec(checkpoint={"storage": "az://container/p"}), "checkpoint.storage"),
    "storage-bare-path": (_spec(checkpoint={"storage": "/var/ckpt"}), "checkpoint.storage"),
    "storage-relative-file": (_spec(checkpoint={"storage": "file://ckpt"}), "checkpoint.storage"),
    "storage-s3-no-bucket": (_spec(checkpoint={"storage": "s3://"}), "checkpoint.storage"),
    "storage-s3-short-bucket": (_spec(checkpoint={"storage": "s3://ab/p"}), "checkpoint.storage"),
    "storage-s3-uppercase-bucket": (
        _spec(checkpoint={"storage": "s3://My-Bucket"}),
        "checkpoint.storage",
    ),
    "storage-s3-underscore-bucket": (
        _spec(checkpoint={"storage": "s3://my_bucket"}),
        "checkpoint.storage",
    ),
    "storage-s3-empty-segment": (
        _spec(checkpoint={"storage": "s3://my-bucket/a//b"}),
        "checkpoint.storage",
    ),
    "storage-s3-dotdot": (
        _spec(checkpoint={"storage": "s3://my-bucket/a/../b"}),
        "checkpoint.storage",
    ),
    "storage-s3-query": (
        _spec(checkpoint={"storage": "s3://my-bucket/p?versionId=1"}),
        "checkpoint.storage",
    ),
    "storage-s3-userinfo": (
        _spec(checkpoint={"storage": "s3://AKIAX:secret@my-bucket/p"}),
        "checkpoint.storage",
    ),
    # stores.s3
    "s3-without-s3-paths": (_spec(stores={"s3": {"region": "us-east-1"}}), "stores.s3"),
    "s3-beside-gs-paths-only": (
        _spec(model={"hf": "gs://models/m"}, stores={"s3": {"region": "us-east-1"}}),
        "stores.s3",
    ),
    "old-and-new-s3-differ": (
        _spec(
            checkpoint={"storage": "s3://my-bucket", "s3": {"region": "us-east-1"}},
            stores={"s3": {"region": "eu-west-1"}},
        ),
        "checkpoint.s3 (the old place of the s3 options) and stores.s3 differ",
    ),
    "old-and-new-gcs-differ": (
        _spec(
            checkpoint={"storage": "gs://my-bucket", "gcs": {"endpoint_url": "http://a:1"}},
            stores={"gcs": {"endpoint_url": "http://b:1"}},
        ),
        "checkpoint.gcs (the old place of the gcs options) and stores.gcs differ",
    ),
    "s3-with-gs-storage": (
        _spec(checkpoint={"storage": "gs://my-bucket"}, stores={"s3": {"region": "us-east-1"}}),
        "stores.s3",
    ),
    "s3-endpoint-not-a-url": (
        _spec(
            checkpoint={"storage": "s3://my-bucket"}, stores={"s3": {"endpoint_url": "minio:9000"}}
        ),
        "stores.s3.endpoint_url",
    ),
    "s3-endpoint-with-userinfo": (
        _spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"endpoint_url": "http://ak:sk@minio:9000"}},
        ),
        "stores.s3.endpoint_url",
    ),
    "s3-region-with-spaces": (
        _spec(checkpoint={"storage": "s3://my-bucket"}, stores={"s3": {"region": "us east"}}),
        "stores.s3.region",
    ),
    "s3-secret-looks-like-a-key": (
        _spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"credentials_secret": "AKIAIOSFODNN7EXAMPLE"}},
        ),
        "stores.s3.credentials_secret",
    ),
    "s3-secret-with-slash": (
        _spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"credentials_secret": "wJalrXUtnFEMI/K7MDENG"}},
        ),
        "stores.s3.credentials_secret",
    ),
    # stores.gcs
    "gcs-with-s3-storage": (
        _spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"gcs": {"endpoint_url": "http://gcs:9023"}},
        ),
        "stores.gcs",
    ),
    "gcs-without-gs-paths": (_spec(stores={"gcs": {}}), "stores.gcs"),
    "gcs-endpoint-not-a-url": (
        _spec(
            checkpoint={"storage": "gs://my-bucket"}, stores={"gcs": {"endpoint_url": "gcs:9023"}}
        ),
        "stores.gcs.endpoint_url",
    ),
    "gcs-endpoint-with-a-path": (
        _spec(
            checkpoint={"storage": "gs://my-bucket"},
            stores={"gcs": {"endpoint_url": "http://gcs:9023/storage/v1"}},
        ),
        "stores.gcs.endpoint_url",
    ),
    "gcs-endpoint-with-userinfo": (
        _spec(
            checkpoint={"storage": "gs://my-bucket"},
            stores={"gcs": {"endpoint_url": "https://user:pw@gcs"}},
        ),
        "stores.gcs.endpoint_url",
    ),
    "gcs-unknown-field": (
        _spec(checkpoint={"storage": "gs://my-bucket"}, stores={"gcs": {"token": "x"}}),
        "token",
    ),
    # retention and the automatic interval
    "keep-every-zero": (_spec(checkpoint={"keep_every": 0}), "keep_every"),
    "keep-every-not-multiple-of-every-steps": (
        _spec(checkpoint={"keep_every": 25}),
        "checkpoint.keep_every",
    ),
    "interval-unknown": (_spec(checkpoint={"interval": "adaptive"}), "interval"),
    "interval-auto-with-every-seconds": (
        _spec(checkpoint={"interval": "auto", "every_seconds": 60}),
        "checkpoint.every_seconds",
    ),
    "interval-auto-without-every-steps": (
        _spec(checkpoint={"interval": "auto", "every_steps": None}),
        "checkpoint.every_steps",
    ),
    "mtbf-prior-zero": (_spec(checkpoint={"interval": "auto", "mtbf_prior_s": 0}), "mtbf_prior_s"),
    # warmup
    "warmup-equals-steps": (_spec(train={"steps": 10, "warmup_steps": 10}), "train.warmup_steps"),
    "warmup-above-steps": (_spec(train={"steps": 10, "warmup_steps": 20}), "train.warmup_steps"),
    # control characters in the places a spec names (the OS refuses a NUL in a path)
    "data-path-nul": (_spec(data={"source": "jsonl", "path": "/d/a\x00.jsonl"}), "data.path"),
    "model-hf-newline": (_spec(model={"hf": "/m\n"}), "model.hf must not contain control"),
    "model-tokenizer-del": (_spec(model={"tokenizer": "/t\x7f"}), "model.tokenizer must not"),
    "storage-nul": (_spec(checkpoint={"storage": "file:///c\x00"}), "checkpoint.storage must not"),
    "storage-tab-in-bucket": (_spec(checkpoint={"storage": "s3://buc\tket"}), "U+0009"),
    "gcs-endpoint-c1": (
        _spec(
            checkpoint={"storage": "gs://b-1"}, stores={"gcs": {"endpoint_url": "http://g\x85:1"}}
        ),
        "stores.gcs.endpoint_url must not contain control characters",
    ),
}


@pytest.mark.parametrize(("data", "field"), list(BAD.values()), ids=list(BAD))
def test_bad_specs_are_rejected_naming_the_field(data, field):
    with pytest.raises(ValidationError) as info:
        parse_spec(data)
    named = [".".join(str(p) for p in e["loc"]) + " " + e["msg"] for e in info.value.errors()]
    assert any(field in text for text in named), named


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_spec(train={"global_batch_size": 10, "micro_batch_size": 4}), "train.micro_batch_size"),
        (_spec(train={"steps": 10, "warmup_steps": 10}), "train.steps"),
        (_spec(resources={"workers": {"min": 3, "max": 2}}), "resources.workers.max"),
        (
            _spec(parallelism={"strategy": "tp", "tp": 2}, resources={"workers": 3}),
            "parallelism.tp",
        ),
    ],
)
def test_cross_field_rejections_name_both_sides(data, field):
    with pytest.raises(ValidationError) as info:
        parse_spec(data)
    assert field in str(info.value)


def test_batch_rejection_suggests_a_valid_global_batch_size():
    with pytest.raises(ValidationError) as info:
        parse_spec(
            _spec(resources={"workers": 3}, train={"global_batch_size": 16, "micro_batch_size": 4})
        )
    assert "multiple of 12" in str(info.value)


def test_name_with_trailing_newline_is_rejected():
    with pytest.raises(ValidationError, match="name"):
        parse_spec({"name": "tiny\n"})


@pytest.mark.parametrize(
    "section, key", [("resources", "cpus_per_worker"), ("checkpoint", "every_seconds")]
)
def test_infinite_values_are_rejected(section, key):
    with pytest.raises(ValidationError, match=key):
        parse_spec(_spec(**{section: {key: float("inf")}}))


@pytest.mark.parametrize("data", list(GOOD.values()), ids=list(GOOD))
def test_json_dump_revalidates_to_an_equal_spec(data):
    spec = parse_spec(data)
    dumped = spec.model_dump(mode="json", by_alias=True)
    again = JobSpec.model_validate(dumped)
    assert again == spec
    assert JobSpec.model_validate_json(spec.model_dump_json(by_alias=True)) == spec


def test_async_alias_dumps_and_loads_as_async():
    spec = parse_spec(_spec(checkpoint={"async": True}))
    assert spec.checkpoint.async_ is True
    dumped = spec.model_dump(mode="json", by_alias=True)
    assert dumped["checkpoint"]["async"] is True
    assert "async_" not in dumped["checkpoint"]


def test_storage_uris_are_normalised():
    assert (
        parse_spec(_spec(checkpoint={"storage": "s3://my-bucket/a/b/"})).checkpoint.storage
        == "s3://my-bucket/a/b"
    )
    s3 = parse_spec(
        _spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"endpoint_url": "http://minio:9000/"}},
        )
    ).stores.s3
    assert s3.endpoint_url == "http://minio:9000"
    gcs = parse_spec(
        _spec(
            checkpoint={"storage": "gs://my-bucket"},
            stores={"gcs": {"endpoint_url": "http://gcs-emulator:9023/"}},
        )
    ).stores.gcs
    assert gcs.endpoint_url == "http://gcs-emulator:9023"


@pytest.mark.parametrize(
    "sections",
    [
        {"checkpoint": {"storage": "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG@my-bucket/p"}},
        {
            "checkpoint": {"storage": "s3://my-bucket"},
            "stores": {"s3": {"credentials_secret": "wJalrXUtnFEMI/K7MDENG"}},
        },
        {
            "checkpoint": {"storage": "s3://my-bucket"},
            "stores": {
                "s3": {"endpoint_url": "http://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@minio:9000"}
            },
        },
        {
            "checkpoint": {"storage": "gs://my-bucket"},
            "stores": {
                "gcs": {"endpoint_url": "http://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@gcs:9023"}
            },
        },
        # The old form: its options checked where they moved.
        {
            "checkpoint": {
                "storage": "s3://my-bucket",
                "s3": {"credentials_secret": "wJalrXUtnFEMI/K7MDENG"},
            }
        },
        {"checkpoint": {"storage": "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@my-bucket/\x00"}},
    ],
)
def test_rejections_never_repeat_what_may_be_a_key(sections):
    with pytest.raises(ValidationError) as info:
        parse_spec(_spec(**sections))
    for text in (str(info.value), repr(info.value.errors(include_input=False))):
        assert "AKIAIOSFODNN7EXAMPLE" not in text and "wJalrXUtnFEMI" not in text


def test_checkpoint_defaults_keep_the_fixed_interval():
    ck = parse_spec({"name": "tiny"}).checkpoint
    assert (ck.interval, ck.mtbf_prior_s, ck.keep_every) == (None, 86400.0, None)
    assert ck.every_steps == 10


def test_elastic_workers_round_trip_as_a_range():
    spec = parse_spec(
        _spec(
            resources={"workers": {"min": 1, "max": 4}},
            train={"global_batch_size": 48, "micro_batch_size": 4},
        )
    )
    assert spec.resources.min_workers == 1 and spec.resources.max_workers == 4
    assert spec.model_dump(mode="json")["resources"]["workers"] == {"min": 1, "max": 4}


def test_defaults_are_a_two_worker_cpu_ddp_job():
    spec = parse_spec({"name": "tiny"})
    assert spec.parallelism.strategy == "ddp"
    assert spec.resources.min_workers == spec.resources.max_workers == 2
    assert spec.resources.gpus_per_worker == 0
    assert spec.checkpoint.storage is None and spec.checkpoint.async_ is False


def test_spec_is_frozen():
    spec = parse_spec({"name": "tiny"})
    with pytest.raises(ValidationError):
        spec.name = "other"


@pytest.mark.parametrize(
    ("overrides", "world_size", "dp", "accum"),
    [
        ({}, 2, 2, 2),  # 16 / (4 x 2)
        ({"train": {"global_batch_size": 16, "micro_batch_size": 4}}, 1, 1, 4),
        ({"train": {"global_batch_size": 16, "micro_batch_size": 4}}, 4, 4, 1),
        ({"parallelism": {"strategy": "tp", "tp": 2}, "resources": {"workers": 4}}, 4, 2, 2),
        (
            {
                "parallelism": {
                    "strategy": "hybrid",
                    "tp": 2,
                    "pp": 2,
                    "pipeline": {"microbatches": 2},
                },
                "resources": {"workers": 8},
            },
            8,
            2,
            2,
        ),
        (
            {
                "resources": {"workers": {"min": 1, "max": 4}},
                "train": {"global_batch_size": 48, "micro_batch_size": 4},
            },
            3,
            3,
            4,
        ),
    ],
)
def test_data_parallel_size_and_grad_accum_steps(overrides, world_size, dp, accum):
    spec = parse_spec(_spec(**overrides))
    assert spec.data_parallel_size(world_size) == dp
    assert spec.grad_accum_steps(world_size) == accum
    # The global batch is invariant: micro x accum x dp always gives it back.
    assert spec.train.micro_batch_size * accum * dp == spec.train.global_batch_size


def test_every_elastic_size_keeps_the_global_batch():
    spec = parse_spec(
        _spec(
            resources={"workers": {"min": 1, "max": 4}},
            train={"global_batch_size": 48, "micro_batch_size": 4},
        )
    )
    for n in range(1, 5):
        dp = spec.data_parallel_size(n)
        assert spec.grad_accum_steps(n) * spec.train.micro_batch_size * dp == 48


def test_stores_serve_every_path_of_their_scheme():
    spec = parse_spec(
        _spec(
            model={"hf": "s3://models/m"},
            data={"source": "jsonl", "path": "gs://rows/train.jsonl"},
            stores={"s3": {"credentials_secret": "acme"}, "gcs": {"endpoint_url": "http://g:1"}},
        )
    )
    assert spec.stores.s3.credentials_secret == "acme" and spec.checkpoint.storage is None


@pytest.mark.parametrize("name", ["s3", "gcs"])
def test_old_form_moves_to_stores_and_dumps_only_the_new_form(name):
    options = {"s3": {"endpoint_url": "http://minio:9000"}, "gcs": {"endpoint_url": "http://g:1"}}
    storage = {"s3": "s3://my-bucket/p", "gcs": "gs://my-bucket/p"}[name]
    old = parse_spec(_spec(checkpoint={"storage": storage, name: options[name]}))
    new = parse_spec(_spec(checkpoint={"storage": storage}, stores={name: options[name]}))
    assert old == new
    assert getattr(old.stores, name).endpoint_url == options[name]["endpoint_url"]
    dumped = old.model_dump(mode="json", by_alias=True)
    assert name not in dumped["checkpoint"]
    assert dumped["stores"][name]["endpoint_url"] == options[name]["endpoint_url"]
    # Both forms with the same value (unset fields as null or left out) are one spec.
    given = {**options[name], "region": None} if name == "s3" else options[name]
    both = _spec(checkpoint={"storage": storage, name: options[name]}, stores={name: given})
    assert parse_spec(both) == new
