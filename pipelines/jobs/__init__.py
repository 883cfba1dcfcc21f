"""Cluster operations: one command per stage, run here on a local Ray or submitted with `ray job submit`,
and a `pipeline` command that runs them in order, skipping completed stages (`python -m pipelines.jobs`).

recipes.py       which recipe a config names (`recipe:`): its stage table, config check, left-out stages
stages.py        the product-search stage table (stage -> `python -m` entry point) and the chained stage keys
multilingual.py  the multilingual recipe's stage table (paper 004) and its config check
markers.py       completion markers `<state_dir>/<stage>.done.json` (local paths or object-store URIs)
runner.py        run a stage here (also the entrypoint of every submitted job: `run-stage`)
submit.py        the Ray job API client (token auth, runtime env, same-host jobs)
deploy.py        the deploy stage: `serve deploy` to a cluster or `serve run` here
local_cluster.py a loopback `ray start --head --block` with its own temp dir and token (`up` / `down`)
cli.py           the command line
"""
