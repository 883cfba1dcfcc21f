#!/usr/bin/env bash
# The shared storage of the launcher clusters (cluster/aws.yaml, gcp.yaml, local.yaml): one NFS export mounted at
# /mnt/shared on every node, so that every stage reads what the stage before it wrote, wherever each runs
# (experiment config: --set output_dir=/mnt/shared/madr/<name>). NFS because the stages need a POSIX file system:
# FAISS writes local files, and outputs and markers are renamed into place. s3:// and gs:// URIs work for inputs
# (data.catalog_dir, the encode job's input), read with pyarrow through the nodes' credentials, not for output_dir.
#
#   MADR_SHARED_NFS=fs-0123456789abcdef0.efs.us-west-2.amazonaws.com:/ cluster/shared_storage.sh save
#       on your machine, once, before `ray up`: writes ~/.madr/storage.env, which `ray up` copies to every node
#       (file_mounts). AWS: an EFS file system with a mount target in each availability zone of the cluster and a
#       security group that lets the nodes reach NFS (TCP 2049). GCP: a Filestore instance in the cluster's network
#       (MADR_SHARED_NFS=10.0.0.2:/madr). Your own machines: any NFS export (host:/path).
#       MADR_SHARED_NFS=none: no shared storage (one node only: stage outputs stay on the node that wrote them).
#   cluster/shared_storage.sh mount
#       a setup command of every node (the YAMLs run it): mounts $MADR_SHARED_NFS at $MADR_SHARED_DIR (default
#       /mnt/shared), once, and makes $MADR_SHARED_DIR/madr writable for the SSH user.
set -euo pipefail
ENV_FILE="${MADR_STORAGE_ENV:-$HOME/.madr/storage.env}"

sudo_() {  # root already, or sudo that never prompts
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

save() {
  if [ -z "${MADR_SHARED_NFS:-}" ]; then
    echo "shared_storage.sh: set MADR_SHARED_NFS (host:/export, or none)" >&2
    exit 2
  fi
  umask 077
  mkdir -p "$(dirname "$ENV_FILE")"
  printf 'MADR_SHARED_NFS=%q\nMADR_SHARED_DIR=%q\n' "$MADR_SHARED_NFS" "${MADR_SHARED_DIR:-/mnt/shared}" > "$ENV_FILE"
  echo "$ENV_FILE"
}

mount_nfs() {
  local dir="$1"
  if mountpoint -q "$dir"; then
    echo "$dir is mounted"
    return
  fi
  if ! command -v mount.nfs4 > /dev/null 2>&1; then
    sudo_ apt-get update -qq && sudo_ apt-get install -y -qq nfs-common
  fi
  sudo_ mkdir -p "$dir"
  sudo_ mount -t nfs4 -o nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport \
    "$MADR_SHARED_NFS" "$dir"
}

mount_shared() {
  if [ -f "$ENV_FILE" ]; then
    # shellcheck source=/dev/null
    . "$ENV_FILE"
  fi
  local dir="${MADR_SHARED_DIR:-/mnt/shared}"
  if [ -z "${MADR_SHARED_NFS:-}" ] || [ "$MADR_SHARED_NFS" = none ]; then
    echo "shared_storage.sh: warning: no MADR_SHARED_NFS in $ENV_FILE: $dir is not shared between nodes" >&2
    return
  fi
  mount_nfs "$dir"
  sudo_ mkdir -p "$dir/madr"
  sudo_ chown "$(id -u):$(id -g)" "$dir/madr"
  echo "$MADR_SHARED_NFS mounted at $dir; outputs go under $dir/madr"
}

case "${1:-}" in
  save) save ;;
  mount) mount_shared ;;
  *) echo "usage: cluster/shared_storage.sh save|mount (see the header)" >&2; exit 2 ;;
esac
