package store

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/keyshard/keyshard/hotkey"
)

var (
	samplePool = HotPool{Name: "ingest", Threshold: 1000, LowThreshold: 500, Cooldown: 30 * time.Second, ReportThreshold: 15.625, ReportMaxAge: 30 * time.Second, MaxKeys: 1024}
	sampleHotR = hotkey.Report{Producer: "p-1", At: testTime, Keys: []hotkey.KeyRate{{Key: "user:1", Rate: 62.5}, {Key: "user:42", Rate: 0}, {Key: "ü", Rate: 1e6}}}
	sampleSet  = hotkey.OverflowSet{Version: 3, Entries: []hotkey.OverflowEntry{
		{Key: "a", Rate: 1200, Since: testTime},
		{Key: "b", Rate: 12.5, Since: testTime, BelowSince: testTime.Add(time.Second)},
	}}
)

func TestHotKeyCodecRoundTrip(t *testing.T) {
	opts := cmp.Options{cmpopts.EquateEmpty()}
	t.Run("pool", func(t *testing.T) {
		for _, p := range []HotPool{
			samplePool,
			{Name: "x", Threshold: 1e-9, LowThreshold: 1e-9, Cooldown: time.Millisecond, ReportThreshold: 1e-9, ReportMaxAge: MinReportMaxAge, MaxKeys: 1},
			{Name: strings.Repeat("z", 128), Threshold: 1e300, LowThreshold: 1e300, Cooldown: MaxHotPoolDuration, ReportThreshold: 1, ReportMaxAge: MaxHotPoolDuration, MaxKeys: MaxOverflowKeys},
		} {
			b, err := EncodeHotPool(p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeHotPool(HotPoolKey(p.Name), b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if diff := cmp.Diff(p, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
		b, _ := EncodeHotPool(samplePool)
		want := `{"name":"ingest","threshold":1000,"low_threshold":500,"cooldown_ms":30000,"report_threshold":15.625,"report_max_age_ms":30000,"max_keys":1024}`
		if string(b) != want {
			t.Errorf("wire form %s\nwant      %s", b, want)
		}
	})
	t.Run("report", func(t *testing.T) {
		long := strings.Repeat("k", MaxHotKeyLen)
		full := hotkey.Report{Producer: "p", At: testTime.In(time.FixedZone("x", 3600))}
		for i := range MaxReportKeys {
			full.Keys = append(full.Keys, hotkey.KeyRate{Key: long[:MaxHotKeyLen-4] + string(rune('a'+i/676)) + string(rune('a'+i/26%26)) + string(rune('a'+i%26)) + "!", Rate: float64(i)})
		}
		for _, r := range []hotkey.Report{sampleHotR, {Producer: "empty", At: testTime}, full} {
			b, err := EncodeHotReport(r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeHotReport(HotReportKey("pool", r.Producer), b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if diff := cmp.Diff(r, got, opts); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
		b, _ := EncodeHotReport(hotkey.Report{Producer: "p", At: testTime, Keys: []hotkey.KeyRate{{Key: "a<b", Rate: 1.5}}})
		if want := `{"producer":"p","at":"2026-03-04T05:06:07.89Z","keys":[{"key":"a\u003cb","rate":1.5}]}`; string(b) != want {
			t.Errorf("wire form %s\nwant      %s", b, want)
		}
		b, _ = EncodeHotReport(hotkey.Report{Producer: "p", At: testTime})
		if want := `{"producer":"p","at":"2026-03-04T05:06:07.89Z","keys":[]}`; string(b) != want {
			t.Errorf("empty report %s, want %s", b, want)
		}
	})
	t.Run("overflow", func(t *testing.T) {
		for _, s := range []hotkey.OverflowSet{sampleSet, {}, {Version: 9}} {
			b, err := EncodeOverflow(s)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeOverflow(OverflowKey("pool"), b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if diff := cmp.Diff(s, got, opts); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
		b, _ := EncodeOverflow(sampleSet)
		want := `{"version":3,"entries":[{"key":"a","rate":1200,"since":"2026-03-04T05:06:07.89Z"},{"key":"b","rate":12.5,"since":"2026-03-04T05:06:07.89Z","below_since":"2026-03-04T05:06:08.89Z"}]}`
		if string(b) != want {
			t.Errorf("wire form %s\nwant      %s", b, want)
		}
	})
}

func TestHotKeyEncodeRejectsInvalid(t *testing.T) {
	pool := func(f func(*HotPool)) func() error {
		return func() error { p := samplePool; f(&p); _, err := EncodeHotPool(p); return err }
	}
	report := func(f func(*hotkey.Report)) func() error {
		return func() error {
			r := sampleHotR
			r.Keys = append([]hotkey.KeyRate(nil), r.Keys...)
			f(&r)
			_, err := EncodeHotReport(r)
			return err
		}
	}
	set := func(f func(*hotkey.OverflowSet)) func() error {
		return func() error {
			s := sampleSet
			s.Entries = append([]hotkey.OverflowEntry(nil), s.Entries...)
			f(&s)
			_, err := EncodeOverflow(s)
			return err
		}
	}
	tooMany := func(n int) []hotkey.KeyRate {
		out := make([]hotkey.KeyRate, n)
		for i := range out {
			out[i] = hotkey.KeyRate{Key: strings.Repeat("k", 1+i/256) + string(rune('a'+i%256)), Rate: 1}
		}
		SortKeyRates(out)
		return out
	}
	for _, tc := range []struct {
		name, field string
		enc         func() error
	}{
		{"pool name", `"name"`, pool(func(p *HotPool) { p.Name = "a/b" })},
		{"pool empty name", `"name"`, pool(func(p *HotPool) { p.Name = "" })},
		{"pool threshold 0", `"threshold"`, pool(func(p *HotPool) { p.Threshold = 0 })},
		{"pool threshold NaN", `"threshold"`, pool(func(p *HotPool) { p.Threshold = math.NaN() })},
		{"pool threshold Inf", `"threshold"`, pool(func(p *HotPool) { p.Threshold = math.Inf(1) })},
		{"pool low 0", `"low_threshold"`, pool(func(p *HotPool) { p.LowThreshold = 0 })},
		{"pool low above", `"low_threshold"`, pool(func(p *HotPool) { p.LowThreshold = 1001 })},
		{"pool cooldown 0", `"cooldown_ms"`, pool(func(p *HotPool) { p.Cooldown = 0 })},
		{"pool cooldown fraction", `"cooldown_ms"`, pool(func(p *HotPool) { p.Cooldown = 1500 * time.Microsecond })},
		{"pool cooldown long", `"cooldown_ms"`, pool(func(p *HotPool) { p.Cooldown = 25 * time.Hour })},
		{"pool report threshold 0", `"report_threshold"`, pool(func(p *HotPool) { p.ReportThreshold = 0 })},
		{"pool report threshold above", `"report_threshold"`, pool(func(p *HotPool) { p.ReportThreshold = 2000 })},
		{"pool max age short", `"report_max_age_ms"`, pool(func(p *HotPool) { p.ReportMaxAge = time.Second })},
		{"pool max age long", `"report_max_age_ms"`, pool(func(p *HotPool) { p.ReportMaxAge = 25 * time.Hour })},
		{"pool max keys 0", `"max_keys"`, pool(func(p *HotPool) { p.MaxKeys = 0 })},
		{"pool max keys big", `"max_keys"`, pool(func(p *HotPool) { p.MaxKeys = MaxOverflowKeys + 1 })},
		{"report producer", `"producer"`, report(func(r *hotkey.Report) { r.Producer = "p 1" })},
		{"report at", `"at"`, report(func(r *hotkey.Report) { r.At = time.Time{} })},
		{"report too many", `"keys"`, report(func(r *hotkey.Report) { r.Keys = tooMany(MaxReportKeys + 1) })},
		{"report empty key", `"keys"`, report(func(r *hotkey.Report) { r.Keys[0].Key = "" })},
		{"report long key", `"keys"`, report(func(r *hotkey.Report) { r.Keys = []hotkey.KeyRate{{Key: strings.Repeat("k", MaxHotKeyLen+1), Rate: 1}} })},
		{"report bad utf8", `"keys"`, report(func(r *hotkey.Report) { r.Keys = []hotkey.KeyRate{{Key: "\xff", Rate: 1}} })},
		{"report negative", `"keys"`, report(func(r *hotkey.Report) { r.Keys[1].Rate = -1 })},
		{"report NaN", `"keys"`, report(func(r *hotkey.Report) { r.Keys[1].Rate = math.NaN() })},
		{"report Inf", `"keys"`, report(func(r *hotkey.Report) { r.Keys[1].Rate = math.Inf(1) })},
		{"report unsorted", `"keys"`, report(func(r *hotkey.Report) { r.Keys[0], r.Keys[1] = r.Keys[1], r.Keys[0] })},
		{"report duplicate", `"keys"`, report(func(r *hotkey.Report) { r.Keys[1].Key = r.Keys[0].Key })},
		{"set version 0", `"version"`, set(func(s *hotkey.OverflowSet) { s.Version = 0 })},
		{"set since", `"entries"`, set(func(s *hotkey.OverflowSet) { s.Entries[0].Since = time.Time{} })},
		{"set below_since year", `"entries"`, set(func(s *hotkey.OverflowSet) { s.Entries[0].BelowSince = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) })},
		{"set rate", `"entries"`, set(func(s *hotkey.OverflowSet) { s.Entries[1].Rate = math.Inf(-1) })},
		{"set duplicate", `"entries"`, set(func(s *hotkey.OverflowSet) { s.Entries[1].Key = "a" })},
		{"set empty key", `"entries"`, set(func(s *hotkey.OverflowSet) { s.Entries[0].Key = "" })},
		{"set too many", `"entries"`, set(func(s *hotkey.OverflowSet) { s.Entries = make([]hotkey.OverflowEntry, MaxOverflowKeys+1) })},
	} {
		err := tc.enc()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "field "+tc.field) {
			t.Errorf("%s: got %v, want ErrInvalid naming field %s", tc.name, err, tc.field)
		}
	}
	if _, err := EncodeHotReport(hotkey.Report{Producer: "p", At: testTime, Keys: tooMany(MaxReportKeys)}); err != nil {
		t.Errorf("a report of exactly %d keys: %v", MaxReportKeys, err)
	}
	if err := PutOverflow("bad name", sampleSet).err; !errors.Is(err, ErrInvalidName) {
		t.Errorf("PutOverflow with a bad pool name: %v, want ErrInvalidName", err)
	}
	if err := PutOverflow("p", hotkey.OverflowSet{Entries: sampleSet.Entries}).err; !errors.Is(err, ErrInvalid) {
		t.Errorf("PutOverflow of an invalid set: %v, want ErrInvalid", err)
	}
}

func decHotPool(k string, b []byte) error   { _, err := DecodeHotPool(k, b); return err }
func decHotReport(k string, b []byte) error { _, err := DecodeHotReport(k, b); return err }
func decOverflow(k string, b []byte) error  { _, err := DecodeOverflow(k, b); return err }

func TestHotKeyDecodeRejectsCorrupt(t *testing.T) {
	pk, rk, ok := HotPoolKey("ingest"), HotReportKey("ingest", "p-1"), OverflowKey("ingest")
	goodPool := must(EncodeHotPool(samplePool))
	goodReport := `{"producer":"p-1","at":"2026-01-02T03:04:05Z","keys":[{"key":"a","rate":1}]}`
	goodSet := `{"version":1,"entries":[{"key":"a","rate":1,"since":"2026-01-02T03:04:05Z"}]}`
	cases := []struct {
		name, key, val, field string
		dec                   func(key string, b []byte) error
	}{
		{"pool unknown field", pk, strings.Replace(goodPool, `"max_keys"`, `"maxkeys"`, 1), "maxkeys", decHotPool},
		{"pool field case", pk, strings.Replace(goodPool, `"threshold"`, `"Threshold"`, 1), "Threshold", decHotPool},
		{"pool dup field", pk, strings.Replace(goodPool, `}`, `,"max_keys":3}`, 1), "max_keys", decHotPool},
		{"pool name mismatch", HotPoolKey("other"), goodPool, "name", decHotPool},
		{"pool threshold type", pk, strings.Replace(goodPool, `"threshold":1000`, `"threshold":"1000"`, 1), "threshold", decHotPool},
		{"pool threshold 0", pk, strings.Replace(goodPool, `"threshold":1000`, `"threshold":0`, 1), "threshold", decHotPool},
		{"pool low above", pk, strings.Replace(goodPool, `"low_threshold":500`, `"low_threshold":5000`, 1), "low_threshold", decHotPool},
		{"pool cooldown negative", pk, strings.Replace(goodPool, `"cooldown_ms":30000`, `"cooldown_ms":-1`, 1), "cooldown_ms", decHotPool},
		{"pool cooldown 0", pk, strings.Replace(goodPool, `"cooldown_ms":30000`, `"cooldown_ms":0`, 1), "cooldown_ms", decHotPool},
		{"pool report threshold", pk, strings.Replace(goodPool, `"report_threshold":15.625`, `"report_threshold":-1`, 1), "report_threshold", decHotPool},
		{"pool max age", pk, strings.Replace(goodPool, `"report_max_age_ms":30000`, `"report_max_age_ms":1000`, 1), "report_max_age_ms", decHotPool},
		{"pool max age overflow", pk, strings.Replace(goodPool, `"report_max_age_ms":30000`, `"report_max_age_ms":9223372036854775807`, 1), "report_max_age_ms", decHotPool},
		{"pool max keys", pk, strings.Replace(goodPool, `"max_keys":1024`, `"max_keys":4096`, 1), "max_keys", decHotPool},
		{"pool max keys fraction", pk, strings.Replace(goodPool, `"max_keys":1024`, `"max_keys":1.5`, 1), "max_keys", decHotPool},
		{"pool missing threshold", pk, `{"name":"ingest"}`, "threshold", decHotPool},
		{"pool trailing", pk, goodPool + ` x`, "", decHotPool},
		{"pool null", pk, `null`, "", decHotPool},
		{"report producer mismatch", HotReportKey("ingest", "p-2"), goodReport, "producer", decHotReport},
		{"report bad producer", rk, strings.Replace(goodReport, `"p-1"`, `"p 1"`, 1), "producer", decHotReport},
		{"report at", rk, strings.Replace(goodReport, `2026-01-02T03:04:05Z`, `now`, 1), "at", decHotReport},
		{"report no at", rk, `{"producer":"p-1","keys":[]}`, "at", decHotReport},
		{"report keys type", rk, `{"producer":"p-1","at":"2026-01-02T03:04:05Z","keys":{}}`, "keys", decHotReport},
		{"report key unknown field", rk, strings.Replace(goodReport, `"rate":1`, `"rate":1,"weight":2`, 1), "keys", decHotReport},
		{"report key dup field", rk, strings.Replace(goodReport, `"rate":1`, `"rate":1,"rate":2`, 1), "keys", decHotReport},
		{"report key case", rk, strings.Replace(goodReport, `"rate":1`, `"Rate":1`, 1), "keys", decHotReport},
		{"report key not object", rk, strings.Replace(goodReport, `{"key":"a","rate":1}`, `["a",1]`, 1), "keys", decHotReport},
		{"report key rate type", rk, strings.Replace(goodReport, `"rate":1`, `"rate":"1"`, 1), "keys", decHotReport},
		{"report key empty", rk, strings.Replace(goodReport, `"key":"a"`, `"key":""`, 1), "keys", decHotReport},
		{"report negative rate", rk, strings.Replace(goodReport, `"rate":1`, `"rate":-1`, 1), "keys", decHotReport},
		{"report unsorted", rk, strings.Replace(goodReport, `{"key":"a","rate":1}`, `{"key":"b","rate":1},{"key":"a","rate":1}`, 1), "keys", decHotReport},
		{"report duplicate", rk, strings.Replace(goodReport, `{"key":"a","rate":1}`, `{"key":"a","rate":1},{"key":"a","rate":1}`, 1), "keys", decHotReport},
		{"report extra field", rk, strings.Replace(goodReport, `"producer"`, `"pool":"x","producer"`, 1), "pool", decHotReport},
		{"set version negative", ok, strings.Replace(goodSet, `"version":1`, `"version":-1`, 1), "version", decOverflow},
		{"set version 0 with keys", ok, strings.Replace(goodSet, `"version":1`, `"version":0`, 1), "version", decOverflow},
		{"set entries type", ok, `{"version":1,"entries":3}`, "entries", decOverflow},
		{"set since", ok, strings.Replace(goodSet, `"2026-01-02T03:04:05Z"`, `"then"`, 1), "entries", decOverflow},
		{"set no since", ok, `{"version":1,"entries":[{"key":"a","rate":1}]}`, "entries", decOverflow},
		{"set below_since", ok, strings.Replace(goodSet, `}]`, `,"below_since":"x"}]`, 1), "entries", decOverflow},
		{"set entry unknown field", ok, strings.Replace(goodSet, `}]`, `,"until":"x"}]`, 1), "entries", decOverflow},
		{"set unsorted", ok, `{"version":1,"entries":[{"key":"b","rate":1,"since":"2026-01-02T03:04:05Z"},{"key":"a","rate":1,"since":"2026-01-02T03:04:05Z"}]}`, "entries", decOverflow},
		{"set unknown field", ok, strings.Replace(goodSet, `"version"`, `"epoch"`, 1), "epoch", decOverflow},
		{"set array", ok, `[]`, "", decOverflow},
	}
	for _, tc := range cases {
		err := tc.dec(tc.key, []byte(tc.val))
		var ce *CorruptError
		if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
			t.Errorf("%s: got %v, want a *CorruptError", tc.name, err)
			continue
		}
		if ce.Key != tc.key || ce.Field != tc.field {
			t.Errorf("%s: error names key %q field %q, want %q %q (%v)", tc.name, ce.Key, ce.Field, tc.key, tc.field, err)
		}
	}
	// Decode dispatches on the key's kind.
	for key, val := range map[string]string{pk: goodPool, rk: goodReport, ok: goodSet} {
		kind, v, err := Decode(key, []byte(val))
		if err != nil || !kind.HotKey() || v == nil {
			t.Errorf("Decode(%q) = %v %T %v", key, kind, v, err)
		}
	}
}

func TestHotKeyKeys(t *testing.T) {
	for _, tc := range []struct {
		key      string
		kind     Kind
		pool, id string
	}{
		{HotPoolKey("ingest"), KindHotPool, "ingest", ""},
		{HotReportKey("ingest", "host-1:api"), KindHotReport, "ingest", "host-1:api"},
		{OverflowKey("ingest"), KindOverflow, "ingest", ""},
	} {
		kind, pool, id, err := ParseKey(tc.key)
		if err != nil || kind != tc.kind || pool != tc.pool || id != tc.id {
			t.Errorf("ParseKey(%q) = %v %q %q %v, want %v %q %q", tc.key, kind, pool, id, err, tc.kind, tc.pool, tc.id)
		}
		if !kind.HotKey() {
			t.Errorf("%v.HotKey() = false", kind)
		}
		if k := Key(tc.kind, tc.pool, tc.id); k != tc.key {
			t.Errorf("Key(%v, %q, %q) = %q, want %q", tc.kind, tc.pool, tc.id, k, tc.key)
		}
	}
	if HotReportKey("a", "b") != "/keyshard/v1/hotreports/a/b" || OverflowKey("a") != "/keyshard/v1/overflow/a" || HotPoolKey("a") != "/keyshard/v1/hotpools/a" {
		t.Errorf("keys: %q %q %q", HotReportKey("a", "b"), OverflowKey("a"), HotPoolKey("a"))
	}
	for _, k := range []Kind{KindKeyspace, KindMember, KindMap, KindQuarantine, KindLeader} {
		if k.HotKey() {
			t.Errorf("%v.HotKey() = true", k)
		}
	}
	for _, tc := range []struct{ key, want string }{
		{Prefix + "hotreports/ingest", "has no producer id"},
		{Prefix + "hotreports/ingest/p/q", "bad producer id"},
		{Prefix + "hotreports/in gest/p", "bad pool name"},
		{Prefix + "hotpools/a/b", "bad pool name"},
		{Prefix + "overflow/", "bad pool name"},
	} {
		_, _, _, err := ParseKey(tc.key)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseKey(%q) = %v, want ErrCorrupt mentioning %q", tc.key, err, tc.want)
		}
	}
	err := ValidateName(KindHotPool, "a b")
	if !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), `pool name "a b"`) {
		t.Errorf("ValidateName(KindHotPool) = %v", err)
	}
	err = ValidateName(KindHotReport, "")
	if !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), "producer id is empty") {
		t.Errorf("ValidateName(KindHotReport) = %v", err)
	}
}

// hotChange builds the Change Watch would deliver for a put of v at rev.
func hotChange(t *testing.T, key string, v any, rev int64) Change {
	t.Helper()
	var b []byte
	var err error
	switch v := v.(type) {
	case HotPool:
		b, err = EncodeHotPool(v)
	case hotkey.Report:
		b, err = EncodeHotReport(v)
	case hotkey.OverflowSet:
		b, err = EncodeOverflow(v)
	case string:
		b = []byte(v)
	}
	if err != nil {
		t.Fatal(err)
	}
	kind, pool, id, perr := ParseKey(key)
	if perr != nil {
		t.Fatal(perr)
	}
	c := Change{Kind: kind, Keyspace: pool, ID: id, Key: key, ModRevision: rev}
	if _, c.Value, c.Err = Decode(key, b); c.Err != nil {
		c.Value = nil
	}
	return c
}

func TestHotKeySnapshotApply(t *testing.T) {
	s := NewSnapshot(1)
	ks := testKeyspace("ingest") // a keyspace of the same name stays apart
	s.Apply(Change{Kind: KindKeyspace, Keyspace: "ingest", Key: KeyspaceKey("ingest"), Value: ks, ModRevision: 2})
	s.Apply(hotChange(t, HotPoolKey("ingest"), samplePool, 3))
	s.Apply(hotChange(t, HotReportKey("ingest", "p-1"), sampleHotR, 4))
	r2 := hotkey.Report{Producer: "p-2", At: testTime}
	s.Apply(hotChange(t, HotReportKey("ingest", "p-2"), r2, 5))
	s.Apply(hotChange(t, OverflowKey("ingest"), sampleSet, 6))
	if s.Rev != 6 {
		t.Errorf("Rev = %d, want 6", s.Rev)
	}
	p := s.Pools["ingest"]
	if p == nil || p.Name != "ingest" || p.Config.ModRevision != 3 || p.Overflow.ModRevision != 6 || len(p.Reports) != 2 || p.Reports["p-1"].ModRevision != 4 {
		t.Fatalf("pool state %+v", p)
	}
	if diff := cmp.Diff(sampleSet, p.Overflow.Value); diff != "" {
		t.Errorf("overflow (-want +got):\n%s", diff)
	}
	if st := s.Keyspaces["ingest"]; st == nil || !st.Config.Exists() || len(st.Members) != 0 || st.Map.Exists() {
		t.Fatalf("keyspace state mixed with the pool's: %+v", st)
	}

	// A corrupt overflow set is recorded and forgets the last good one.
	s.Apply(hotChange(t, OverflowKey("ingest"), `{"version":"x"}`, 7))
	if !errors.Is(s.Corrupt[OverflowKey("ingest")], ErrCorrupt) || s.Pools["ingest"].Overflow.Exists() {
		t.Fatalf("corrupt set: corrupt=%v, still %+v", s.Corrupt[OverflowKey("ingest")], s.Pools["ingest"].Overflow)
	}
	s.Apply(hotChange(t, OverflowKey("ingest"), sampleSet, 8))
	if _, bad := s.Corrupt[OverflowKey("ingest")]; bad || s.Pools["ingest"].Overflow.ModRevision != 8 {
		t.Fatal("a good value after a corrupt one was not taken")
	}
	// Deletes: the pool goes once it has no key left; the keyspace stays.
	for i, key := range []string{HotReportKey("ingest", "p-1"), HotPoolKey("ingest"), OverflowKey("ingest")} {
		s.Apply(Change{Kind: map[int]Kind{0: KindHotReport, 1: KindHotPool, 2: KindOverflow}[i], Keyspace: "ingest", ID: map[int]string{0: "p-1"}[i], Key: key, Deleted: true, ModRevision: int64(10 + i)})
	}
	if p := s.Pools["ingest"]; p == nil || len(p.Reports) != 1 || p.Config.Exists() || p.Overflow.Exists() {
		t.Fatalf("after deletes: %+v", p)
	}
	s.Apply(Change{Kind: KindHotReport, Keyspace: "ingest", ID: "p-2", Key: HotReportKey("ingest", "p-2"), Deleted: true, ModRevision: 20})
	if _, ok := s.Pools["ingest"]; ok {
		t.Fatal("an empty pool stayed in the snapshot")
	}
	if s.Keyspaces["ingest"] == nil {
		t.Fatal("deleting a pool's keys removed the keyspace of the same name")
	}
	// Deleting keys of an unknown pool is a no-op.
	s.Apply(Change{Kind: KindOverflow, Keyspace: "nope", Key: OverflowKey("nope"), Deleted: true, ModRevision: 21})
	if len(s.Pools) != 0 {
		t.Fatalf("pools %v", s.Pools)
	}
}

func TestHotKeyStore(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	pool := samplePool
	pool.Name = "hk-store"
	createKeyspace(t, s, "hk-store") // a keyspace of the same name stays apart

	// A report needs its pool.
	r := hotkey.Report{Producer: "p-1", At: testTime, Keys: []hotkey.KeyRate{{Key: "k", Rate: 5}}}
	if _, err := s.PutHotReport(ctx, pool.Name, r); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"hk-store"`) {
		t.Fatalf("report before the pool exists: %v, want ErrNotFound naming the pool", err)
	}
	if _, _, err := s.GetHotPool(ctx, pool.Name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetHotPool before create: %v", err)
	}
	if _, err := s.CreateHotPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateHotPool(ctx, pool); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	pool.Threshold, pool.LowThreshold = 2000, 1000
	rev, err := s.PutHotPool(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	got, modRev, err := s.GetHotPool(ctx, pool.Name)
	if err != nil || modRev != rev || got != pool {
		t.Fatalf("GetHotPool = %+v at %d, %v; want %+v at %d", got, modRev, err, pool, rev)
	}
	if _, err := s.PutHotPool(ctx, HotPool{Name: "hk-bad"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid pool: %v", err)
	}
	if _, err := s.PutHotPool(ctx, HotPool{Name: "hk bad"}); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("bad pool name: %v", err)
	}
	if _, err := s.PutHotReport(ctx, pool.Name, hotkey.Report{Producer: "p-1"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid report: %v", err)
	}

	snap, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	updates := s.Watch(ctx, snap.Rev+1)
	if _, err := s.PutHotReport(ctx, pool.Name, r); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, updates, &snap, "the report", func(s *Snapshot) bool {
		p := s.Pools[pool.Name]
		return p != nil && p.Reports["p-1"].Exists()
	})
	if diff := cmp.Diff(r, snap.Pools[pool.Name].Reports["p-1"].Value); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	// Keyspace reads never see the pool's keys.
	kss, _, err := s.LoadKeyspace(ctx, "hk-store")
	if err != nil || len(kss.Pools) != 0 || len(kss.Keyspaces) != 1 {
		t.Fatalf("LoadKeyspace: %+v %v", kss, err)
	}

	// The overflow set is written by the leader only, fenced and expected.
	el, f := campaign(t, s, "hk-leader")
	ps := snap.Pools[pool.Name]
	set := hotkey.OverflowSet{Version: 1, Entries: []hotkey.OverflowEntry{{Key: "k", Rate: 2500, Since: testTime}}}
	setRev, err := s.Commit(ctx, f, []Write{PutOverflow(pool.Name, set)}, []Expect{ExpectEntry(OverflowKey(pool.Name), ps.Overflow)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, f, []Write{PutOverflow(pool.Name, set)}, []Expect{ExpectEntry(OverflowKey(pool.Name), ps.Overflow)}); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale overflow write: %v, want ErrConflict", err)
	}
	waitFor(t, ctx, updates, &snap, "the set", func(s *Snapshot) bool {
		return s.Pools[pool.Name].Overflow.ModRevision == setRev
	})
	if diff := cmp.Diff(set, snap.Pools[pool.Name].Overflow.Value); diff != "" {
		t.Errorf("set (-want +got):\n%s", diff)
	}
	// A stale report is deleted, fenced, only if it has not changed.
	rep := snap.Pools[pool.Name].Reports["p-1"]
	if _, err := s.PutHotReport(ctx, pool.Name, r); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, f, []Write{Delete(HotReportKey(pool.Name, "p-1"))}, []Expect{ExpectEntry(HotReportKey(pool.Name, "p-1"), rep)}); !errors.Is(err, ErrConflict) {
		t.Fatalf("deleting a report that was just renewed: %v, want ErrConflict", err)
	}
	full, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep = full.Pools[pool.Name].Reports["p-1"]
	if _, err := s.Commit(ctx, f, []Write{Delete(HotReportKey(pool.Name, "p-1"))}, []Expect{ExpectEntry(HotReportKey(pool.Name, "p-1"), rep)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, updates, &snap, "the report's deletion", func(s *Snapshot) bool {
		return !s.Pools[pool.Name].Reports["p-1"].Exists()
	})
	// A deposed leader cannot overwrite the set.
	if err := el.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	cur := snap.Pools[pool.Name].Overflow
	if _, err := s.Commit(ctx, f, []Write{PutOverflow(pool.Name, hotkey.OverflowSet{Version: 2})}, []Expect{ExpectEntry(OverflowKey(pool.Name), cur)}); !errors.Is(err, ErrFenced) {
		t.Fatalf("deposed leader's set: %v, want ErrFenced", err)
	}
	// A corrupt report shows up in Corrupt, not in the pool.
	if _, err := s.client.Put(ctx, HotReportKey(pool.Name, "p-9"), `{"producer":"p-8","at":"2026-01-02T03:04:05Z","keys":[]}`); err != nil {
		t.Fatal(err)
	}
	full, err = s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := full.Pools[pool.Name].Reports["p-9"]; ok || !errors.Is(full.Corrupt[HotReportKey(pool.Name, "p-9")], ErrCorrupt) {
		t.Fatalf("corrupt report: %+v, %v", full.Pools[pool.Name].Reports, full.Corrupt[HotReportKey(pool.Name, "p-9")])
	}
	if st := full.Keyspaces["hk-store"]; st == nil || !st.Config.Exists() {
		t.Fatalf("keyspace of the pool's name: %+v", st)
	}
}

func FuzzDecodeHotPool(f *testing.F) {
	fuzzDecoder(f, HotPoolKey("ingest"), []string{
		must(EncodeHotPool(samplePool)), `{"name":"ingest"}`, `{}`,
	}, DecodeHotPool, EncodeHotPool)
}

func FuzzDecodeHotReport(f *testing.F) {
	fuzzDecoder(f, HotReportKey("ingest", "p-1"), []string{
		must(EncodeHotReport(sampleHotR)), `{"producer":"p-1","at":"2026-01-02T03:04:05Z","keys":null}`,
		`{"producer":"p-1","at":"2026-01-02T03:04:05Z","keys":[{"key":"a","rate":1e308}]}`,
	}, DecodeHotReport, EncodeHotReport)
}

func FuzzDecodeOverflow(f *testing.F) {
	fuzzDecoder(f, OverflowKey("ingest"), []string{
		must(EncodeOverflow(sampleSet)), `{"version":0,"entries":[]}`, `{"version":18446744073709551615}`,
	}, DecodeOverflow, EncodeOverflow)
}
