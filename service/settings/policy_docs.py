"""What the operator's policy settings mean: the access policy's place lists, the control
loop's lease (``Settings`` field descriptions; the settings reference in docs/ is generated
from them)."""

OBJECT_STORES = (
    's3:// and gs:// prefixes each tenant (by name; "*" = every tenant) may use as '
    "checkpoint.storage (and to read model.hf, model.tokenizer, data.path and data.eval.path "
    'from), as JSON, e.g. {"*": ["s3://ckpt/{tenant}"]}; {tenant} is the tenant\'s name; '
    "gs:// jobs use the service's Google credentials. Unset = none."
)
ENDPOINTS = (
    'Object-store endpoint URLs each tenant ("*" = every tenant) may name in '
    'stores.s3/gcs.endpoint_url, as JSON, e.g. {"*": ["http://minio:9000"]}. Unset = none: '
    "the service sends requests only to endpoints listed here."
)
TRACKING_URIS = (
    'MLflow tracking servers each tenant ("*" = every tenant) may name in '
    'metrics.mlflow.tracking_uri, as JSON, e.g. {"*": ["https://mlflow.example.com"]} (a '
    "listed URL also allows the paths under it). Unset = any http(s) server; a file: store "
    "must lie inside the tenant's checkpoint area either way."
)
SECRETS = (
    "credentials_secret names (stores.s3, metrics.mlflow, metrics.wandb) each tenant "
    '("*" = every tenant) may use, as JSON; a tenant not listed may use the secret named '
    "after it."
)
NVME_ROOT = (
    "A folder on every node's local NVMe where DeepSpeed jobs may swap (parallelism.deepspeed "
    "offload_optimizer / offload_param nvme): tenant T's jobs each swap beneath "
    "<this>/T/<job id>, removed as the job ends. Unset = NVMe offload is refused."
)

LEADER_LEASE = (
    "Replicas of etrain serve on one PostgreSQL database: one of them, the leader, runs the "
    "scheduler and the reconciler, holding a lease in the database that it renews every "
    "quarter of this many seconds. When it stops renewing (killed, paused, cut off from the "
    "database) another replica takes over within this time. On SQLite one process serves."
)
