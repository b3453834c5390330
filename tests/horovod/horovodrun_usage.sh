#!/bin/sh
# horovodrun's usage errors: exit status 2 and one line naming the problem, nothing started;
# -cb describes the layer. Usage: horovodrun_usage.sh PYTHON (with `import ddp` on its path).
py=$1
expect_usage() {  # expect_usage "message" args...
  msg=$1; shift
  out=$("$py" -m ddp.horovodrun "$@" 2>&1)
  rc=$?
  if [ "$rc" != 2 ]; then echo "horovodrun $*: exit $rc, expected 2: $out"; exit 1; fi
  case "$out" in *"$msg"*) ;; *) echo "horovodrun $*: said '$out', expected '$msg'"; exit 1;; esac
}
expect_usage "-np N (N >= 1) is required" python x.py
expect_usage "needs 4 slots but the hosts have 2" -np 4 -H a:1,b:1 python x.py
expect_usage "--jsrun is not supported" -np 2 --jsrun python x.py
expect_usage "no training command given" -np 2
expect_usage "same number of processes on every host" -np 3 -H a:2,b:2 python x.py
export MASTER_PORT=http
expect_usage "MASTER_PORT='http' is not a port number" -np 4 -H a:2,b:2 python x.py
unset MASTER_PORT
cb=$("$py" -m ddp.horovodrun -cb 2>&1) || { echo "-cb failed: $cb"; exit 1; }
case "$cb" in *"[X] PyTorch"*) ;; *) echo "-cb does not list PyTorch: $cb"; exit 1;; esac
# Its reader gone before it writes (as `| head -1`, `| grep -q` can be): no BrokenPipeError
# traceback.
cb_err=$(mktemp)
"$py" -m ddp.horovodrun -cb 2>"$cb_err" | true
if [ -s "$cb_err" ]; then echo "-cb into a closed pipe wrote to stderr: $(cat "$cb_err")"; rm -f "$cb_err"; exit 1; fi
rm -f "$cb_err"
echo "horovodrun usage errors ok"
