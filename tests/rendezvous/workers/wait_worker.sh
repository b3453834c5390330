#!/usr/bin/env bash
# A worker for the etcd tests: prints its world size and ranks, then runs until the file $DONE_FILE
# exists (exit 0), at most 180 s (exit 3: the test never said done).
echo "WORKER node=${NODE_TAG:-?} world=${WORLD_SIZE} rank=${RANK} group_rank=${GROUP_RANK} master=${MASTER_ADDR}"
for ((i = 0; i < 1800; i++)); do
  [[ -e "${DONE_FILE:?}" ]] && exit 0
  sleep 0.1
done
exit 3
