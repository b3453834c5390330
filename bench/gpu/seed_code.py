"""Writes a file of a tutorial's code, unmodified, from the tutorial's text (../shared/seeds/).

    python3 seed_code.py SEED_FILE NAME[@TEXT] [NAME[@TEXT] ...] --out DIR

A file's code is the fenced block that follows a line holding only its NAME (e.g. multi_gpu.py;
blank lines between are allowed), as tutorial 000 presents it. NAME@TEXT: the first fenced block
after the first line that contains TEXT (tutorials that name a file only in their prose, e.g.
004's cnn_cpu.py@"### 4.6.1." under that heading), written as NAME. Exit status 1, naming the
file, when a NAME has no such block.
"""
import argparse
import os
import re
import sys

FENCE = re.compile(r"^\s*(`{3,})")


def fenced_body(lines, j):
    """The body of the fenced block that opens at lines[j], or None when none opens there or it
    never closes."""
    opening = FENCE.match(lines[j]) if j < len(lines) else None
    if not opening:
        return None
    body = []
    for line in lines[j + 1:]:
        closing = FENCE.match(line)
        if closing and line.strip() == closing.group(1):
            return "".join(body)
        body.append(line)
    return None


def block_after(lines, text):
    """The first fenced block after the first line containing `text`."""
    for i, line in enumerate(lines):
        if text in line:
            for j in range(i + 1, len(lines)):
                if FENCE.match(lines[j]):
                    return fenced_body(lines, j)
            return None
    return None


def code_block(lines, name):
    for i, line in enumerate(lines):
        if line.strip() != name:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        body = fenced_body(lines, j)
        if body is not None:
            return body
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
    for spec in a.names:
        name, at, text = spec.partition("@")
        code = block_after(lines, text) if at else code_block(lines, name)
        if code is None:
            where = f"the first line containing '{text}'" if at else f"a line '{name}'"
            sys.exit(f"seed_code: no code block after {where} in {a.seed}")
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.write(code)


if __name__ == "__main__":
    main()
