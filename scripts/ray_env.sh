# Network hygiene for Ray (source this before anything that may start Ray): no usage stats, no cloud
# metadata probe, bind 127.0.0.1. See docs/development.md, "Running without outbound network".
export RAY_USAGE_STATS_ENABLED=0
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
if [ ! -f "$HOME/ray_bootstrap_config.yaml" ]; then
  printf 'provider:\n  type: local\n' > "$HOME/ray_bootstrap_config.yaml"
fi
# Ray starts its workers (tasks, actors, Serve's proxy and replicas) at niceness 15 by default: on a machine shared
# with other work they then get a sliver of the CPU any nice-0 process gets, and a served burst times out. 0 runs
# them at the priority of everything else (pipelines.runtime.apply_ray_env sets the same default).
export RAY_worker_niceness="${RAY_worker_niceness:-0}"
# Ray Train polls its workers every 2 s by default; 0.2 s notices a finished fit sooner on small local runs.
export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="${RAY_TRAIN_HEALTH_CHECK_INTERVAL_S:-0.2}"
