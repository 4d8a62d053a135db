#!/usr/bin/env python3
"""Instruction counts of the innermost loops that issue tensor-core instructions, from SASS.

Reads `cuobjdump -sass BINARY` output (a file or stdin) and, for each kernel whose name contains
every --match string, finds the loops (a backward branch and its target) that hold an HGMMA, HMMA
or IMMA instruction and contain no smaller such loop, and prints for each: its length in
instructions, its tensor-core instructions, and the opcodes by count. Instructions per mma step
is then the loop length over its mma count (issue budget, docs/cuda-backend.md). A loop's static
length counts its rarely run blocks too (a scale block's or a tile's end); "skipping" is the
length of the path that takes every conditional forward branch inside the loop, which skips
those blocks: in the decode kernels, the chunk whose scale block goes on, the common case. It
reads low where a conditional block holds common work (the tail loops that test each chunk
against the stream's end): take it from the whole-round loops.
Runs wherever cuobjdump does (scripts/sass.sh fetches one where the toolkit has none); it reads
text only.

    cuobjdump -sass build-gpu/tools/qmoe > sass.txt
    scripts/sass-loops.py sass.txt --match MixedInput --match 'ILi32E'
"""
import argparse
import collections
import re
import sys

FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
TARGET = re.compile(r"`\((\.L_x_\d+)\)|\b0x([0-9a-f]+)\b")
MMA = ("HGMMA", "HMMA", "IMMA", "QGMMA", "IGMMA")


def opcode(text):
    words = text.split()
    if words and words[0].startswith("@"):  # predicate guard
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def kernels(lines):
    name, body = None, []
    for line in lines:
        m = FUNC.match(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
        elif name:
            body.append(line)
    if name:
        yield name, body


def skipping(insns, index, labels, lo, hi):
    """Instructions of insns[lo..hi] left when every predicated forward branch inside is taken."""
    skipped = set()
    for i in range(lo, hi + 1):
        text = insns[i][1]
        if not text.startswith("@") or opcode(text) != "BRA":
            continue
        t = TARGET.search(text)
        if not t:
            continue
        dest = labels.get(t.group(1)) if t.group(1) else int(t.group(2), 16)
        j = index.get(dest)
        if j is not None and i < j <= hi:
            skipped.update(range(i + 1, j))
    return (hi - lo + 1) - len(skipped)


def loops(body):
    insns, labels = [], {}
    pending = []
    for line in body:
        m = LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = INSN.search(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for label in pending:
            labels[label] = addr
        pending = []
        insns.append((addr, m.group(2).strip()))
    index = {addr: i for i, (addr, _) in enumerate(insns)}
    found = []
    for i, (addr, text) in enumerate(insns):
        if opcode(text) not in ("BRA", "JMP"):
            continue
        t = TARGET.search(text)
        if not t:
            continue
        dest = labels.get(t.group(1)) if t.group(1) else int(t.group(2), 16)
        if dest is None or dest > addr or dest not in index:
            continue
        lo, hi = index[dest], i
        ops = [opcode(x) for _, x in insns[lo:hi + 1]]
        if any(o in MMA for o in ops):
            shapes = sorted({x.split()[0] if not x.startswith("@") else x.split()[1]
                             for _, x in insns[lo:hi + 1] if opcode(x) in MMA})
            found.append((lo, hi, ops, shapes, skipping(insns, index, labels, lo, hi)))
    inner = [f for f in found
             if not any(g is not f and f[0] <= g[0] and g[1] <= f[1] for g in found)]
    return inner


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass", nargs="?", default="-", help="cuobjdump -sass output ('-': stdin)")
    ap.add_argument("--match", action="append", default=[],
                    help="a string the kernel's (mangled) name must contain; repeatable")
    ap.add_argument("--top", type=int, default=12, help="opcodes listed per loop")
    a = ap.parse_args()
    src = sys.stdin if a.sass == "-" else open(a.sass, encoding="utf-8", errors="replace")
    shown = 0
    for name, body in kernels(src):
        if not all(m in name for m in a.match):
            continue
        shown += 1
        print(f"kernel {name[:100]}{'...' if len(name) > 100 else ''}")
        for lo, hi, ops, shapes, hot in loops(body):
            count = collections.Counter(ops)
            mma = sum(count[o] for o in MMA)
            print(f"  loop of {len(ops)} instructions, {mma} mma ({' '.join(shapes)}): "
                  f"{len(ops) / mma:.1f} per mma, {hot / mma:.1f} skipping; "
                  + ", ".join(f"{o} {n}" for o, n in count.most_common(a.top)))
    if shown == 0:
        print("no kernel matched", a.match, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
