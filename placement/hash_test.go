package placement_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/keyshard/keyshard/placement"
)

var update = flag.Bool("update", false, "rewrite the hash test vectors")

const vectorsPath = "../api/keyshard/v1/hash_vectors.json"

type hashVector struct {
	Mode    placement.HashMode `json:"mode"`
	Key     string             `json:"key"`
	Buckets int                `json:"buckets"`
	Bucket  int                `json:"bucket"`
}

type vectorFile struct {
	Comment string       `json:"comment"`
	Vectors []hashVector `json:"vectors"`
}

func vectorKeys() []string {
	keys := []string{
		"", "a", "ab", "abc", "abcd", "abcdefg", "abcdefgh", "abcdefghi",
		"!room:example.org", "@alice:example.org", "matrix.org", "user-42",
		"tenant-7", "token:phc_abc", "anonymous", "ключ", "🔑 emoji key",
		"0123456789abcdef", "0123456789abcdef0123456789abcdef",
		"0123456789abcdef0123456789abcdef0",
		"a somewhat longer key that spans more than one 32-byte stripe of the hash",
	}
	for i := range 8 {
		keys = append(keys, fmt.Sprintf("key-%d", i*7919))
	}
	return keys
}

func vectorBuckets() []int { return []int{1, 2, 3, 7, 32, 1000, 1024, 4096, 16384, 65535, 65536} }

func TestHashVectors(t *testing.T) {
	var want vectorFile
	if *update {
		want.Comment = "Keyshard key-to-bucket test vectors. key is the UTF-8 key; see hashing in README.md and reference/bucket.py."
		for _, mode := range []placement.HashMode{placement.HashXXH64, placement.HashSynapse} {
			for _, b := range vectorBuckets() {
				h, err := placement.NewHasher(mode, b)
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range vectorKeys() {
					want.Vectors = append(want.Vectors, hashVector{mode, k, b, h.BucketString(k)})
				}
			}
		}
		out, err := json.MarshalIndent(want, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsPath, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatalf("read vectors (regenerate with go test ./placement -run TestHashVectors -update): %v", err)
	}
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Vectors) < 400 {
		t.Fatalf("only %d vectors", len(want.Vectors))
	}
	for _, v := range want.Vectors {
		h, err := placement.NewHasher(v.Mode, v.Buckets)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Bucket([]byte(v.Key)); got != v.Bucket {
			t.Errorf("%s Bucket(%q) with %d buckets = %d, want %d", v.Mode, v.Key, v.Buckets, got, v.Bucket)
		}
		if got := h.BucketString(v.Key); got != v.Bucket {
			t.Errorf("%s BucketString(%q) with %d buckets = %d, want %d", v.Mode, v.Key, v.Buckets, got, v.Bucket)
		}
	}
}

// TestHashVectorsPython checks the vectors against the plain-Python
// reference implementation, an independent implementation of both modes.
func TestHashVectorsPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed; .ci/run installs it")
	}
	cmd := exec.Command(py, filepath.FromSlash("../api/keyshard/v1/reference/bucket.py"), vectorsPath)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reference check failed: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(" 0 mismatches")) {
		t.Fatalf("unexpected output: %s", out)
	}
}

// TestSynapseModeMatchesBigInt compares the synapse bucket against the
// formula computed with math/big.
func TestSynapseModeMatchesBigInt(t *testing.T) {
	for _, b := range []int{1, 3, 10, 4096, 65536} {
		h, _ := placement.NewHasher(placement.HashSynapse, b)
		for i := range 500 {
			key := fmt.Sprintf("!room%d:example.org", i)
			sum := sha256.Sum256([]byte(key))
			le := make([]byte, 32)
			for j := range 32 {
				le[31-j] = sum[j] // big.Int wants big-endian
			}
			want := new(big.Int).Mod(new(big.Int).SetBytes(le), big.NewInt(int64(b))).Int64()
			if got := h.BucketString(key); int64(got) != want {
				t.Fatalf("buckets=%d key=%q: got %d want %d", b, key, got, want)
			}
		}
	}
}

func TestSynapseAssignmentKeepsMapping(t *testing.T) {
	instances := []string{"event_persister1", "event_persister2", "event_persister3"}
	a, err := placement.SynapseAssignment(3072, instances)
	if err != nil {
		t.Fatal(err)
	}
	table, err := placement.NewTable(placement.HashSynapse, a)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		key := fmt.Sprintf("!r%d:example.org", i)
		sum := sha256.Sum256([]byte(key))
		le := make([]byte, 32)
		for j := range 32 {
			le[31-j] = sum[j]
		}
		idx := new(big.Int).Mod(new(big.Int).SetBytes(le), big.NewInt(3)).Int64()
		got, ok := table.OwnerString(key)
		if !ok || got != instances[idx] {
			t.Fatalf("key %q: Keyshard owner %q, Synapse instance %q", key, got, instances[idx])
		}
	}
}

func TestSynapseAssignmentErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		buckets   int
		instances []string
		want      string
	}{
		{"not a multiple", 4096, []string{"a", "b", "c"}, "use 4095 or 4098 buckets"},
		{"no instances", 4096, nil, "at least one instance"},
		{"duplicate", 4096, []string{"a", "a"}, `"a" appears twice`},
		{"empty name", 4096, []string{"a", ""}, "instance 1 has an empty name"},
		{"too many buckets", 70000, []string{"a"}, "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := placement.SynapseAssignment(tc.buckets, tc.instances)
			if !errors.Is(err, placement.ErrInvalid) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestNewHasherErrors(t *testing.T) {
	for _, tc := range []struct {
		mode    placement.HashMode
		buckets int
		want    string
	}{
		{"md5", 16, `hash mode "md5" is unknown`},
		{placement.HashXXH64, 0, "bucket count 0 is out of range"},
		{placement.HashXXH64, 65537, "bucket count 65537 is out of range"},
		{placement.HashSynapse, -1, "out of range"},
	} {
		_, err := placement.NewHasher(tc.mode, tc.buckets)
		if !errors.Is(err, placement.ErrInvalid) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("NewHasher(%q, %d) err = %v, want ErrInvalid mentioning %q", tc.mode, tc.buckets, err, tc.want)
		}
	}
	h, err := placement.NewHasher("", 8)
	if err != nil || h.Mode() != placement.HashXXH64 || h.Buckets() != 8 {
		t.Fatalf("empty mode: %v %v", h, err)
	}
}

func TestBucketUniformity(t *testing.T) {
	// A chi-squared check that the reduction spreads keys evenly: with
	// 64 buckets and 64,000 keys the statistic has 63 degrees of freedom;
	// 110 is beyond its 99.9th percentile (about 103).
	for _, mode := range []placement.HashMode{placement.HashXXH64, placement.HashSynapse} {
		h, _ := placement.NewHasher(mode, 64)
		counts := make([]float64, 64)
		for i := range 64000 {
			counts[h.BucketString(fmt.Sprintf("user:%d", i))]++
		}
		chi := 0.0
		for _, c := range counts {
			chi += (c - 1000) * (c - 1000) / 1000
		}
		if chi > 110 {
			t.Errorf("%s: chi-squared %.1f over 63 degrees of freedom", mode, chi)
		}
	}
}

func TestBucketDoesNotAllocate(t *testing.T) {
	h, _ := placement.NewHasher(placement.HashXXH64, 4096)
	key := []byte("0123456789abcdef")
	skey := "0123456789abcdef"
	if n := testing.AllocsPerRun(1000, func() { _ = h.Bucket(key); _ = h.BucketString(skey) }); n != 0 {
		t.Errorf("xxh64: %v allocations per call", n)
	}
	s, _ := placement.NewHasher(placement.HashSynapse, 4096)
	if n := testing.AllocsPerRun(1000, func() { _ = s.Bucket(key) }); n != 0 {
		t.Errorf("synapse: %v allocations per call", n)
	}
}

func FuzzBucket(f *testing.F) {
	f.Add([]byte("user-42"), uint16(4095), false)
	f.Add([]byte(""), uint16(0), true)
	f.Add([]byte("!room:example.org"), uint16(65535), true)
	f.Fuzz(func(t *testing.T, key []byte, b uint16, synapse bool) {
		mode := placement.HashXXH64
		if synapse {
			mode = placement.HashSynapse
		}
		h, err := placement.NewHasher(mode, int(b)+1)
		if err != nil {
			t.Fatal(err)
		}
		got := h.Bucket(key)
		if got < 0 || got > int(b) {
			t.Fatalf("bucket %d out of [0,%d]", got, b)
		}
		if s := h.BucketString(string(key)); s != got {
			t.Fatalf("Bucket %d != BucketString %d", got, s)
		}
	})
}
