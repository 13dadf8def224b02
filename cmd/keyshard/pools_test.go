package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/keyshardtest"
)

// TestPoolsCLI drives `pools`, `pools put|delete`, `tenants` and `tenant`
// against a real server whose rounds run on a fake clock.
func TestPoolsCLI(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := keyshardtest.NewFakeClock(t0)
	srv := keyshardtest.NewServer(t, keyshardtest.Options{Clock: clk, ElectionTTL: 30 * time.Second})
	url := srv.URL()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := srv.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		t.Helper()
		out, _, err := runCLI(t, append(args, "--server", url)...)
		return out, err
	}

	out, err := run("pools", "put", "gw", "--capacity", "10", "--headroom", "1.2", "--window", "10s", "--shrink-cooldown", "1m",
		"--lookback", "5m", "--override", "vip=size:4", "--override", "small=min:2,max:3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tenant pool gw: capacity 10/s per member, headroom 1.2, size 1..-, zone-aware no",
		"shrink cooldown 1m0s", "window 10s, lookback 5m0s", "override small: min 2, max 3", "override vip: size 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("pools put: %q lacks %q", out, want)
		}
	}

	// Bad input: the flag, or the field the server names; nothing stored.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pools", "put", "x"}, `required flag(s) "capacity" not set`},
		{[]string{"pools", "put", "x", "--capacity", "-1"}, "CapacityPerMember"},
		{[]string{"pools", "put", "x", "--capacity", "10", "--min", "5", "--max", "2"}, "max_size"},
		{[]string{"pools", "put", "x", "--capacity", "10", "--override", "t=size:0"}, `"size:0" is not KEY:N`},
		{[]string{"pools", "put", "x", "--capacity", "10", "--override", "t=weight:3"}, `unknown key "weight"`},
		{[]string{"pools", "put", "x", "--capacity", "10", "--override", "t=size:2,min:1"}, "size"},
		{[]string{"pools", "delete", "gw"}, "pass --yes"},
		{[]string{"tenants", "nope"}, "keyshard pools put NAME --capacity N"},
		{[]string{"tenants", "gw", "--limit", "20000"}, "limit"},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}

	// Six members join; one reporter sends 52 requests/s for tenant a.
	tp := keyshardv1connect.NewTenantPoolServiceClient(http.DefaultClient, url)
	var sessions []string
	for i := range 6 {
		resp, err := tp.JoinPool(ctx, connect.NewRequest(&v1.JoinPoolRequest{Pool: "gw", Member: &v1.Member{Id: fmt.Sprintf("gw-%d", i)}}))
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, resp.Msg.Session)
	}
	keepAlive := func() {
		for _, s := range sessions {
			if _, err := tp.PoolKeepAlive(ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: s})); err != nil {
				t.Fatal(err)
			}
		}
	}
	keepAlive()
	// The leader sizes nobody before it has measured a whole window.
	for range 10 {
		clk.Advance(time.Second)
		if err := srv.WaitTenantPoolRound(ctx, clk.Now()); err != nil {
			t.Fatal(err)
		}
		keepAlive()
	}
	for seq := range 12 {
		clk.Advance(time.Second)
		if _, err := tp.ReportLoad(ctx, connect.NewRequest(&v1.ReportLoadRequest{Pool: "gw", Reporter: "fe", Seq: uint64(seq + 1),
			Counts: []*v1.TenantCount{{Tenant: "a", Count: 52}, {Tenant: "b", Count: 5}}})); err != nil {
			t.Fatal(err)
		}
		if err := srv.WaitTenantPoolRound(ctx, clk.Now()); err != nil {
			t.Fatal(err)
		}
		keepAlive()
	}

	out, err = run("pools")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "gw    6        2        ") {
		t.Errorf("pools:\n%s\nwant gw with 6 members and 2 tenants", out)
	}
	out, err = run("tenants", "gw")
	if err != nil {
		t.Fatal(err)
	}
	// The rate rises over the window; the size grows with it, to 6 at
	// 46.8/s, and stays at the 6 members from 52/s (→ 7) on.
	for _, want := range []string{"2 tenants (showing 2)", "a       52.0/s  6     gw-0 gw-1 gw-2 gw-3 gw-4 gw-5",
		"× headroom 1.2 / capacity 10 → 6", "b       5.0/s   1"} {
		if !strings.Contains(out, want) {
			t.Errorf("tenants:\n%s\nlacks %q", out, want)
		}
	}
	out, err = run("tenant", "gw", "newcomer")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "not measured yet: served by the stateless subset") || !strings.Contains(out, "size     1") {
		t.Errorf("tenant newcomer:\n%s", out)
	}
	out, err = run("tenant", "gw", "a")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "targets  gw-0 gw-1 gw-2 gw-3 gw-4 gw-5") || strings.Count(out, "serving") != 6 {
		t.Errorf("tenant a:\n%s", out)
	}

	if out, err = run("pools", "delete", "gw", "--yes"); err != nil || out != "deleted tenant pool gw\n" {
		t.Fatalf("delete: %q %v", out, err)
	}
	if out, err = run("pools"); err != nil || strings.Contains(out, "gw ") {
		t.Errorf("pools after delete: %q %v", out, err)
	}
}
