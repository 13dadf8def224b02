package main

import (
	"context"
	"encoding/json"
	"google.golang.org/protobuf/types/known/durationpb"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
)

func TestPositionsCLI(t *testing.T) {
	// w1 below sends one keep-alive: its session must outlive a slow wait.
	srv := keyshardtest.NewServer(t, keyshardtest.Options{Keyspaces: []client.KeyspaceConfig{{Name: "ev", Buckets: 64, Mode: client.ModeStream, LeaseTTL: time.Minute}, {Name: "rooms", Buckets: 8}}})
	url := srv.URL()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(args ...string) (string, error) {
		t.Helper()
		out, _, err := runCLI(t, append(args, "--server", url)...)
		return out, err
	}

	// Dry run, then the reset.
	out, err := run("positions", "reset", "ev", "--buckets", "1,2,10-20", "--position", "500")
	if err == nil || !strings.Contains(err.Error(), "add --yes") || out != "would reset 13 buckets (1-2,10-20) of keyspace ev to position 500; they are at 0 now\n" {
		t.Fatalf("without --yes: %q, %v", out, err)
	}
	if out, err := run("positions", "ev", "--behind", "1"); err != nil || !strings.Contains(out, "min 0  max 0  spread 0") {
		t.Fatalf("a dry run changed positions: %q, %v", out, err)
	}
	out, err = run("positions", "reset", "ev", "--buckets", "1,2,10-20", "--position", "500", "--yes")
	if err != nil || !strings.HasPrefix(out, "reset 13 buckets of keyspace ev to position 500 (revision ") {
		t.Fatalf("reset: %q, %v", out, err)
	}
	if _, err := run("positions", "reset", "ev", "--buckets", "30-31", "--position", "7", "--yes"); err != nil {
		t.Fatal(err)
	}
	out, err = run("positions", "ev", "--behind", "3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"keyspace ev: 64 buckets, epoch ",
		"min 0  max 500  spread 500",
		"buckets per position (3 distinct):",
		"  buckets 10-20 at 500\n",
		"  buckets 30-31 at 7\n",
		"  BUCKET  POSITION  BEHIND MAX  MEMBER  TOKEN\n  0       0         500         -       -\n  3       0         500         -       -\n  4 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("positions output lacks %q:\n%s", want, out)
		}
	}
	if i, j := strings.Index(out, "  0  49 █"), strings.Index(out, "500  13 █"); i < 0 || j < 0 || i > j {
		t.Errorf("histogram not largest group first:\n%s", out)
	}

	// --json is the API's answer.
	out, err = run("positions", "ev", "--json", "--behind", "2")
	if err != nil {
		t.Fatal(err)
	}
	var j struct {
		Max    string `json:"max"`
		Spread string `json:"spread"`
		Runs   []struct {
			First    uint32 `json:"first"`
			Count    uint32 `json:"count"`
			Position string `json:"position"`
		} `json:"runs"`
		Behind []struct{ Bucket uint32 } `json:"behind"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || j.Max != "500" || len(j.Runs) != 7 || len(j.Behind) != 2 || j.Runs[1].Position != "500" {
		t.Fatalf("--json: %v\n%s", err, out)
	}

	// A member holds every bucket: the view names it, a reset is refused.
	mem := keyshardv1connect.NewMemberServiceClient(http.DefaultClient, url)
	jr, err := mem.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: "ev", Member: &v1.Member{Id: "w1"}}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: jr.Msg.Session})); err != nil {
		t.Fatal(err)
	}
	// Wait for the grants themselves, not for a new map: the leader writes
	// the map first and the grants after it, at the same epoch.
	var rev uint64
	for {
		g, err := mem.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: jr.Msg.Session, SinceRevision: rev, Wait: durationpb.New(10 * time.Second)}))
		if err != nil {
			t.Fatalf("w1's grants: %v", err)
		}
		if len(g.Msg.Grants) == 64 {
			break
		}
		rev = g.Msg.Revision
	}
	adm := srv.Client().Admin()
	p, err := adm.Positions(ctx, "ev", 64)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(p.Behind, func(b client.BucketBehind) bool { return b.Member != "w1" }) {
		t.Fatalf("w1 holds every bucket, but positions name other holders: %+v", p.Behind)
	}
	out, err = run("positions", "ev", "--behind", "1")
	if err != nil || !strings.Contains(out, "  0       0         500         w1      ") {
		t.Errorf("held: %q, %v", out, err)
	}
	_, err = run("positions", "reset", "ev", "--all", "--position", "1", "--yes")
	if err == nil || !strings.Contains(err.Error(), `bucket 0 is held by member "w1"`) || !strings.Contains(err.Error(), "keyshard drain ev w1") {
		t.Errorf("reset of held buckets: %v", err)
	}

	// Bad flags.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"positions", "reset", "ev", "--position", "1"}, "name the buckets to reset: --buckets 1,2,10-20, or --all"},
		{[]string{"positions", "reset", "ev", "--all", "--buckets", "1", "--position", "1"}, "give --buckets or --all, not both"},
		{[]string{"positions", "reset", "ev", "--buckets", "1"}, "--position is required"},
		{[]string{"positions", "reset", "ev", "--buckets", "1,x", "--position", "1"}, `--buckets "1,x": "x" is not a bucket or a range of buckets (like 7 or 10-20)`},
		{[]string{"positions", "reset", "ev", "--buckets", "5-3", "--position", "1"}, `range "5-3" ends before it starts`},
		{[]string{"positions", "reset", "ev", "--buckets", "1-3,2", "--position", "1"}, "bucket 2 is listed twice"},
		{[]string{"positions", "reset", "ev", "--buckets", "70", "--position", "1", "--yes"}, "buckets[0]: bucket 70 is outside the keyspace's range [0, 64)"},
		{[]string{"positions", "reset", "ev", "--all", "--position", "-1"}, `invalid argument "-1" for "--position"`},
		{[]string{"positions", "ev", "--behind", "0"}, "--behind 0: want 1 to 1000"},
		{[]string{"positions", "rooms"}, `keyspace: "rooms" is in exclusive mode`},
		{[]string{"positions", "nope"}, `keyspace "nope" does not exist`},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestParseBuckets(t *testing.T) {
	got, err := parseBuckets("3, 0,10-12,7-7")
	if want := []int{3, 0, 10, 11, 12, 7}; err != nil || !slices.Equal(got, want) {
		t.Errorf("parse: %v, %v; want %v", got, err, want)
	}
	if s := formatBuckets(got); s != "0,3,7,10-12" {
		t.Errorf("format: %q", s)
	}
	for _, bad := range []string{"", "1,", "-1", "1-", "a-b", "3-1", "65536", "1,1"} {
		if _, err := parseBuckets(bad); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}
