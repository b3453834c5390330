"""PyTorch's TCPStore doing what store_bench does, printing the same JSON lines (impl "torch").

Run with the .venv's interpreter (PyTorch 2.13; bench/python.sh). Usage:
  torch_store_bench.py [--iters N] [--clients N]
"""
import argparse
import datetime
import json
import os
import resource
import socket
import time

import torch.distributed as dist


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(port):
    return dist.TCPStore("127.0.0.1", port, is_master=False,
                         timeout=datetime.timedelta(seconds=120))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=4096)
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="stop connecting clients after this long and report the rate")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=120))
    c = client(port)
    value = b"v" * 16
    for _ in range(1000):
        c.set("warmup", value)
    start = time.perf_counter()
    for i in range(args.iters):
        c.set("key%d" % (i % 64), value)
    set_s = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(args.iters):
        c.get("key%d" % (i % 64))
    get_s = time.perf_counter() - start
    for op, secs in (("set", set_s), ("get", get_s)):
        print(json.dumps({"bench": "store_roundtrip", "impl": "torch", "op": op,
                          "iters": args.iters, "value_bytes": len(value),
                          "ops_per_s": round(args.iters / secs),
                          "us_per_op": round(secs * 1e6 / args.iters, 2)}), flush=True)

    # A PyTorch 1.13 TCPStore client costs about 6 descriptors in this process (measured), so
    # 4096 of them do not fit under a 20000 open-files limit: cap the count and say so.
    fd_cap = (hard - 200) // 6
    requested = args.clients
    args.clients = min(args.clients, fd_cap)

    # Clients connect one after another (a TCPStore constructor blocks in C++ holding the GIL,
    # so Python threads would not overlap them).
    stores = []
    start = time.perf_counter()
    try:
        for _ in range(args.clients):
            s = client(port)
            s.add("connect_add", 1)
            stores.append(s)
            if time.perf_counter() - start > args.budget_s:
                break
        secs = time.perf_counter() - start
        total = int(c.add("connect_add", 0))
        line = {"bench": "store_connect_add", "impl": "torch", "clients": len(stores),
                "threads": 1, "ms": round(secs * 1e3, 1), "count_ok": total == len(stores)}
        if args.clients < requested:
            line["capped"] = "%d requested; %d fit under the open-files limit %d" % (
                requested, args.clients, hard)
        if len(stores) < args.clients:
            line["incomplete"] = "stopped after %.0f s budget with %d of %d clients" % (
                args.budget_s, len(stores), args.clients)
        print(json.dumps(line), flush=True)
    except Exception as e:  # report how far it got instead of a traceback
        print(json.dumps({"bench": "store_connect_add", "impl": "torch", "clients": args.clients,
                          "connected": len(stores), "error": str(e)}), flush=True)
    print(json.dumps({"bench": "store_fds_per_client", "impl": "torch",
                      "fds": len(os.listdir("/proc/self/fd")), "clients": len(stores)}), flush=True)
    # Tearing down thousands of TCPStore objects takes PyTorch 1.13 many minutes (measured:
    # 20 min for 3330 clients); skip it.
    os._exit(0)


if __name__ == "__main__":
    main()
