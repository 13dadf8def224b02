import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { bucket, hasher, xxh64 } from '../index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const vectors = JSON.parse(fs.readFileSync(path.join(here, '../../../api/keyshard/v1/hash_vectors.json'), 'utf8')).vectors;

test('bucket() passes every shared hash vector (both modes), for string and Uint8Array keys', () => {
  assert.ok(vectors.length >= 600);
  const enc = new TextEncoder();
  for (const v of vectors) {
    assert.equal(bucket(v.key, v.buckets, v.mode), v.bucket, `${v.mode} ${JSON.stringify(v.key)} B=${v.buckets}`);
    assert.equal(bucket(enc.encode(v.key), v.buckets, v.mode), v.bucket, `bytes: ${v.mode} ${JSON.stringify(v.key)}`);
    assert.equal(hasher(v.buckets, v.mode)(v.key), v.bucket);
  }
});

test('xxh64 matches known values', () => {
  assert.equal(xxh64(''), 0xef46db3751d8e999n);
  assert.equal(xxh64('abc'), 0x44bc2cf5ad770999n);
  // a long key (several 32-byte stripes) and a non-ASCII one after an ASCII one (buffer reuse)
  const long = 'x'.repeat(1000);
  assert.equal(xxh64(long), xxh64(new TextEncoder().encode(long)));
  assert.equal(xxh64('é!'), xxh64(new TextEncoder().encode('é!')));
});

test('bucket() refuses bad input with errors naming the argument', () => {
  assert.throws(() => bucket(42, 8), { name: 'TypeError', message: /key must be a string or a Uint8Array/ });
  assert.throws(() => bucket(null, 8), TypeError);
  assert.throws(() => bucket('k', 0), { name: 'RangeError', message: /buckets must be an integer in 1\.\.65536/ });
  assert.throws(() => bucket('k', 1.5), RangeError);
  assert.throws(() => bucket('k', 65537), RangeError);
  assert.throws(() => bucket('k', '8'), RangeError);
  assert.throws(() => bucket('k', 8, 'md5'), { name: 'RangeError', message: /hash must be one of xxh64, synapse-sha256/ });
});
