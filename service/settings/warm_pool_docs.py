"""What the warm pool's and the embedded head's settings mean (``Settings`` field
descriptions; the settings reference in docs/ is generated from them)."""

STANDBY_DRIVERS = (
    "Job drivers kept started and warm ahead of the next job (ray-jobs backend): each is a "
    "Ray job that has imported the training stack and started processes for Ray Train's "
    "controller and ETRAIN_STANDBY_WORKERS workers, so a job handed to it skips their start. "
    "Each runs job after job: once a job succeeded it takes the next, with the processes "
    "that job's run started ahead for it. A new one starts when no admitted job is still "
    "before its first step (its warm-up would slow that job's start), within the warm "
    "pool's budget (ETRAIN_WARM_POOL_*). A warm one holds about 1.5-2 GB of host memory with "
    "2 workers and a CPU build of torch (PSS; GET /v1/cluster shows what they hold). 0 = "
    "start every job's driver when it is admitted."
)
STANDBY_WORKERS = (
    "Worker processes each standby driver warms on its node (at most one per CPU there, "
    "and within ETRAIN_WARM_POOL_PROCESSES; about 0.35 GB each with a CPU build of torch). "
    "A job with more workers starts the rest when it is handed over."
)
POOL_PROCESSES = (
    "Processes the standby drivers may hold together (each: its own, 3 for Ray Train's "
    "actors of a run, one per worker it warms; a standby warms fewer workers rather than "
    "exceed this). Unset: 2 + 2 per CPU of the head node."
)
POOL_MEMORY = (
    "Host memory (PSS, as the standbys report it) the standby drivers may hold together; a "
    "pool over it stops idle standbys until it fits. Unset: 20% of the head node's memory."
)
POOL_IDLE = (
    "Seconds without a job after which the warm pool stops its standby drivers and their "
    "processes; the next job starts cold and brings them back."
)

# The embedded head other machines join (etrain node join; docs/nodes.md).
RAY_NODE_IP = (
    "Address other machines reach the embedded Ray head at (e.g. its WireGuard or Tailscale "
    "address): the head advertises it and `etrain node join` joins it there, and its ports "
    "left at 0 take the documented join ports instead of free ones; unset = Ray's choice, "
    "for a head no other machine joins."
)
PORT_ZERO = "a free port (with ETRAIN_RAY_NODE_IP set: its join port, docs/nodes.md)"
