#!/usr/bin/env python3
"""Tests of tools/folder_deps.py on small header trees written into a temporary folder:
it prints each folder's includes with counts, passes a tree without cycles, and fails on a
cycle, naming the folders and the include lines that make it."""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "folder_deps.py"


def write_tree(root, files):
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def run(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True, check=False)


class FolderDeps(unittest.TestCase):
    def setUp(self):
        self.temporary = tempfile.TemporaryDirectory()
        self.root = Path(self.temporary.name) / "loom"

    def tearDown(self):
        self.temporary.cleanup()

    def test_a_chain_passes_and_counts_include_lines(self):
        write_tree(self.root, {
            "core/error.hpp": "#pragma once\n#include <vector>\n",
            "core/shape.hpp": "#include <loom/core/error.hpp>\n",  # inside a folder: no edge
            "graph/graph.hpp": "#include <loom/core/error.hpp>\n#include <loom/core/shape.hpp>\n",
            "train/cuda/trainer.hpp": "#include <loom/graph/graph.hpp>\n"
                                      '#include "../../core/error.hpp"\n',
            "loom.hpp": "#include <loom/train/cuda/trainer.hpp>\n",
        })
        result = run(self.root)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("core -> (nothing)", result.stdout)
        self.assertIn("graph -> core (2)", result.stdout)
        # a sub-folder belongs to its top-level folder; a quoted relative include counts
        self.assertIn("train -> core (1), graph (1)", result.stdout)
        self.assertIn(". -> train (1)", result.stdout)
        self.assertIn("no cycles", result.stdout)
        self.assertIn("0: core\n  1: graph\n  2: train\n  3: .\n", result.stdout)

    def test_a_cycle_fails_naming_the_folders_and_the_files(self):
        write_tree(self.root, {
            "core/error.hpp": "#pragma once\n",
            "graph/autograd.hpp": "#include <loom/ops/add.hpp>\n",
            "graph/builder.hpp": "#include <loom/core/error.hpp>\n",
            "ops/add.hpp": "#include <loom/core/error.hpp>\n\n#include <loom/graph/builder.hpp>\n",
        })
        result = run(self.root)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("cycle: graph -> ops -> graph", result.stderr)
        self.assertIn("graph -> ops: graph/autograd.hpp:1 includes ops/add.hpp", result.stderr)
        self.assertIn("ops -> graph: ops/add.hpp:3 includes graph/builder.hpp", result.stderr)
        self.assertIn("1 cycle(s)", result.stderr)

    def test_a_longer_cycle_is_reported_through_every_folder(self):
        write_tree(self.root, {
            "partition/explain.hpp": "#include <loom/runtime/program.hpp>\n",
            "runtime/program.hpp": "#include <loom/train/trainer.hpp>\n",
            "train/trainer.hpp": "#include <loom/partition/explain.hpp>\n",
            "search/cost.hpp": "#include <loom/partition/explain.hpp>\n",  # outside the knot
        })
        result = run(self.root)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("cycle: partition -> runtime -> train -> partition", result.stderr)
        self.assertIn("(folders in the knot: partition, runtime, train)", result.stderr)
        self.assertNotIn("search ->", result.stderr)

    def test_including_the_entry_header_from_a_folder_is_a_cycle(self):
        write_tree(self.root, {
            "loom.hpp": "#include <loom/models/gpt.hpp>\n",
            "models/gpt.hpp": "#include <loom/loom.hpp>\n",
        })
        result = run(self.root)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("cycle: . -> models -> .", result.stderr)

    def test_a_missing_root_is_a_clear_error(self):
        result = run(self.root / "absent")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("is not a directory", result.stderr)


if __name__ == "__main__":
    unittest.main()
