#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in their own build dir and runs each for a short,
# bounded time: a regression check that the parsers of network and disk bytes still survive
# random input. Long campaigns: run the binaries by hand with -max_total_time.
# Usage: run_fuzzers.sh SOURCE_DIR BUILD_DIR SECONDS_PER_TARGET [with-torch]
# with-torch: the calling build has LibTorch, so snapshot_pickle_fuzz must build and run here
# too (its absence fails the test instead of skipping the target).
set -euo pipefail
src="$1"
build="$2"
seconds="$3"
torch_required=$([[ "${4:-}" == with-torch ]] && echo 1 || echo 0)

if ! command -v clang++-14 >/dev/null; then
  echo "SKIP: clang++-14 is not installed (scripts/install-deps.sh test installs it)"
  exit 77
fi

# DDP_WITH_TORCH=ON only finds LibTorch, for snapshot_pickle_fuzz: the targets built below are
# the fuzzers alone, never the torch layer. Without LibTorch that target is skipped (cmake warns,
# and this script says so below); the others still run.
CC=clang-14 CXX=clang++-14 cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDDP_BUILD_FUZZERS=ON -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF -DDDP_WITH_TORCH=ON \
  >/dev/null
targets=(store_frame_fuzz idx_fuzz etcd_reply_fuzz dcp_metadata_fuzz)
# The list first, then the search: `grep -q` in a pipe stops reading at its match, ninja dies of
# SIGPIPE, and under pipefail the target looked absent (it was skipped in every run until
# 2026-11-29).
build_targets="$(cmake --build "$build" --target help)"
if grep -q '^snapshot_pickle_fuzz:' <<<"$build_targets"; then
  targets+=(snapshot_pickle_fuzz)
elif ((torch_required)); then
  echo "FAIL: the fuzz build has no snapshot_pickle_fuzz target, but the build that runs this" \
    "test has LibTorch (see cmake's warning above)"
  exit 1
else
  echo "SKIP snapshot_pickle_fuzz: LibTorch was not found by the fuzz build (see cmake's warning" \
    "above; scripts/install-deps.sh makes .venv/ with torch)"
fi
cmake --build "$build" --target "${targets[@]}"

corpus="$build/corpus"
mkdir -p "$corpus/idx" "$corpus/store" "$corpus/etcd" "$corpus/pickle" "$corpus/snapshot"
# Seeds: replies of etcd's v3 JSON gateway (a range, a txn, a watch message).
printf '{"header":{"revision":"3"},"kvs":[{"key":"Zm9v","value":"YmFy","mod_revision":"2"}],"count":"1"}' \
  >"$corpus/etcd/range"
printf '{"header":{"revision":"9"},"succeeded":true,"responses":[{"response_put":{"prev_kv":{"key":"aw==","create_revision":"4"}}},{"response_range":{"kvs":[]}}]}' \
  >"$corpus/etcd/txn"
printf '{"result":{"header":{},"created":true,"events":[{"kv":{"key":"dzE="}}]}}' >"$corpus/etcd/watch"
# Edge cases: padding inside or before base64 ("=AAA", "AA=A"), trailing whitespace, integers
# past int64 (as strings and as JSON numbers): each must be a ProtocolError, nothing worse.
printf '{"header":{"revision":"3"},"kvs":[{"key":"=AAA","value":"AA=A"}],"count":"1"}' \
  >"$corpus/etcd/bad_padding"
printf '{"header":{"revision":"3"},"kvs":[{"key":"Zm9v    ","value":"QQ==\\n"}]}' \
  >"$corpus/etcd/whitespace"
printf '{"header":{"revision":"99999999999999999999"},"count":18446744073709551615}' \
  >"$corpus/etcd/overflow"
# Seeds: pickles (protocol 2): a small dict; 2,000 nested MARKs closed by LIST ops (a crafted
# deep nest once overflowed the snapshot reader's stack); a list appended to itself through
# the memo (a cycle).
printf '\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00b]q\x01u.' >"$corpus/pickle/dict"
{ printf '\x80\x02'; head -c 2000 /dev/zero | tr '\0' '('; head -c 2000 /dev/zero | tr '\0' 'l'; printf '.'; } \
  >"$corpus/pickle/deep"
printf '\x80\x02]q\x00h\x00a.' >"$corpus/pickle/memo_cycle"
# Seeds for the torch.save reader: the three pickles above, and two data.pkl records written by
# torch.save (PyTorch 2.13): {"model": OrderedDict(w=<2x3 float>, b=<a view of w's storage>,
# step=3), "opt": [1.5, "x", None, True, -7, 2**40, (b"\x00\xff", torch.device("cpu"))]}, and
# the state_dict of nn.Linear(2, 1) (with its _metadata BUILD).
cp "$corpus/pickle/dict" "$corpus/pickle/deep" "$corpus/pickle/memo_cycle" "$corpus/snapshot/"
{
  printf '\x80\x02}q\x00(X\x05\x00\x00\x00modelq\x01ccollections\x0aOrderedDict\x0aq\x02)R'
  printf 'q\x03(X\x01\x00\x00\x00wq\x04ctorch._utils\x0a_rebuild_tensor_v2\x0aq\x05((X\x07'
  printf '\x00\x00\x00storageq\x06ctorch\x0aFloatStorage\x0aq\x07X\x01\x00\x00\x000q\x08X'
  printf '\x03\x00\x00\x00cpuq\x09K\x06tq\x0aQK\x00K\x02K\x03\x86q\x0bK\x03K\x01\x86q\x0c'
  printf '\x89h\x02)Rq\x0dtq\x0eRq\x0fX\x01\x00\x00\x00bq\x10h\x05((h\x06h\x07h\x08h\x09K'
  printf '\x06tq\x11QK\x04K\x02\x85q\x12K\x01\x85q\x13\x89h\x02)Rq\x14tq\x15Rq\x16X\x04'
  printf '\x00\x00\x00stepq\x17K\x03uX\x03\x00\x00\x00optq\x18]q\x19(G?\xf8\x00\x00\x00'
  printf '\x00\x00\x00X\x01\x00\x00\x00xq\x1aN\x88J\xf9\xff\xff\xff\x8a\x06\x00\x00\x00'
  printf '\x00\x00\x01c_codecs\x0aencode\x0aq\x1bX\x03\x00\x00\x00\x00\xc3\xbfq\x1cX\x06'
  printf '\x00\x00\x00latin1q\x1d\x86q\x1eRq\x1fctorch\x0adevice\x0aq X\x03\x00\x00\x00cpu'
  printf 'q!\x85q"Rq#\x86q$eu.'
} >"$corpus/snapshot/torch_save"
{
  printf '\x80\x02ccollections\x0aOrderedDict\x0aq\x00)Rq\x01(X\x06\x00\x00\x00weightq\x02'
  printf 'ctorch._utils\x0a_rebuild_tensor_v2\x0aq\x03((X\x07\x00\x00\x00storageq\x04ctorc'
  printf 'h\x0aFloatStorage\x0aq\x05X\x01\x00\x00\x000q\x06X\x03\x00\x00\x00cpuq\x07K\x02t'
  printf 'q\x08QK\x00K\x01K\x02\x86q\x09K\x02K\x01\x86q\x0a\x89h\x00)Rq\x0btq\x0cRq\x0dX'
  printf '\x04\x00\x00\x00biasq\x0eh\x03((h\x04h\x05X\x01\x00\x00\x001q\x0fh\x07K\x01tq'
  printf '\x10QK\x00K\x01\x85q\x11K\x01\x85q\x12\x89h\x00)Rq\x13tq\x14Rq\x15u}q\x16X\x09'
  printf '\x00\x00\x00_metadataq\x17h\x00)Rq\x18X\x00\x00\x00\x00q\x19}q\x1aX\x07\x00\x00'
  printf '\x00versionq\x1bK\x01sssb.'
} >"$corpus/snapshot/state_dict"
# Memo fan-out: one dict shared 10 times per level of 7 lists (10^7 references in 181 bytes,
# found by this fuzzer): the reader converted every reference again (4 GB); it must share them.
{
  printf '\x80\x02}q\x00'
  for i in 0 1 2 3 4 5 6; do
    printf '0('
    for _ in 1 2 3 4 5 6 7 8 9 10; do printf "h\\x0$i"; done
    printf "lq\\x0$((i + 1))"
  done
  printf '.'
} >"$corpus/snapshot/memo_fanout"
# Regression inputs longer than -max_len, which the fuzzing runs below never reach (libFuzzer
# cuts longer seeds to max_len): each is executed once. A 99,999-deep "((((l" stream overflowed
# the snapshot reader's stack when its values were destroyed recursively; under ASan that took
# over 32,000 levels, past what 4,096 bytes can nest.
regress="$build/regress"
mkdir -p "$regress/snapshot_pickle_fuzz"
{ printf '\x80\x02'; head -c 99999 /dev/zero | tr '\0' '('
  head -c 99999 /dev/zero | tr '\0' 'l'; printf '.'; } >"$regress/snapshot_pickle_fuzz/deep_99999"
# Seeds: a valid IDX header with data, and the head of a real label file when present.
printf '\x00\x00\x08\x01\x00\x00\x00\x03abc' >"$corpus/idx/small"
labels=/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
if [[ -r $labels ]]; then zcat "$labels" | head -c 200 >"$corpus/idx/labels" || true; fi

for target in "${targets[@]}"; do
  dir="$corpus/store"
  [[ $target == idx_fuzz ]] && dir="$corpus/idx"
  [[ $target == etcd_reply_fuzz ]] && dir="$corpus/etcd"
  [[ $target == dcp_metadata_fuzz ]] && dir="$corpus/pickle"
  [[ $target == snapshot_pickle_fuzz ]] && dir="$corpus/snapshot"
  if [[ -d $regress/$target ]]; then
    echo "== $target on the regression inputs in $regress/$target"
    if ! "$build/fuzz/$target" -error_exitcode=1 "$regress/$target"/* \
      >"$regress/$target.log" 2>&1; then
      cat "$regress/$target.log"
      exit 1
    fi
  fi
  echo "== $target for ${seconds}s"
  # -error_exitcode=1: libFuzzer's default, 77, is ctest's skip code for fuzz.smoke, so a crash
  # or leak it found would have been reported as a skipped test.
  "$build/fuzz/$target" -max_total_time="$seconds" -max_len=4096 -error_exitcode=1 \
    -print_final_stats=1 "$dir" 2>&1 | tail -n 5
done
