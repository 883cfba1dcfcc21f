#!/usr/bin/env bash
# The Ray auth token of the launcher clusters (cluster/aws.yaml, gcp.yaml, local.yaml): a random secret in
# ~/.madr/ray_auth_token (outside the repository, mode 600), created once; `ray up` copies it to every node
# (file_mounts) and every `ray start` runs with RAY_AUTH_MODE=token. Jobs need it too:
#   python -m pipelines.jobs pipeline ... --address http://127.0.0.1:8265 --token-file ~/.madr/ray_auth_token
# Run before `ray up`; without the file `ray up` fails instead of starting an open cluster.
set -euo pipefail
token="${MADR_RAY_TOKEN_FILE:-$HOME/.madr/ray_auth_token}"
if [ ! -s "$token" ]; then
  umask 077
  mkdir -p "$(dirname "$token")"
  python3 -c 'import secrets; print(secrets.token_hex(32))' > "$token"
fi
chmod 600 "$token"
echo "$token"
