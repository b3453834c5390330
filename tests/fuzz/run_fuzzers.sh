#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in their own build dir and runs each for a short,
# bounded time: a regression check that the parsers of network and disk bytes still survive
# random input. Long campaigns: run the binaries by hand with -max_total_time.
# Usage: run_fuzzers.sh SOURCE_DIR BUILD_DIR SECONDS_PER_TARGET
set -euo pipefail
src="$1"
build="$2"
seconds="$3"

if ! command -v clang++-14 >/dev/null; then
  echo "SKIP: clang++-14 is not installed (scripts/install-deps.sh test installs it)"
  exit 77
fi

CC=clang-14 CXX=clang++-14 cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDDP_BUILD_FUZZERS=ON -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF -DDDP_WITH_TORCH=OFF \
  >/dev/null
cmake --build "$build" --target store_frame_fuzz idx_fuzz etcd_reply_fuzz dcp_metadata_fuzz

corpus="$build/corpus"
mkdir -p "$corpus/idx" "$corpus/store" "$corpus/etcd" "$corpus/pickle"
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
# Seeds: a valid IDX header with data, and the head of a real label file when present.
printf '\x00\x00\x08\x01\x00\x00\x00\x03abc' >"$corpus/idx/small"
labels=/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
if [[ -r $labels ]]; then zcat "$labels" | head -c 200 >"$corpus/idx/labels" || true; fi

for target in store_frame_fuzz idx_fuzz etcd_reply_fuzz dcp_metadata_fuzz; do
  dir="$corpus/store"
  [[ $target == idx_fuzz ]] && dir="$corpus/idx"
  [[ $target == etcd_reply_fuzz ]] && dir="$corpus/etcd"
  [[ $target == dcp_metadata_fuzz ]] && dir="$corpus/pickle"
  echo "== $target for ${seconds}s"
  "$build/fuzz/$target" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$dir" \
    2>&1 | tail -n 5
done
