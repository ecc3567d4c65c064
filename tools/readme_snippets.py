#!/usr/bin/env python3
"""Every C++ snippet in README.md must be code that CI compiles: each ```cpp block has to
appear, line for line (indentation aside), in one of the sources that the build compiles
(examples/, tests/; benchmarks are not built in CI). A snippet that drifts from the code fails this check.

    python3 tools/readme_snippets.py            # exit 1, naming the snippet, when one is not found
    python3 tools/readme_snippets.py --readme OTHER.md --sources DIR [DIR...]
"""
import argparse
import pathlib
import re
import sys


def snippets(text):
    """(line number, lines) of every ```cpp block."""
    out = []
    for m in re.finditer(r"^```cpp\n(.*?)^```", text, flags=re.M | re.S):
        line = text.count("\n", 0, m.start()) + 1
        out.append((line, m.group(1).splitlines()))
    return out


def normalized(lines):
    return [l.strip() for l in lines if l.strip()]


def contains(haystack, needle):
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", default=str(root / "README.md"))
    parser.add_argument("--sources", nargs="+", default=[str(root / d) for d in ("examples", "tests")])
    args = parser.parse_args()

    sources = {}
    for folder in args.sources:
        for path in sorted(pathlib.Path(folder).rglob("*")):
            if path.suffix in (".cpp", ".hpp", ".cu"):
                sources[path] = normalized(path.read_text(encoding="utf-8", errors="replace").splitlines())
    text = pathlib.Path(args.readme).read_text(encoding="utf-8")
    missing = 0
    found = snippets(text)
    for line, lines in found:
        want = normalized(lines)
        where = next((p for p, have in sources.items() if contains(have, want)), None)
        if where is None:
            missing += 1
            print(f"{args.readme}:{line}: this C++ snippet is in no compiled source; copy it from one "
                  f"(examples/, tests/) or put it in one:\n    " + "\n    ".join(lines[:3]) + "\n    ...")
        else:
            print(f"{args.readme}:{line}: found in {where.relative_to(root) if where.is_relative_to(root) else where}")
    if not found:
        print(f"{args.readme}: no C++ snippets")
    if missing:
        print(f"readme_snippets: {missing} of {len(found)} snippets are not compiled code")
        return 1
    print(f"readme_snippets: all {len(found)} snippets are compiled code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
