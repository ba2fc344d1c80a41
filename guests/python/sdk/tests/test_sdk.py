"""Unit tests of the Python SDK's pure helpers, natively (no componentize-py):

    python3 -m unittest discover -s guests/python/sdk/tests

The component bindings the SDK imports (`wit_world`, `componentize_py_types`) exist only
inside componentize-py's build; they are stubbed here. The quantity cases are the Rust
SDK's and the host's (`guests/sdk/src/quantity.rs`, `host/rules/src/quantity.rs`): the
three read a size the same way.
"""

import os
import sys
import tempfile
import types
import unittest


def _import_sdk():
    for name in ["wit_world", "wit_world.exports", "wit_world.imports",
                 "wit_world.imports.filesystem", "wit_world.imports.log",
                 "wit_world.imports.types", "componentize_py_types"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["componentize_py_types"].Err = Exception
    generated = sys.modules["wit_world.imports.types"]
    generated.__getattr__ = lambda name: type(name, (), {})
    imports = sys.modules["wit_world.imports"]
    imports.filesystem = sys.modules["wit_world.imports.filesystem"]
    imports.log = sys.modules["wit_world.imports.log"]
    imports.types = generated
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import wasm_provisioner_sdk
    wasm_provisioner_sdk.info = lambda *a, **k: None
    return wasm_provisioner_sdk


sdk = _import_sdk()


class Quantities(unittest.TestCase):
    def test_as_kubernetes_reads_them(self):
        cases = {
            "0": 0, "1": 1, "+1": 1, "007": 7, "18446744073709551615": 2**64 - 1,
            "1Ki": 1024, "10Gi": 10 << 30, "15Ei": 15 << 60, "1.5Gi": 1_610_612_736,
            "1.1Gi": 1_181_116_007, "1k": 1000, "500M": 500_000_000, "2.5G": 2_500_000_000,
            "18E": 18 * 10**18, "100m": 1, "1000m": 1, "1001m": 2, "1u": 1, "1n": 1,
            "0m": 0, "1.1": 2, "0.5": 1, ".5": 1, "2.": 2, "1e3": 1000, "1E3": 1000,
            "1e+3": 1000, "1.5e3": 1500, "12e-1": 2, "1e-3": 1, "1e0": 1, "1e-100": 1,
            "0e100": 0, "1e18": 10**18, "-0": 0, "0.000": 0, "0Gi": 0,
            "0.000000000000000000000000000000000000000000001Ei": 1,
            "1" + "0" * 21 + "m": 10**18, "0." + "0" * 40 + "1Ei": 1,
        }
        for text, size in cases.items():
            self.assertEqual(sdk.parse_quantity(text), size, text)

    def test_refusals_name_the_text(self):
        for text in ["-1", "-1Gi", "-0.5", "-1e3", "18446744073709551616", "16Ei", "19E",
                     "1e20", "1e999999", "99999999999999999999999999999999999999Ei", "",
                     " ", " 1Gi", "1Gi ", "Gi", "1 Gi", "1KB", "1K", "1gi", "1GiB", "1.2.3",
                     ".", "+", "-", "1e", "1e1.5", "1ee3", "e3", "1i", "0x10", "1,5Gi",
                     "1Gi1", "--1", "1e1234567"]:
            with self.assertRaises(ValueError, msg=text) as caught:
                sdk.parse_quantity(text)
            self.assertIn(repr(text), str(caught.exception))

    def test_params_quantity(self):
        params = sdk.Params([("maxSize", "1.5Gi"), ("bad", "10GB"), ("empty", "")])
        self.assertEqual(params.quantity("maxSize", None, "h"), 3 << 29)
        self.assertEqual(params.quantity("empty", "1Gi", "h"), 1 << 30)
        with self.assertRaisesRegex(sdk.ParamError, "`bad`.*10GB"):
            params.quantity("bad", None, "h")
        with self.assertRaisesRegex(sdk.ParamError, "`none` is required: such as 10Gi"):
            params.quantity("none", None, "such as 10Gi")

    def test_format_bytes(self):
        self.assertEqual(sdk.format_bytes(3 << 29), "1536Mi")
        self.assertEqual(sdk.format_bytes(1000), "1000")


class BoundedDeletes(unittest.TestCase):
    def tree(self, root):
        volume = os.path.join(root, "pvc-1")
        deep = os.path.join(volume, *["d"] * 50)
        os.makedirs(deep)
        for i in range(5):
            with open(os.path.join(deep, f"f{i}"), "w") as f:
                f.write("x")
        outside = os.path.join(root, "outside")
        os.makedirs(outside)
        with open(os.path.join(outside, "keep"), "w") as f:
            f.write("x")
        os.symlink(outside, os.path.join(volume, "link"))
        return volume, outside

    def test_chunks_until_gone_without_following_links(self):
        with tempfile.TemporaryDirectory() as root:
            volume, outside = self.tree(root)
            calls, total = 0, 0
            while True:
                removed, done = sdk.remove_tree(volume, 7)
                self.assertLessEqual(removed, 7)
                total += removed
                calls += 1
                if done:
                    break
                self.assertLess(calls, 100)
            self.assertGreater(calls, 5)
            self.assertEqual(total, 50 + 5 + 1 + 1)  # 50 dirs + d's files + link + volume
            self.assertFalse(os.path.lexists(volume))
            self.assertTrue(os.path.exists(os.path.join(outside, "keep")))
            self.assertEqual(sdk.remove_tree(volume, 7), (0, True))

    def test_refuses_a_link_as_the_volume(self):
        with tempfile.TemporaryDirectory() as root:
            os.symlink(root, os.path.join(root, "pvc-2"))
            with self.assertRaises(sdk.Failed):
                sdk.remove_tree(os.path.join(root, "pvc-2"), 10)

    def test_delete_budget(self):
        self.assertEqual(sdk.delete_budget(sdk.Params([])), sdk.DEFAULT_DELETE_CHUNK)
        self.assertEqual(sdk.delete_budget(sdk.Params([("deleteChunkEntries", "5")])), 5)
        for bad in ["0", "x", "20000000", "-1"]:
            with self.assertRaisesRegex(sdk.ParamError, "deleteChunkEntries"):
                sdk.delete_budget(sdk.Params([("deleteChunkEntries", bad)]))


if __name__ == "__main__":
    unittest.main()
