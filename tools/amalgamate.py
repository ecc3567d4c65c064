#!/usr/bin/env python3
"""Generate single_include/loom/loom.hpp from include/loom/loom.hpp.

Every loom header reached from the entry header is inlined once, in first-include order;
`#include <loom/...>` and `#include "..."` (when it names a file under include/loom/) are
both followed. `#pragma once` lines are dropped and one is emitted at the top. System and
third-party includes stay as they are. The output depends only on the input files (no
dates, no absolute paths), so CI can regenerate it and compare.

A loom header first reached inside an `#if` block is inlined there, and later includes of
it are dropped: keep conditional includes (backend gate headers) after the unconditional
ones in loom.hpp.

    python3 tools/amalgamate.py           # rewrite single_include/loom/loom.hpp
    python3 tools/amalgamate.py --check   # exit 1 if the file on disk is stale
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE_DIR = ROOT / "include"
ENTRY = "loom/loom.hpp"
OUTPUT = ROOT / "single_include" / "loom" / "loom.hpp"
REGENERATE = "python3 tools/amalgamate.py"

BANNER = f"""\
// loom: header-only C++20 library for deep-learning training at scale.
// SPDX-License-Identifier: Apache-2.0
//
// GENERATED FILE, do not edit. It is include/{ENTRY} with every loom header inlined.
// Regenerate with: {REGENERATE}
"""

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\b")


def resolve(name, quote, including_file):
    """Path of the loom header an include names, or None for an external header."""
    candidates = []
    if quote == '"':
        candidates.append(including_file.parent / name)
    candidates.append(INCLUDE_DIR / name)
    loom_dir = (INCLUDE_DIR / "loom").resolve()
    for candidate in candidates:
        candidate = candidate.resolve()
        if candidate.is_file() and loom_dir in candidate.parents:
            return candidate
    if name.startswith("loom/"):
        sys.exit(f"amalgamate: {including_file.relative_to(ROOT)} includes '{name}', "
                 f"which is not a file under include/loom/")
    return None


def inline(path, seen, out):
    seen.add(path)
    relative = path.relative_to(INCLUDE_DIR).as_posix()
    out.append(f"// ---- begin {relative} ----\n")
    for line in path.read_text(encoding="utf-8").splitlines():
        if PRAGMA_ONCE_RE.match(line):
            continue
        match = INCLUDE_RE.match(line)
        target = match and resolve(match.group(2), match.group(1), path)
        if target is None:
            out.append(line + "\n")
        elif target not in seen:
            inline(target, seen, out)
    out.append(f"// ---- end {relative} ----\n")


def amalgamate():
    out = [BANNER, "#pragma once\n"]
    inline((INCLUDE_DIR / ENTRY).resolve(), set(), out)
    return "".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the generated file is stale")
    args = parser.parse_args()

    text = amalgamate()
    shown = OUTPUT.relative_to(ROOT).as_posix()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.is_file() else None
        if current != text:
            state = "missing" if current is None else "stale (include/ has changed)"
            print(f"amalgamate: {shown} is {state}; regenerate it with:\n"
                  f"    {REGENERATE}\nand commit the result.", file=sys.stderr)
            return 1
        print(f"amalgamate: {shown} is up to date")
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUTPUT, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"amalgamate: wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
