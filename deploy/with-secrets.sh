#!/bin/sh
# Runs its arguments with the compose cluster's secrets in the environment, each read from
# the file deploy/init_secrets.py wrote (the volumes under /run/kvserve): a file this
# container does not mount sets nothing, so each service gets only its own secrets.
# docker-compose.yml runs every worker and the router, and their health checks, through it:
#   sh /app/deploy/with-secrets.sh kvserve probe worker
set -eu
dir=${KVSERVE_SECRETS_DIR:-/run/kvserve}
load() { # load VARIABLE FILE
  if [ -r "$dir/$2" ]; then
    value=$(cat "$dir/$2")
    export "$1=$value"
  fi
}
# A worker mounts worker/, the router router/; cluster_secret holds their role's grant,
# never the secret itself, and redis_username/redis_password their role's own Redis user,
# never the administrator's (deploy/init_secrets.py).
load KVSERVE_CLUSTER_SECRET worker/cluster_secret
load KVSERVE_REDIS_USERNAME worker/redis_username
load KVSERVE_REDIS_PASSWORD worker/redis_password
load KVSERVE_CLUSTER_SECRET router/cluster_secret
load KVSERVE_REDIS_USERNAME router/redis_username
load KVSERVE_REDIS_PASSWORD router/redis_password
load KVSERVE_API_KEY router/api_key
exec "$@"
