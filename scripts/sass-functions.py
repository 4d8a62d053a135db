#!/usr/bin/env python3
"""Which kernels two binaries compiled differently, function by function.

Reads the SASS of two binaries (a stripped CLI or test binary will do: the device code keeps its
function names) and compares each kernel's instructions after removing what differs between two
builds of the same code: instruction addresses and encodings, the offsets of kernel parameters
in constant bank 0 (they move when a parameter struct grows) and branch targets. Prints each
function that differs or exists in one binary only, then the counts; exits 1 if any differs.

scripts/same-binaries.sh compares two build folders object by object and exactly; this compares
two packed binaries, and names the kernels a change reached (e.g. "the 52 combine kernels differ,
the other 234 functions are identical").

    scripts/sass.sh FILE > /dev/null    # once: fetches cuobjdump where the toolkit has none
    scripts/sass-functions.py A B [REGEX]   # REGEX: only functions whose name matches
"""
import collections
import hashlib
import os
import re
import shutil
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FUNCTION = re.compile(r"\s+Function : (\S+)")
_INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);")
_PARAM = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")
_ADDRESS = re.compile(r"0x[0-9a-f]+")
# An anonymous namespace's name carries two hashes of its file:
# _GLOBAL__N__1bfd35f0_9_stages_cu_1bb7bae5.
_ANON = re.compile(r"(_GLOBAL__N__)[0-9a-f]{8}(_\d+_\w+?_cu)_[0-9a-f]{8}")


def cuobjdump():
    for path in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                 os.path.join(_ROOT, ".sass-tools/nvidia/cu13/bin/cuobjdump")):
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("sass-functions.py: no cuobjdump (set CUOBJDUMP, or run scripts/sass.sh once)")


def functions(binary):
    """{name: digest of its normalized instructions} and {name: instruction count}."""
    text = subprocess.run([cuobjdump(), "-sass", binary], capture_output=True, text=True,
                          check=True).stdout
    bodies = collections.defaultdict(list)
    name = None
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            name = _ANON.sub(r"\1\2", m.group(1))
            continue
        m = _INSTRUCTION.match(line) if name else None
        if m:
            ins = _PARAM.sub("c[0x0][P]", m.group(1))
            if "BRA" in ins or "CALL" in ins or "BSSY" in ins:
                ins = _ADDRESS.sub("T", ins)
            bodies[name].append(ins)
    digests = {k: hashlib.sha1("\n".join(v).encode()).hexdigest() for k, v in bodies.items()}
    return digests, {k: len(v) for k, v in bodies.items()}


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    match = re.compile(argv[3]) if len(argv) == 4 else None
    (a, na), (b, nb) = functions(argv[1]), functions(argv[2])
    same = differ = 0
    for name in sorted(set(a) | set(b)):
        if match and not match.search(name):
            continue
        if name not in b:
            print(f"only in A  {name}  ({na[name]} instructions)")
            differ += 1
        elif name not in a:
            print(f"only in B  {name}  ({nb[name]} instructions)")
            differ += 1
        elif a[name] != b[name]:
            print(f"differs    {name}  ({na[name]} -> {nb[name]} instructions)")
            differ += 1
        else:
            same += 1
    print(f"{same} functions identical, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
