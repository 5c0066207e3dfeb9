"""JobSpec validation: tables of good and bad specs, and the JSON round trip for the worker."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.support.specs import spec
from workers.spec import JobSpec, parse_spec

GOOD = {
    "minimal": spec(),
    "name-47-chars": {"name": "a" * 47},
    "name-single-char": {"name": "x"},
    "name-digits-and-dashes": {"name": "0-job-9"},
    "elastic-range": spec(
        resources={"workers": {"min": 1, "max": 4}},
        train={"global_batch_size": 48, "micro_batch_size": 4},
    ),
    "elastic-min-equals-max": spec(resources={"workers": {"min": 2, "max": 2}}),
    "fractional-cpus": spec(resources={"cpus_per_worker": 0.5}),
    "gpu-workers": spec(resources={"gpus_per_worker": 8}),
    "dp-times-one": spec(parallelism={"dp": 2}, resources={"workers": 2}),
    "tp": spec(
        parallelism={"strategy": "tp", "tp": 2},
        resources={"workers": 4},
        train={"global_batch_size": 16, "micro_batch_size": 4},
    ),
    "pp": spec(parallelism={"strategy": "pp", "pp": 2}, resources={"workers": 2}),
    "hybrid-3d": spec(
        parallelism={"strategy": "hybrid", "dp": 2, "tp": 2, "pp": 2},
        resources={"workers": 8},
        train={"micro_batch_size": 2},
    ),
    "tp-elastic-multiples": spec(
        parallelism={"strategy": "tp", "tp": 2},
        resources={"workers": {"min": 2, "max": 6}},
        train={"global_batch_size": 24, "micro_batch_size": 4},
    ),
    "fsdp-options": spec(
        parallelism={"strategy": "fsdp", "fsdp": {"zero_stage": 2, "cpu_offload": True}}
    ),
    "pipeline-options": spec(
        model={"preset": "gpt-small"},
        parallelism={
            "strategy": "pp",
            "pp": 2,
            "pipeline": {"schedule": "interleaved_1f1b", "microbatches": 4},
        },
    ),
    "text-data": spec(data={"source": "text", "path": "/data/corpus.txt"}),
    "jsonl-data": spec(data={"source": "jsonl", "path": "/data/corpus.jsonl"}),
    "file-storage": spec(checkpoint={"storage": "file:///var/lib/etrain/ckpt"}),
    "async-alias": spec(checkpoint={"async": True}),
    "async-field-name": spec(checkpoint={"async_": True}),
    "warmup-one-below-steps": spec(train={"steps": 10, "warmup_steps": 9}),
    "sgd-momentum": spec(train={"optimizer": "sgd", "momentum": 0.9}),
    "bf16": spec(train={"precision": "bf16"}),
    "unlimited-failures": spec(failure={"max_failures": -1}),
    "every-seconds": spec(checkpoint={"every_steps": None, "every_seconds": 30}),
    # object storage
    "storage-s3-bucket": spec(checkpoint={"storage": "s3://my-bucket"}),
    "storage-s3-prefix": spec(checkpoint={"storage": "s3://my-bucket/a/b"}),
    "storage-s3-minio": spec(
        checkpoint={"storage": "s3://ckpt.example/jobs"},
        stores={
            "s3": {
                "endpoint_url": "http://minio.etrain.svc:9000",
                "region": "us-east-1",
                "credentials_secret": "minio-creds",
            }
        },
    ),
    "storage-s3-https-endpoint": spec(
        checkpoint={"storage": "s3://my-bucket/p"},
        stores={"s3": {"endpoint_url": "https://s3.example.com"}},
    ),
    "storage-gs": spec(checkpoint={"storage": "gs://my_bucket/prefix"}),
    "storage-gs-emulator": spec(
        checkpoint={"storage": "gs://my_bucket/p"},
        stores={"gcs": {"endpoint_url": "http://gcs-emulator:9023/"}},
    ),
    # retention and the automatic interval
    "keep-every": spec(checkpoint={"keep_every": 1000}),
    "keep-every-with-every-seconds": spec(checkpoint={"every_seconds": 60, "keep_every": 7}),
    "interval-auto": spec(checkpoint={"interval": "auto"}),
    # held-out evaluation
    "eval-fraction": spec(data={"eval_fraction": 0.1}, train={"eval_every_steps": 5}),
    "eval-fraction-at-the-end": spec(data={"eval_fraction": 0.5}),
    "eval-source": spec(
        data={
            "source": "jsonl",
            "path": "/d/train.jsonl",
            "shape": "instruction",
            "eval": {"source": "jsonl", "path": "/d/eval.jsonl", "shape": "instruction"},
        },
        train={"eval_every_steps": 1, "eval_samples": 64},
    ),
    "chat-template-file": spec(
        data={
            "source": "jsonl",
            "path": "/d/c.jsonl",
            "shape": "chat",
            "chat_template": "/d/t.jinja",
        }
    ),
    "chat-template-name": spec(
        data={"source": "jsonl", "path": "/d/c.jsonl", "shape": "chat", "chat_template": "tool_use"}
    ),
    "mixed-sources": spec(
        data={
            "seq_len": 64,
            "sources": [
                {"source": "jsonl", "path": "/d/a.jsonl", "shape": "instruction", "weight": 3},
                {"source": "text", "path": "/d/b.txt", "weight": 1},
            ],
            "eval": {"source": "jsonl", "path": "/d/e.jsonl", "shape": "instruction"},
        }
    ),
    "sources-each-held-out": spec(
        data={"sources": [{"weight": 1, "eval_fraction": 0.1}, {"weight": 2}]},
        train={"eval_every_steps": 10},
    ),
    "packed-instructions": spec(
        data={"source": "jsonl", "path": "/d/a.jsonl", "shape": "instruction", "packing": True}
    ),
    "packed-prepared": spec(data={"source": "prepared", "path": "/d/p", "packing": True}),
    "keep-best-and-early-stopping": spec(
        data={"eval_fraction": 0.1},
        train={"eval_every_steps": 5, "early_stopping": {"patience": 3, "min_delta": 0.01}},
        checkpoint={"every_steps": 10, "keep_best": 2},
    ),
    "keep-best-with-a-time-interval": spec(
        data={"eval_fraction": 0.1},
        train={"eval_every_steps": 5},
        checkpoint={"every_seconds": 60, "keep_best": 1},
    ),
    "eval-from-an-object-store": spec(
        data={"eval": {"source": "jsonl", "path": "s3://rows/eval.jsonl"}},
        stores={"s3": {"credentials_secret": "acme"}},
    ),
    "interval-auto-initial-steps": spec(
        checkpoint={"interval": "auto", "every_steps": 50, "mtbf_prior_s": 3600, "keep_every": 7}
    ),
}


@pytest.mark.parametrize("data", list(GOOD.values()), ids=list(GOOD))
def test_good_specs_validate(data):
    parsed = parse_spec(data)
    assert isinstance(parsed, JobSpec)
    assert parsed.name == data["name"]


# (spec, field the rejection must name). The field is looked for in the message
# and in the error location together, which is what the API's 422 shows.
BAD = {
    # layouts the model cannot take
    "tp-not-dividing-heads": (
        spec(
            parallelism={"strategy": "tp", "tp": 8},
            resources={"workers": 8},
            train={"global_batch_size": 16, "micro_batch_size": 2},
        ),
        "parallelism.tp",
    ),
    "pp-more-stages-than-layers": (
        spec(
            parallelism={"strategy": "pp", "pp": 4, "pipeline": {"microbatches": 4}},
            resources={"workers": 4},
        ),
        "parallelism.pp",
    ),
    "1f1b-fewer-microbatches-than-stages": (
        spec(
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
        spec(
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
        spec(
            parallelism={
                "strategy": "pp",
                "pp": 2,
                "pipeline": {"schedule": "interleaved_1f1b", "microbatches": 4},
            }
        ),
        "2 layers",
    ),
    "pp-batch-not-multiple-of-microbatches": (
        spec(
            parallelism={"strategy": "pp", "pp": 2, "pipeline": {"microbatches": 8}},
            train={"global_batch_size": 16, "micro_batch_size": 4},
        ),
        "parallelism.pipeline.microbatches",
    ),
    "seq-len-beyond-preset": (spec(data={"seq_len": 4096}), "data.seq_len"),
    # unknown fields, at every level
    "unknown-top": (spec(bogus=1), "bogus"),
    "unknown-model": (spec(model={"preset": "gpt-tiny", "weights": "x"}), "weights"),
    "preset-and-hf": (spec(model={"preset": "llama-7b", "hf": "/m"}), "model.hf"),
    "unknown-data": (spec(data={"tokenizer": "bpe"}), "tokenizer"),
    "unknown-parallelism": (spec(parallelism={"zero": 3}), "zero"),
    "unknown-fsdp": (spec(parallelism={"fsdp": {"offload": True}}), "offload"),
    "unknown-pipeline": (spec(parallelism={"pipeline": {"stages": 2}}), "stages"),
    "unknown-resources": (spec(resources={"memory": "8Gi"}), "memory"),
    "unknown-worker-range": (spec(resources={"workers": {"min": 1, "max": 2, "step": 1}}), "step"),
    "unknown-train": (spec(train={"micro_batch": 4}), "micro_batch"),
    "unknown-checkpoint": (spec(checkpoint={"intervals": "auto"}), "intervals"),
    "unknown-s3": (
        spec(checkpoint={"storage": "s3://my-bucket"}, stores={"s3": {"access_key": "x"}}),
        "access_key",
    ),
    "unknown-failure": (spec(failure={"retries": 1}), "retries"),
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
    "unknown-preset": (spec(model={"preset": "gpt-huge"}), "preset"),
    "unknown-source": (spec(data={"source": "parquet"}), "source"),
    "seq-len-too-small": (spec(data={"seq_len": 4}), "seq_len"),
    "unknown-strategy": (spec(parallelism={"strategy": "zero3"}), "strategy"),
    "zero-stage-4": (spec(parallelism={"fsdp": {"zero_stage": 4}}), "zero_stage"),
    "unknown-schedule": (
        spec(parallelism={"strategy": "pp", "pp": 2, "pipeline": {"schedule": "zb"}}),
        "schedule",
    ),
    "zero-workers": (spec(resources={"workers": 0}), "workers"),
    "negative-workers": (spec(resources={"workers": -2}), "workers"),
    "zero-cpus": (spec(resources={"cpus_per_worker": 0}), "cpus_per_worker"),
    "too-many-gpus": (spec(resources={"gpus_per_worker": 17}), "gpus_per_worker"),
    "zero-lr": (spec(train={"lr": 0}), "lr"),
    "unknown-optimizer": (spec(train={"optimizer": "lion"}), "optimizer"),
    "momentum-one": (spec(train={"optimizer": "sgd", "momentum": 1.0}), "momentum"),
    "unknown-precision": (spec(train={"precision": "fp16"}), "precision"),
    "keep-last-zero": (spec(checkpoint={"keep_last": 0}), "keep_last"),
    "max-failures-below-minus-one": (spec(failure={"max_failures": -2}), "max_failures"),
    # worker range
    "range-min-above-max": (
        spec(resources={"workers": {"min": 3, "max": 2}}),
        "resources.workers.min",
    ),
    "range-min-zero": (spec(resources={"workers": {"min": 0, "max": 2}}), "min"),
    "range-max-missing": (spec(resources={"workers": {"min": 1}}), "max"),
    # batch arithmetic
    "global-not-multiple-of-micro": (
        spec(train={"global_batch_size": 10, "micro_batch_size": 4}),
        "train.global_batch_size",
    ),
    "global-not-multiple-of-micro-x-dp": (
        spec(resources={"workers": 4}, train={"global_batch_size": 8, "micro_batch_size": 4}),
        "train.global_batch_size",
    ),
    "elastic-dp-3-breaks-batch": (
        spec(
            resources={"workers": {"min": 2, "max": 4}},
            train={"global_batch_size": 16, "micro_batch_size": 4},
        ),
        "train.global_batch_size",
    ),
    "tp-elastic-dp-breaks-batch": (
        spec(
            parallelism={"strategy": "tp", "tp": 2},
            resources={"workers": {"min": 2, "max": 6}},
            train={"global_batch_size": 8, "micro_batch_size": 4},
        ),
        "train.global_batch_size",
    ),
    # degrees vs strategy
    "ddp-with-tp": (spec(parallelism={"strategy": "ddp", "tp": 2}), "parallelism.tp"),
    "fsdp-with-tp": (spec(parallelism={"strategy": "fsdp", "tp": 2}), "parallelism.tp"),
    "ddp-with-pp": (spec(parallelism={"strategy": "ddp", "pp": 2}), "parallelism.pp"),
    "tp-with-pp": (spec(parallelism={"strategy": "tp", "tp": 2, "pp": 2}), "parallelism.pp"),
    "pp-with-tp": (spec(parallelism={"strategy": "pp", "tp": 2, "pp": 2}), "parallelism.tp"),
    # dp x tp x pp = workers
    "workers-not-multiple-of-tp": (
        spec(parallelism={"strategy": "tp", "tp": 2}, resources={"workers": 3}),
        "resources.workers",
    ),
    "elastic-max-not-multiple-of-tp-pp": (
        spec(
            parallelism={"strategy": "hybrid", "tp": 2, "pp": 2},
            resources={"workers": {"min": 4, "max": 6}},
        ),
        "resources.workers",
    ),
    "dp-times-tp-not-workers": (
        spec(parallelism={"strategy": "tp", "dp": 2, "tp": 2}, resources={"workers": 2}),
        "parallelism.dp",
    ),
    "dp-with-elastic-workers": (
        spec(parallelism={"dp": 2}, resources={"workers": {"min": 1, "max": 2}}),
        "parallelism.dp",
    ),
    "dp-zero": (spec(parallelism={"dp": 0}), "dp"),
    # data
    "text-without-path": (spec(data={"source": "text"}), "data.path"),
    "jsonl-without-path": (spec(data={"source": "jsonl"}), "data.path"),
    "jsonl-empty-path": (spec(data={"source": "jsonl", "path": ""}), "data.path"),
    "synthetic-with-path": (spec(data={"source": "synthetic", "path": "/x"}), "data.path"),
    # checkpoint storage schemes
    "storage-http": (spec(checkpoint={"storage": "http://host/ckpt"}), "checkpoint.storage"),
    "storage-azure": (spec(checkpoint={"storage": "az://container/p"}), "checkpoint.storage"),
    "storage-bare-path": (spec(checkpoint={"storage": "/var/ckpt"}), "checkpoint.storage"),
    "storage-relative-file": (spec(checkpoint={"storage": "file://ckpt"}), "checkpoint.storage"),
    "storage-s3-no-bucket": (spec(checkpoint={"storage": "s3://"}), "checkpoint.storage"),
    "storage-s3-short-bucket": (spec(checkpoint={"storage": "s3://ab/p"}), "checkpoint.storage"),
    "storage-s3-uppercase-bucket": (
        spec(checkpoint={"storage": "s3://My-Bucket"}),
        "checkpoint.storage",
    ),
    "storage-s3-underscore-bucket": (
        spec(checkpoint={"storage": "s3://my_bucket"}),
        "checkpoint.storage",
    ),
    "storage-s3-empty-segment": (
        spec(checkpoint={"storage": "s3://my-bucket/a//b"}),
        "checkpoint.storage",
    ),
    "storage-s3-dotdot": (
        spec(checkpoint={"storage": "s3://my-bucket/a/../b"}),
        "checkpoint.storage",
    ),
    "storage-s3-query": (
        spec(checkpoint={"storage": "s3://my-bucket/p?versionId=1"}),
        "checkpoint.storage",
    ),
    "storage-s3-userinfo": (
        spec(checkpoint={"storage": "s3://AKIAX:secret@my-bucket/p"}),
        "checkpoint.storage",
    ),
    # stores.s3
    "s3-without-s3-paths": (spec(stores={"s3": {"region": "us-east-1"}}), "stores.s3"),
    "s3-beside-gs-paths-only": (
        spec(model={"hf": "gs://models/m"}, stores={"s3": {"region": "us-east-1"}}),
        "stores.s3",
    ),
    "old-and-new-s3-differ": (
        spec(
            checkpoint={"storage": "s3://my-bucket", "s3": {"region": "us-east-1"}},
            stores={"s3": {"region": "eu-west-1"}},
        ),
        "checkpoint.s3 (the old place of the s3 options) and stores.s3 differ",
    ),
    "old-and-new-gcs-differ": (
        spec(
            checkpoint={"storage": "gs://my-bucket", "gcs": {"endpoint_url": "http://a:1"}},
            stores={"gcs": {"endpoint_url": "http://b:1"}},
        ),
        "checkpoint.gcs (the old place of the gcs options) and stores.gcs differ",
    ),
    "s3-with-gs-storage": (
        spec(checkpoint={"storage": "gs://my-bucket"}, stores={"s3": {"region": "us-east-1"}}),
        "stores.s3",
    ),
    "s3-endpoint-not-a-url": (
        spec(
            checkpoint={"storage": "s3://my-bucket"}, stores={"s3": {"endpoint_url": "minio:9000"}}
        ),
        "stores.s3.endpoint_url",
    ),
    "s3-endpoint-with-userinfo": (
        spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"endpoint_url": "http://ak:sk@minio:9000"}},
        ),
        "stores.s3.endpoint_url",
    ),
    "s3-region-with-spaces": (
        spec(checkpoint={"storage": "s3://my-bucket"}, stores={"s3": {"region": "us east"}}),
        "stores.s3.region",
    ),
    "s3-secret-looks-like-a-key": (
        spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"credentials_secret": "AKIAIOSFODNN7EXAMPLE"}},
        ),
        "stores.s3.credentials_secret",
    ),
    "s3-secret-with-slash": (
        spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"credentials_secret": "wJalrXUtnFEMI/K7MDENG"}},
        ),
        "stores.s3.credentials_secret",
    ),
    # stores.gcs
    "gcs-with-s3-storage": (
        spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"gcs": {"endpoint_url": "http://gcs:9023"}},
        ),
        "stores.gcs",
    ),
    "gcs-without-gs-paths": (spec(stores={"gcs": {}}), "stores.gcs"),
    "gcs-endpoint-not-a-url": (
        spec(
            checkpoint={"storage": "gs://my-bucket"}, stores={"gcs": {"endpoint_url": "gcs:9023"}}
        ),
        "stores.gcs.endpoint_url",
    ),
    "gcs-endpoint-with-a-path": (
        spec(
            checkpoint={"storage": "gs://my-bucket"},
            stores={"gcs": {"endpoint_url": "http://gcs:9023/storage/v1"}},
        ),
        "stores.gcs.endpoint_url",
    ),
    "gcs-endpoint-with-userinfo": (
        spec(
            checkpoint={"storage": "gs://my-bucket"},
            stores={"gcs": {"endpoint_url": "https://user:pw@gcs"}},
        ),
        "stores.gcs.endpoint_url",
    ),
    "gcs-unknown-field": (
        spec(checkpoint={"storage": "gs://my-bucket"}, stores={"gcs": {"token": "x"}}),
        "token",
    ),
    # retention and the automatic interval
    "keep-every-zero": (spec(checkpoint={"keep_every": 0}), "keep_every"),
    "keep-every-not-multiple-of-every-steps": (
        spec(checkpoint={"keep_every": 25}),
        "checkpoint.keep_every",
    ),
    "interval-unknown": (spec(checkpoint={"interval": "adaptive"}), "interval"),
    "interval-auto-with-every-seconds": (
        spec(checkpoint={"interval": "auto", "every_seconds": 60}),
        "checkpoint.every_seconds",
    ),
    "interval-auto-without-every-steps": (
        spec(checkpoint={"interval": "auto", "every_steps": None}),
        "checkpoint.every_steps",
    ),
    "mtbf-prior-zero": (spec(checkpoint={"interval": "auto", "mtbf_prior_s": 0}), "mtbf_prior_s"),
    # warmup
    "warmup-equals-steps": (spec(train={"steps": 10, "warmup_steps": 10}), "train.warmup_steps"),
    "warmup-above-steps": (spec(train={"steps": 10, "warmup_steps": 20}), "train.warmup_steps"),
    # held-out evaluation
    "eval-every-without-a-set": (spec(train={"eval_every_steps": 5}), "data.eval_fraction"),
    "eval-samples-without-a-set": (spec(train={"eval_samples": 5}), "train.eval_samples"),
    "eval-set-twice": (
        spec(data={"eval_fraction": 0.1, "eval": {"source": "synthetic"}}),
        "data.eval and data.eval_fraction",
    ),
    "eval-fraction-above-half": (spec(data={"eval_fraction": 0.6}), "data.eval_fraction"),
    "eval-fraction-zero": (spec(data={"eval_fraction": 0}), "data.eval_fraction"),
    "eval-source-without-path": (spec(data={"eval": {"source": "jsonl"}}), "data.eval.path"),
    "eval-seq-len-differs": (spec(data={"eval": {"seq_len": 64}}), "data.eval.seq_len"),
    "eval-path-nul": (
        spec(data={"eval": {"source": "jsonl", "path": "/d/a\x00.jsonl"}}),
        "data.eval.path must not",
    ),
    "eval-shape-needs-rows": (
        spec(data={"eval": {"source": "text", "path": "/d/a.txt", "shape": "chat"}}),
        "data.eval.shape chat",
    ),
    "chat-template-not-a-name": (
        spec(
            data={"source": "jsonl", "path": "/d/c.jsonl", "shape": "chat", "chat_template": "a b"}
        ),
        "data.chat_template must be a template name",
    ),
    "chat-template-for-instructions": (
        spec(
            data={
                "source": "jsonl",
                "path": "/d/c.jsonl",
                "shape": "instruction",
                "chat_template": "/d/t.jinja",
            }
        ),
        "data.chat_template renders chat messages",
    ),
    "chat-template-nul": (
        spec(
            data={
                "source": "jsonl",
                "path": "/d/c.jsonl",
                "shape": "chat",
                "chat_template": "/d/\x00",
            }
        ),
        "data.chat_template must not contain control",
    ),
    "sources-beside-a-source": (
        spec(data={"source": "jsonl", "path": "/d/a", "sources": [{"weight": 1}, {"weight": 2}]}),
        "move data.path, data.source into the sources",
    ),
    "one-source": (spec(data={"sources": [{"weight": 1}]}), "data.sources"),
    "source-weight-zero": (
        spec(data={"sources": [{"weight": 0}, {"weight": 1}]}),
        "data.sources.0.weight",
    ),
    "source-without-path": (
        spec(data={"sources": [{"weight": 1}, {"weight": 1, "source": "jsonl"}]}),
        "data.sources.path is required",
    ),
    "sources-with-a-held-out-share": (
        spec(data={"eval_fraction": 0.1, "sources": [{"weight": 1}, {"weight": 1}]}),
        "give each source its eval_fraction",
    ),
    "sources-held-out-twice": (
        spec(
            data={
                "sources": [{"weight": 1, "eval_fraction": 0.1}, {"weight": 1}],
                "eval": {"source": "synthetic"},
            }
        ),
        "data.eval and data.sources.<i>.eval_fraction",
    ),
    "source-seq-len-differs": (
        spec(data={"sources": [{"weight": 1, "seq_len": 64}, {"weight": 1}]}),
        "data.sources.0.seq_len (64) must equal data.seq_len",
    ),
    "packed-text": (
        spec(data={"source": "text", "path": "/d/a.txt", "packing": True}),
        "data.packing packs instruction or chat samples",
    ),
    "packed-pipeline": (
        spec(
            data={"source": "jsonl", "path": "/d/a", "shape": "chat", "packing": True},
            parallelism={"strategy": "pp", "pp": 2},
        ),
        "data.packing is not available with pipeline parallelism",
    ),
    "keep-best-without-evaluations": (
        spec(data={"eval_fraction": 0.1}, checkpoint={"keep_best": 2}),
        "checkpoint.keep_best needs train.eval_every_steps",
    ),
    "keep-best-on-saves-not-evaluated": (
        spec(
            data={"eval_fraction": 0.1},
            train={"eval_every_steps": 4},
            checkpoint={"every_steps": 10, "keep_best": 2},
        ),
        "must be a multiple of train.eval_every_steps (4); use 8",
    ),
    "early-stopping-without-a-set": (
        spec(train={"early_stopping": {"patience": 2}}),
        "train.early_stopping needs an evaluation set",
    ),
    "early-stopping-without-evaluations": (
        spec(data={"eval_fraction": 0.1}, train={"early_stopping": {"patience": 2}}),
        "train.early_stopping needs train.eval_every_steps",
    ),
    "early-stopping-patience-zero": (
        spec(
            data={"eval_fraction": 0.1},
            train={"eval_every_steps": 1, "early_stopping": {"patience": 0}},
        ),
        "train.early_stopping.patience",
    ),
    "eval-every-zero": (
        spec(data={"eval_fraction": 0.1}, train={"eval_every_steps": 0}),
        "train.eval_every_steps",
    ),
    # control characters in the places a spec names (the OS refuses a NUL in a path)
    "data-path-nul": (spec(data={"source": "jsonl", "path": "/d/a\x00.jsonl"}), "data.path"),
    "model-hf-newline": (spec(model={"hf": "/m\n"}), "model.hf must not contain control"),
    "model-tokenizer-del": (spec(model={"tokenizer": "/t\x7f"}), "model.tokenizer must not"),
    "storage-nul": (spec(checkpoint={"storage": "file:///c\x00"}), "checkpoint.storage must not"),
    "storage-tab-in-bucket": (spec(checkpoint={"storage": "s3://buc\tket"}), "U+0009"),
    "gcs-endpoint-c1": (
        spec(
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
        (spec(train={"global_batch_size": 10, "micro_batch_size": 4}), "train.micro_batch_size"),
        (spec(train={"steps": 10, "warmup_steps": 10}), "train.steps"),
        (spec(resources={"workers": {"min": 3, "max": 2}}), "resources.workers.max"),
        (
            spec(parallelism={"strategy": "tp", "tp": 2}, resources={"workers": 3}),
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
            spec(resources={"workers": 3}, train={"global_batch_size": 16, "micro_batch_size": 4})
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
        parse_spec(spec(**{section: {key: float("inf")}}))


@pytest.mark.parametrize("data", list(GOOD.values()), ids=list(GOOD))
def test_json_dump_revalidates_to_an_equal_spec(data):
    parsed = parse_spec(data)
    dumped = parsed.model_dump(mode="json", by_alias=True)
    again = JobSpec.model_validate(dumped)
    assert again == parsed
    assert JobSpec.model_validate_json(parsed.model_dump_json(by_alias=True)) == parsed


def test_async_alias_dumps_and_loads_as_async():
    parsed = parse_spec(spec(checkpoint={"async": True}))
    assert parsed.checkpoint.async_ is True
    dumped = parsed.model_dump(mode="json", by_alias=True)
    assert dumped["checkpoint"]["async"] is True
    assert "async_" not in dumped["checkpoint"]


def test_storage_uris_are_normalised():
    assert (
        parse_spec(spec(checkpoint={"storage": "s3://my-bucket/a/b/"})).checkpoint.storage
        == "s3://my-bucket/a/b"
    )
    s3 = parse_spec(
        spec(
            checkpoint={"storage": "s3://my-bucket"},
            stores={"s3": {"endpoint_url": "http://minio:9000/"}},
        )
    ).stores.s3
    assert s3.endpoint_url == "http://minio:9000"
    gcs = parse_spec(
        spec(
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
        parse_spec(spec(**sections))
    for text in (str(info.value), repr(info.value.errors(include_input=False))):
        assert "AKIAIOSFODNN7EXAMPLE" not in text and "wJalrXUtnFEMI" not in text


def test_checkpoint_defaults_keep_the_fixed_interval():
    ck = parse_spec({"name": "tiny"}).checkpoint
    assert (ck.interval, ck.mtbf_prior_s, ck.keep_every) == (None, 86400.0, None)
    assert ck.every_steps == 10


def test_elastic_workers_round_trip_as_a_range():
    parsed = parse_spec(
        spec(
            resources={"workers": {"min": 1, "max": 4}},
            train={"global_batch_size": 48, "micro_batch_size": 4},
        )
    )
    assert parsed.resources.min_workers == 1 and parsed.resources.max_workers == 4
    assert parsed.model_dump(mode="json")["resources"]["workers"] == {"min": 1, "max": 4}


def test_defaults_are_a_two_worker_cpu_ddp_job():
    parsed = parse_spec({"name": "tiny"})
    assert parsed.parallelism.strategy == "ddp"
    assert parsed.resources.min_workers == parsed.resources.max_workers == 2
    assert parsed.resources.gpus_per_worker == 0
    assert parsed.checkpoint.storage is None and parsed.checkpoint.async_ is False


def test_spec_is_frozen():
    parsed = parse_spec({"name": "tiny"})
    with pytest.raises(ValidationError):
        parsed.name = "other"


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
    parsed = parse_spec(spec(**overrides))
    assert parsed.data_parallel_size(world_size) == dp
    assert parsed.grad_accum_steps(world_size) == accum
    # The global batch is invariant: micro x accum x dp always gives it back.
    assert parsed.train.micro_batch_size * accum * dp == parsed.train.global_batch_size


def test_every_elastic_size_keeps_the_global_batch():
    parsed = parse_spec(
        spec(
            resources={"workers": {"min": 1, "max": 4}},
            train={"global_batch_size": 48, "micro_batch_size": 4},
        )
    )
    for n in range(1, 5):
        dp = parsed.data_parallel_size(n)
        assert parsed.grad_accum_steps(n) * parsed.train.micro_batch_size * dp == 48


def test_stores_serve_every_path_of_their_scheme():
    parsed = parse_spec(
        spec(
            model={"hf": "s3://models/m"},
            data={"source": "jsonl", "path": "gs://rows/train.jsonl"},
            stores={"s3": {"credentials_secret": "acme"}, "gcs": {"endpoint_url": "http://g:1"}},
        )
    )
    assert parsed.stores.s3.credentials_secret == "acme" and parsed.checkpoint.storage is None


def test_an_evaluation_source_reads_samples_of_the_training_length():
    parsed = parse_spec(spec(data={"seq_len": 32, "eval": {"source": "synthetic"}}))
    assert parsed.data.eval.seq_len == 32
    again = JobSpec.model_validate_json(parsed.model_dump_json())
    assert again == parsed


def test_an_unused_store_is_refused_unless_the_evaluation_source_uses_it():
    eval_s3 = {"eval": {"source": "jsonl", "path": "s3://rows/eval.jsonl"}}
    stores = {"s3": {"credentials_secret": "acme"}}
    assert parse_spec(spec(data=eval_s3, stores=stores)).stores.s3 is not None
    with pytest.raises(ValidationError, match=r"data\.eval\.path"):
        parse_spec(spec(data={"eval_fraction": 0.1}, stores=stores))


@pytest.mark.parametrize("name", ["s3", "gcs"])
def test_old_form_moves_to_stores_and_dumps_only_the_new_form(name):
    options = {"s3": {"endpoint_url": "http://minio:9000"}, "gcs": {"endpoint_url": "http://g:1"}}
    storage = {"s3": "s3://my-bucket/p", "gcs": "gs://my-bucket/p"}[name]
    old = parse_spec(spec(checkpoint={"storage": storage, name: options[name]}))
    new = parse_spec(spec(checkpoint={"storage": storage}, stores={name: options[name]}))
    assert old == new
    assert getattr(old.stores, name).endpoint_url == options[name]["endpoint_url"]
    dumped = old.model_dump(mode="json", by_alias=True)
    assert name not in dumped["checkpoint"]
    assert dumped["stores"][name]["endpoint_url"] == options[name]["endpoint_url"]
    # Both forms with the same value (unset fields as null or left out) are one spec.
    given = {**options[name], "region": None} if name == "s3" else options[name]
    both = spec(checkpoint={"storage": storage, name: options[name]}, stores={name: given})
    assert parse_spec(both) == new
