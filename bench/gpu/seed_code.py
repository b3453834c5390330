"""Writes a file of a tutorial's code, unmodified, from the tutorial's text (../shared/seeds/).

    python3 seed_code.py SEED_FILE NAME [NAME ...] --out DIR

A file's code is the fenced block that follows a line holding only its NAME (e.g. multi_gpu.py;
blank lines between are allowed), as the tutorials present it. Exit status 1, naming the file,
when a NAME has no such block.
"""
import argparse
import os
import re
import sys

FENCE = re.compile(r"^\s*(`{3,})")


def code_block(lines, name):
    for i, line in enumerate(lines):
        if line.strip() != name:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        opening = FENCE.match(lines[j]) if j < len(lines) else None
        if not opening:
            continue
        body = []
        for line in lines[j + 1:]:
            closing = FENCE.match(line)
            if closing and line.strip() == closing.group(1):
                return "".join(body)
            body.append(line)
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("seed")
    p.add_argument("names", nargs="+")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    with open(a.seed, encoding="utf-8") as f:
        lines = f.readlines()
    os.makedirs(a.out, exist_ok=True)
    for name in a.names:
        code = code_block(lines, name)
        if code is None:
            sys.exit(f"seed_code: no code block after a line '{name}' in {a.seed}")
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.write(code)


if __name__ == "__main__":
    main()
