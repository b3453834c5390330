#!/bin/sh
# Stands in for ssh in horovodrun's multi-host test (HOROVODRUN_SSH): skips ssh's options, then
# runs the remote command here with DDP_HOST_ID set to the host name, so ddp's backend treats
# each "host" as a separate node (shared memory within it, Gloo between them).
while [ $# -gt 2 ]; do shift; done
host=$1
DDP_HOST_ID=$host exec sh -c "$2"
