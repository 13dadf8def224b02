import json
import os
import unittest

import support  # noqa: F401  (sets sys.path)
from keyshard import bucket, buckets_of, xxh64

VECTORS = os.path.join(support.REPO, "api", "keyshard", "v1", "hash_vectors.json")


class HashTest(unittest.TestCase):
    def test_vectors(self):
        with open(VECTORS) as f:
            vs = json.load(f)["vectors"]
        self.assertGreater(len(vs), 600)
        for v in vs:
            self.assertEqual(bucket(v["key"], v["buckets"], v["mode"]), v["bucket"], v)
            self.assertEqual(bucket(v["key"].encode("utf-8"), v["buckets"], v["mode"]), v["bucket"], v)
        for mode in ("xxh64", "synapse-sha256"):
            for n in {v["buckets"] for v in vs}:
                sel = [v for v in vs if v["mode"] == mode and v["buckets"] == n]
                self.assertEqual(buckets_of([v["key"] for v in sel], n, mode), [v["bucket"] for v in sel])

    def test_xxh64_known(self):
        self.assertEqual(xxh64(b""), 0xEF46DB3751D8E999)
        self.assertEqual(xxh64(b"a"), 0xD24EC4F1A98C6E5B)

    def test_bad_input(self):
        with self.assertRaisesRegex(TypeError, "key"):
            bucket(12, 16)
        with self.assertRaisesRegex(TypeError, "buckets"):
            bucket("k", "16")
        with self.assertRaisesRegex(ValueError, "buckets"):
            bucket("k", 0)
        with self.assertRaisesRegex(ValueError, "buckets"):
            bucket("k", 65537)
        with self.assertRaisesRegex(ValueError, "hash"):
            bucket("k", 16, "md5")
        with self.assertRaisesRegex(TypeError, "keys"):
            buckets_of([1], 16)


if __name__ == "__main__":
    unittest.main()
