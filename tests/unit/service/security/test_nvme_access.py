"""DeepSpeed's NVMe offload only where the operator enables it (ETRAIN_POLICY_NVME_ROOT):
refused at submit and plan without it (a 422 naming the field and the setting); with it,
each tenant's jobs swap beneath <root>/<tenant>, which the job's environment names and its
write roots hold (the workers make and check the job's folder there at use)."""

from __future__ import annotations

import json

import pytest

from service.domain.reconciler import Reconciler
from service.settings import Settings
from tests.support.api import api_client, tenant_token
from tests.support.fakes import FakeBackend
from workers.spec import parse_spec
from workers.storage.nvme import NVME_ENV

NVME = {
    "name": "nvme",
    "resources": {"workers": 2},
    "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2},
    "data": {"seq_len": 16, "num_samples": 32},
    "parallelism": {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "cpu"},
    },
}


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plan"])
def test_nvme_offload_is_refused_where_the_operator_enables_none(tmp_path, route):
    with api_client(tmp_path, FakeBackend(cpus=4)) as c:
        headers = tenant_token(c, "team-a")
        body = NVME if route == "/v1/jobs" else {"spec": NVME}
        r = c.post(route, json=body, headers=headers)
        assert r.status_code == 422, r.text
        errors = {tuple(e["loc"]): e["msg"] for e in r.json()["detail"]}
        msg = errors[("body", "parallelism", "deepspeed", "offload_optimizer")]
        assert "ETRAIN_POLICY_NVME_ROOT" in msg and "use cpu or none" in msg
        assert len(errors) == 1  # offload_param cpu is fine
        cpu = {**NVME, "parallelism": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}}
        ok = c.post(route, json=cpu if route == "/v1/jobs" else {"spec": cpu}, headers=headers)
        assert ok.status_code in (200, 201), ok.text


def test_with_a_root_each_tenants_jobs_swap_in_their_own_area(tmp_path, stores):
    root = tmp_path / "nvme"
    settings = Settings(env="development", data_dir=tmp_path, port=8123, policy_nvme_root=root)
    backend = FakeBackend(cpus=4)
    tenant = stores.tokens.create_tenant("acme").id
    spec = parse_spec(NVME)
    stores.jobs.create_job(tenant_id=tenant, name="nvme", spec=spec, min_workers=2)
    Reconciler(stores, backend, settings.reconciler).tick()
    env = backend.submitted[0].env
    assert env[NVME_ENV] == str(root / "acme")
    assert str(root / "acme") in json.loads(env["ETRAIN_STORAGE_ROOTS"])["write"]
